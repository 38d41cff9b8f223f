"""In-place recovery for PyTorch scripts on the backend "ddp" under ddprun.

    ddp_torch.init_process_group(recover_in_place=True)
    model = DDP(net)
    while training:
        try:
            train_one_step(model)
        except ddp_torch.GroupChanged:          # the round ended under this step
            rank, world = ddp_torch.reform()    # the next round; torch's default group re-made
            model = DDP(net)                    # re-wrap on the new group

With the opt-in, the worker says so on its agent's control channel
(ddp::in_place, ddp/worker/recovery.h): when the round ends (a node lost or
joined, a worker elsewhere restarted) the agent keeps this process and tells
it instead of stopping it. Every "ddp" group of the round is then aborted:
whatever waits in a collective, and every later collective, raises
GroupChanged. reform() waits for the agent's next round, makes torch's
default group again (env://, the round's MASTER_ADDR/MASTER_PORT) and tells
the agent. Without the opt-in, or outside ddprun, nothing changes: the
exception never comes and ddprun restarts the worker.

Where the exception comes from: torch's Work.wait() and the synchronous
collectives raise it directly (the C++ exception, translated by pybind11);
torch's autograd engine turns an exception in a hook into a plain
RuntimeError, so this module wraps torch.autograd.backward and
torch.autograd.grad (Tensor.backward calls the first), and
DistributedDataParallel's constructor and forward: a RuntimeError raised
there once the round ended becomes GroupChanged, chaining the original.

Not thread-safe: the training thread calls init_process_group and reform()
while no other thread issues collectives.
"""

import functools
import os
import socket
import time
import weakref
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as _c10d
from torch.nn.parallel import DistributedDataParallel

from ddp_torch import _C

GroupChanged = _C.GroupChanged
GroupChanged.__module__ = "ddp_torch"

# torch's default for init_process_group (torch.distributed.constants.default_pg_timeout).
_DEFAULT_TIMEOUT = timedelta(minutes=30)


class _Opt:
    """What init_process_group was given: reform() makes the default group the same way."""

    in_place = False  # recover_in_place, and the agent's channel is open
    asked = False  # recover_in_place was given
    backend = "ddp"
    timeout = _DEFAULT_TIMEOUT
    kwargs: dict = {}


# DistributedDataParallel instances made while recovering in place, and the
# generation of the round each was made in.
_wrapped = weakref.WeakKeyDictionary()


class _Facts(NamedTuple):
    round: int
    rank: int
    world_size: int
    previous_rank: int
    previous_world_size: int
    group_rank: int
    group_world_size: int
    restart_count: int
    why: str
    seconds: float


class Reformed(tuple):
    """reform()'s result: a (rank, world_size) tuple that also carries the
    round's facts as attributes: round, rank, world_size, previous_rank,
    previous_world_size, group_rank, group_world_size, restart_count, why (why
    the previous round ended, in the agent's words), seconds (reform()'s wall
    time)."""

    def __new__(cls, facts: _Facts):
        self = super().__new__(cls, (facts.rank, facts.world_size))
        self._facts = facts
        return self

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._facts, name)

    def __repr__(self):
        return f"Reformed({', '.join(f'{k}={v!r}' for k, v in self._facts._asdict().items())})"


def recovers_in_place() -> bool:
    """Whether this worker recovers in place: init_process_group(recover_in_place=True)
    under an agent that offers a control channel (ddprun)."""
    return _Opt.in_place and _C.recovers_in_place()


def init_process_group(backend="ddp", *, recover_in_place=False, timeout=None, **kwargs):
    """torch.distributed.init_process_group, with in-place recovery when asked.

    With recover_in_place under ddprun: opens the agent's control channel and
    says hello (this worker is kept through a change of membership), then
    makes torch's default group from ddprun's environment (what env:// reads;
    see _round_store for how its store is made). The backend
    must be "ddp" and the group must meet through env:// (no init_method other
    than "env://", no store, rank or world_size: reform() makes it again from
    the next round's environment). Outside ddprun, or without the opt-in:
    torch's init_process_group with the same arguments. A round that ends
    while this worker joins it: the worker joins the next one (as reform()).
    """
    timeout = _DEFAULT_TIMEOUT if timeout is None else timeout
    _Opt.asked = bool(recover_in_place)
    if recover_in_place:
        if backend != "ddp":
            raise ValueError(f"ddp_torch.init_process_group: recover_in_place needs backend "
                             f"'ddp', got {backend!r}")
        given = sorted(k for k in ("store", "rank", "world_size") if kwargs.get(k) not in (None, -1))
        if kwargs.get("init_method") not in (None, "env://"):
            given.append("init_method")
        if given:
            raise ValueError(f"ddp_torch.init_process_group: recover_in_place makes the group from "
                             f"ddprun's environment (env://): do not pass {', '.join(given)}")
        _Opt.in_place = _C.open_control_channel()
    if not _Opt.in_place:
        return dist.init_process_group(backend, timeout=timeout, **kwargs)
    _Opt.backend, _Opt.timeout = backend, timeout
    _Opt.kwargs = {k: v for k, v in kwargs.items() if k not in ("init_method", "store", "rank", "world_size")}
    try:
        _make_default_group()
        return
    except Exception:  # noqa: BLE001  (re-raised unless the round ended)
        if not _round_ended(wait=True):
            raise
    while True:  # the round ended while this worker joined it: join the next one
        try:
            _join(time.monotonic(), os.environ.get("RANK"), os.environ.get("WORLD_SIZE"))
            return
        except GroupChanged:
            pass


def reform() -> Reformed:
    """Joins the agent's next round, after GroupChanged.

    Waits for the round (at most init_process_group's timeout); destroys
    torch's groups (every group made before, new_group's and the default one,
    and every DistributedDataParallel over them, is invalid from now on and
    says so when used: a RuntimeError naming its round); sets os.environ's
    RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
    TORCHELASTIC_RESTART_COUNT, DDP_STORE_* and friends from the round; makes
    torch's default group again (backend "ddp", meeting at the round's
    MASTER_ADDR:MASTER_PORT as env:// does, the same timeout) and tells the
    agent. Returns Reformed: (rank, world_size) plus the round's
    facts. Collective with the round's other workers (survivors here,
    newcomers in init_process_group).

    Raises GroupChanged when yet another change came meanwhile (call it
    again); RuntimeError when this worker does not recover in place (no
    recover_in_place, or no ddprun agent) or the agent went away or named no
    round within the timeout.
    """
    if not recovers_in_place():
        if not _Opt.asked:
            raise RuntimeError("ddp_torch.reform(): this worker does not recover in place: call "
                               "ddp_torch.init_process_group(recover_in_place=True) first")
        raise RuntimeError("ddp_torch.reform(): this worker does not recover in place: its launcher "
                           "offers no control channel (run it under ddprun; torchrun restarts "
                           "workers instead)")
    started = time.monotonic()
    previous = (os.environ.get("RANK"), os.environ.get("WORLD_SIZE"))
    return _join(started, *previous)


def _join(started, previous_rank, previous_world):
    """Destroys the ended round's groups, waits for the next round and joins it."""
    why = _C.current_round()[3]
    _retire_groups()
    facts = _C.wait_next_round(_Opt.timeout)
    named = time.monotonic()
    os.environ.update(dict(facts["environment"]))
    try:
        _make_default_group()
    except Exception as error:  # noqa: BLE001  (re-raised unless the round ended)
        if not _round_ended(wait=True):
            raise
        raise GroupChanged(f"round {facts['round']} ended while this worker joined it "
                           f"({_C.current_round()[3]}): {error}") from error
    built = time.monotonic()
    _C.report_reformed(facts["round"], facts["rank"], named - started, built - named)
    return Reformed(_Facts(
        round=facts["round"], rank=facts["rank"], world_size=facts["world_size"],
        previous_rank=int(previous_rank) if previous_rank is not None else -1,
        previous_world_size=int(previous_world) if previous_world is not None else -1,
        group_rank=facts["group_rank"], group_world_size=facts["group_world_size"],
        restart_count=facts["restart_count"], why=why, seconds=built - started))


def _make_default_group():
    """torch's default group from the round's environment (what env:// reads)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(_Opt.backend, store=_round_store(rank, world), rank=rank, world_size=world,
                            timeout=_Opt.timeout, **_Opt.kwargs)


def _round_store(rank, world):
    """The store torch's env:// rendezvous makes (a TCPStore on MASTER_ADDR:MASTER_PORT
    hosted by rank 0, under the prefix "default_pg"), made so that the round's end stops
    every wait in it: rank 0 does not wait in the constructor for the others to connect
    (torch's does, until its timeout, when a peer dies first); the others connect once
    it listens, and give up with GroupChanged when the round ends before it does. The
    group made over it waits for the peers, and stops when the round ends."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank != 0:
        _wait_until_listening(host, port)
    store = dist.TCPStore(host, port, world, rank == 0, _Opt.timeout, wait_for_workers=False)
    return dist.PrefixStore("default_pg", store)


def _wait_until_listening(host, port):
    deadline = time.monotonic() + _Opt.timeout.total_seconds()
    while True:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError as error:
            if _round_ended():
                raise GroupChanged(f"the round ended before rank 0 hosted its store at {host}:{port} "
                                   f"({_C.current_round()[3]})") from error
            if time.monotonic() > deadline:
                raise TimeoutError(f"ddp_torch: rank 0's store at {host}:{port} did not listen within "
                                   f"{_Opt.timeout}") from error
        time.sleep(0.05)


def _round_ended(wait=False) -> bool:
    """Whether the current round ended; with `wait`, after waiting up to the round's
    grace for the agent's word (a peer that died breaks its connections before the
    agents' verdict), as a failed collective does."""
    if not _Opt.in_place:
        return False
    return _C.current_round()[2] or (wait and _C.round_ends_within_grace())


def _retire_groups():
    """Drops torch's groups and the reducers of the DistributedDataParallel
    instances over them: a Reducer left alive would keep its autograd hooks
    on the parameters that the next DistributedDataParallel hooks too."""
    for ddp in list(_wrapped.keys()):
        ddp.reducer = None
        ddp.logger = None
    if dist.is_initialized():
        dist.destroy_process_group()
    else:
        # A default group whose making failed (the round ended meanwhile) still
        # counted in torch's group numbering, which names the next groups and
        # keys init_process_group's store barrier: every worker of the next
        # round must start from 0, as destroy_process_group leaves it.
        _c10d._group_count = 0


def _as_group_changed(error: RuntimeError):
    """GroupChanged for `error` when the round ended (it is then why it failed), else None."""
    generation, _, ended, why = _C.current_round()
    if not (_Opt.in_place and ended) or isinstance(error, GroupChanged):
        return None
    return GroupChanged(f"{_C.round_name(generation)} ended: {why}")


def _converting(function):
    """`function`, with a RuntimeError raised once the round ended re-raised as GroupChanged."""

    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except RuntimeError as error:
            changed = _as_group_changed(error)
            if changed is None:
                raise
            raise changed from error

    call._ddp_torch_recovery = True
    return call


def _stale_message(ddp) -> str:
    return (f"this DistributedDataParallel was made on the groups of "
            f"{_C.round_name(_wrapped[ddp])}, which ended: wrap the module again after "
            f"ddp_torch.reform()")


def _install():
    """Wraps torch's entry points once per process (see the module's docstring)."""
    if getattr(torch.autograd.backward, "_ddp_torch_recovery", False):
        return
    torch.autograd.backward = _converting(torch.autograd.backward)
    torch.autograd.grad = _converting(torch.autograd.grad)
    original_init = DistributedDataParallel.__init__
    original_forward = DistributedDataParallel.forward

    @functools.wraps(original_init)
    def init(self, *args, **kwargs):
        _converting(original_init)(self, *args, **kwargs)
        if recovers_in_place():
            _wrapped[self] = _C.current_round()[0]

    @functools.wraps(original_forward)
    def forward(self, *inputs, **kwargs):
        if self in _wrapped and _wrapped[self] != _C.current_round()[0]:
            raise RuntimeError(_stale_message(self))
        return _converting(original_forward)(self, *inputs, **kwargs)

    DistributedDataParallel.__init__ = init
    DistributedDataParallel.forward = forward
