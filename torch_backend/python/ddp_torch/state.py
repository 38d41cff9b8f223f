"""sync_state: every rank ends with the model, optimizer and counters of one rank.

    counters = ddp_torch.sync_state(net, opt, {"step": 0, "epoch": 0, "position": 0})

A collective of torch's default group (or `group`, a group of backend "ddp"):
every rank calls it at the same point, with the same kind of model and
optimizer. Afterwards every rank holds, bit for bit, the root's parameters,
buffers, optimizer state and integer counters. The root is the lowest rank
whose state is live in its process (a sync_state succeeded there before: a
survivor of a re-form), else rank 0 (a fresh start). How it goes:

1. The ranks exchange what they hold (pickled, through one all-reduce of the
   group's CPU ddp group, _C.exchange_layouts):
   their liveness, the module's parameters and buffers (names, shapes, dtypes,
   device types), the optimizer's type and param_groups (which parameters, the
   hyperparameters' names), the optimizer state's layout and the counters'
   names.
2. When a rank's model, optimizer or counter names differ from the root's,
   every rank raises RuntimeError naming the ranks and each one's first
   difference; nothing has changed anywhere.
3. A receiving rank adopts the root's param_groups hyperparameters (lr,
   momentum, betas, ...) and the root's optimizer state layout: state the root
   has and it lacks (SGD's momentum_buffer, Adam's exp_avg, exp_avg_sq and its
   `step` tensor, created lazily by the first step) is allocated, state the
   root lacks is dropped, non-tensor entries are copied.
4. The tensors and counters move from the root through ddp::ReplicaState's
   transfer (ReplicaState::sync_agreed: all-reduces of integer words in which
   the others add zeros; ddp_torch._C.sync_replica_state) on the group's CPU
   ddp group, without the GIL. The agent is told `synced`, and a receiving rank logs one line on
   stderr, e.g. "ddp_torch: received the state of rank 0 (live) in round 3:
   1.2 MiB in 0.004 s".

Errors: RuntimeError for differing registrations, a group not of backend
"ddp", counters that are not ints, no initialized process group; what the
collectives raise. Once the round ended (under ddprun, with recover_in_place),
any of these is ddp_torch.GroupChanged, as from torch's own calls (recovery.py's
conversion): reform() and call sync_state again.
"""

import collections
import pickle
import sys

import torch
import torch.distributed as dist

from ddp_torch import _C, recovery

SyncInfo = collections.namedtuple("SyncInfo", "root received from_live bytes seconds round")
SyncInfo.__doc__ = """The facts of this process's last sync_state (see last_sync()).

root: the rank (of the group synced) whose state every rank now holds; received: this rank's state
was overwritten with the root's; from_live: the root's state was live (a
survivor's), not a fresh start's; bytes: the state's size; seconds: the wall
time of the transfer (ReplicaState::sync_agreed); round: the agent's round it synced in,
-1 when no agent named one (started in its round, or outside ddprun)."""

_last_sync = None


def last_sync():
    """The SyncInfo of this process's last successful sync_state, or None."""
    return _last_sync


def _describe_tensor(t):
    return (tuple(t.shape), str(t.dtype).replace("torch.", ""), t.device.type)


def _module_entries(module):
    """(kind, name, shape, dtype, device type) of every parameter and buffer, in module order."""
    entries = [("parameter", n, *_describe_tensor(p)) for n, p in module.named_parameters()]
    entries += [("buffer", n, *_describe_tensor(b)) for n, b in module.named_buffers()]
    return entries


def _param_names(module):
    return {id(p): n for n, p in module.named_parameters()}


def _group_params(names, g, group):
    """(name in the module, parameter) of param group g's parameters."""
    return [(names.get(id(p), f"param_groups[{g}][{i}]"), p) for i, p in enumerate(group["params"])]


def _optimizer_params(module, optimizer):
    """Every parameter of the optimizer, in param_groups order, with its name in `module`."""
    names = _param_names(module)
    return [pair for g, group in enumerate(optimizer.param_groups) for pair in _group_params(names, g, group)]


def _state_layout(value):
    if torch.is_tensor(value):
        return ("tensor", *_describe_tensor(value))
    return ("value", value)


def _optimizer_description(module, optimizer):
    """(type, param groups' layout), hyperparameters, state layout: None for all without optimizer."""
    if optimizer is None:
        return None, None, None
    kind = f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
    names = _param_names(module)
    groups = [([(n, *_describe_tensor(p)) for n, p in _group_params(names, g, group)],
               sorted(k for k in group if k != "params"))
              for g, group in enumerate(optimizer.param_groups)]
    hyper = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    state = []
    for _, p in _optimizer_params(module, optimizer):
        entries = optimizer.state.get(p)
        state.append(None if not entries else {k: _state_layout(v) for k, v in entries.items()})
    return (kind, groups), hyper, state


def _describe(live, module, optimizer, counters):
    layout, hyper, state = _optimizer_description(module, optimizer)
    return {
        "live": live,
        "module": _module_entries(module),
        "optimizer": layout,
        "counters": sorted(counters),
        "hyper": hyper,
        "state": state,
    }


def _first_list_difference(what, mine, ref, rank, root, show):
    for k, (a, b) in enumerate(zip(mine, ref)):
        if a != b:
            return f"{what} {k} is {show(a)} on rank {rank} but {show(b)} on rank {root}"
    if len(mine) != len(ref):
        return (f"rank {rank} has {len(mine)} {what}s, rank {root} {len(ref)}"
                f" (first unmatched: {show((mine if len(mine) > len(ref) else ref)[min(len(mine), len(ref))])})")
    return None


def _show_entry(e):
    kind, name, shape, dtype, device = e
    return f"{kind} '{name}' ({'x'.join(map(str, shape)) or 'scalar'}, {dtype}, {device})"


def _first_difference(mine, ref, rank, root):
    """How rank `rank`'s registrations first differ from the root's, or None."""
    diff = _first_list_difference("module entry", mine["module"], ref["module"], rank, root, _show_entry)
    if diff:
        return diff
    a, b = mine["optimizer"], ref["optimizer"]
    if (a is None) != (b is None):
        has, lacks = (rank, root) if a is not None else (root, rank)
        return f"rank {has} passed an optimizer, rank {lacks} none"
    if a is not None:
        if a[0] != b[0]:
            return f"the optimizer is {a[0]} on rank {rank} but {b[0]} on rank {root}"
        diff = _first_list_difference("param group", [len(g[0]) for g in a[1]], [len(g[0]) for g in b[1]],
                                      rank, root, lambda n: f"one of {n} parameters")
        if diff:
            return diff
        for g, (ga, gb) in enumerate(zip(a[1], b[1])):
            diff = _first_list_difference(f"param_groups[{g}] parameter", ga[0], gb[0], rank, root,
                                          lambda p: _show_entry(("parameter", *p)))
            if diff:
                return diff
            if ga[1] != gb[1]:
                return (f"param_groups[{g}] has the options {ga[1]} on rank {rank} but {gb[1]} on rank {root}")
    if mine["counters"] != ref["counters"]:
        return f"the counters are {mine['counters']} on rank {rank} but {ref['counters']} on rank {root}"
    return None


def _check_same(descriptions, root):
    ref = descriptions[root]
    found = []
    for rank, d in enumerate(descriptions):
        diff = _first_difference(d, ref, rank, root)
        if diff:
            found.append((rank, diff))
    if found:
        whose = "the lowest live rank" if ref["live"] else "the fresh start's rank 0"
        raise RuntimeError(
            f"ddp_torch.sync_state: rank(s) {', '.join(str(r) for r, _ in found)} hold a model, optimizer "
            f"or counters that differ from rank {root}'s ({whose}); nothing was changed: "
            + "; ".join(d for _, d in found))


def _adopt_optimizer_layout(module, optimizer, ref):
    """Makes this rank's hyperparameters and optimizer state layout the root's (tensors allocated
    and zeroed, so that their pages are touched now and not inside the transfer, which overwrites
    them: a fresh page's first touch costs about 60 us on this project's VM, 8-10 ms for the
    example's 2 MiB of momentum)."""
    for group, values in zip(optimizer.param_groups, ref["hyper"]):
        for key, value in values.items():
            group[key] = value
    for (_, p), layout in zip(_optimizer_params(module, optimizer), ref["state"]):
        if layout is None:
            optimizer.state.pop(p, None)
            continue
        state = optimizer.state[p]
        for key in [k for k in state if k not in layout]:
            del state[key]
        for key, entry in layout.items():
            if entry[0] == "value":
                state[key] = entry[1]
                continue
            shape, dtype, device = entry[1], getattr(torch, entry[2]), entry[3]
            have = state.get(key)
            if torch.is_tensor(have) and _describe_tensor(have) == (shape, entry[2], device):
                continue
            where = p.device if p.device.type == device else torch.device(device)
            state[key] = torch.zeros(shape, dtype=dtype, device=where)


def _tensors(module, optimizer):
    """The names and tensors to transfer, in the same order on every rank."""
    names, tensors = [], []
    for name, p in module.named_parameters():
        names.append(f"module.{name}")
        tensors.append(p.detach())
    for name, b in module.named_buffers():
        names.append(f"module.buffer.{name}")
        tensors.append(b)
    if optimizer is not None:
        for k, (name, p) in enumerate(_optimizer_params(module, optimizer)):
            for key, value in sorted(optimizer.state.get(p, {}).items()):
                if torch.is_tensor(value):
                    names.append(f"optimizer.{k}.{name}.{key}")
                    tensors.append(value.detach())
    return names, tensors


def _counter_values(counters):
    values = []
    for name in sorted(counters):
        value = counters[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise RuntimeError(f"ddp_torch.sync_state: counter '{name}' is {value!r}, not an int")
        values.append(value)
    return values


@recovery._converting  # a RuntimeError once the round ended is GroupChanged, as torch's calls'
def sync_state(module, optimizer=None, counters=None, group=None):
    """Gives every rank the root's parameters, buffers, optimizer state and counters; returns a new
    dict of the counters (ints). See the module's docstring."""
    global _last_sync
    if not dist.is_initialized():
        raise RuntimeError("ddp_torch.sync_state: call init_process_group first")
    counters = dict(counters or {})
    values = _counter_values(counters)
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    mine = _describe(_C.replica_state_live(), module, optimizer, counters)
    descriptions = [pickle.loads(d) for d in _C.exchange_layouts(pg, pickle.dumps(mine))]
    root = next((r for r, d in enumerate(descriptions) if d["live"]), 0)
    _check_same(descriptions, root)
    rank = dist.get_rank(group)
    if optimizer is not None and rank != root:
        _adopt_optimizer_layout(module, optimizer, descriptions[root])
    names, tensors = _tensors(module, optimizer)
    counter_names = sorted(counters)
    result = _C.sync_replica_state(pg, root, descriptions[root]["live"], names, tensors, counter_names, values)
    _last_sync = SyncInfo(result["root"], result["received"], result["from_live"], result["bytes"],
                          result["seconds"], result["round"])
    if _last_sync.received:
        _log_received(_last_sync)
    synced = dict(zip(counter_names, result["counters"]))
    return {name: synced[name] for name in counters}


def _log_received(info):
    where = f" in round {info.round}" if info.round >= 0 else ""
    print(f"ddp_torch: received the state of rank {info.root} ({'live' if info.from_live else 'fresh start'})"
          f"{where}: {info.bytes / 2**20:.2f} MiB in {info.seconds:.3f} s", file=sys.stderr, flush=True)


__all__ = ["sync_state", "last_sync", "SyncInfo"]
