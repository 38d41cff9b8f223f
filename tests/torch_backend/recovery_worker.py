"""A PyTorch script that recovers in place (ddp_torch.init_process_group(recover_in_place=True)),
run by recovery_driver.py under real ddprun agents, one worker per node.

    recovery_worker.py DIR in_place   opts in; after each (re)formation every rank
                                      agrees on a phase (the highest number any rank read
                                      in DIR/phase, which the driver writes before each
                                      change it makes) and loops in it until a GroupChanged:
                                        phase 0  DDP steps: GroupChanged from loss.backward()
                                        phase 1  DDP's forward, dist.all_reduce, backward:
                                                 from the all_reduce (the reducer then
                                                 waits for hooks that never came)
                                        phase 2+ all_reduce(async_op=True) + work.wait() of
                                                 a flag: from work.wait(); once every
                                                 rank saw DIR/stop, exits 0
                                      reform() is called again when it raises GroupChanged.
    recovery_worker.py DIR restart    no opt-in: all_reduce until DIR/stop

What it checks, on every rank (an AssertionError ends it with exit 1):
after each formation, two DDP steps on a fresh wrap give every rank the
average gradient of the world (the reducers of earlier wraps, kept alive
here, do not interfere); after reform(), its result, dist.get_rank(),
dist.get_world_size() and os.environ agree, MASTER_PORT changed, and the
previous round's new_group, default group and DDP raise a RuntimeError naming
the round GroupChanged named. Lines it prints, for the driver:
"started pid=P", "formed rank=R world=W phase=F", "changed at SITE: MESSAGE",
"reform interrupted: MESSAGE", "reformed rank=R world=W round=N", "stale ok", "done rank=R".
"""
import os
import re
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_torch

DIR = Path(sys.argv[1])
SITES = ("backward", "all_reduce", "wait")


def say(text):
    print(f"[pid {os.getpid()}] {text}", flush=True)


def stopped():
    return (DIR / "stop").exists()


def check_gradients(net, models):
    """Two DDP steps on a fresh wrap: every rank ends with the world's average gradient."""
    model = DDP(net)
    models.append(model)  # kept alive: its reducer must not act after the next reform()
    world = dist.get_world_size()
    x = torch.full((4, 8), float(dist.get_rank() + 1))
    for _ in range(2):
        net.zero_grad()
        model(x).sum().backward()
        expected = 4 * (world + 1) / 2  # 4 rows, each rank's inputs rank + 1, averaged
        assert torch.allclose(net.weight.grad, torch.full_like(net.weight.grad, expected)), \
            (net.weight.grad, expected)
    return model


def run_phase(phase, model, net):
    """Loops in `phase`, yielding the site of the next collective, until every
    rank saw DIR/stop; a GroupChanged propagates to the caller."""
    x = torch.ones(4, 8)
    t = torch.ones(16)
    opt = torch.optim.SGD(net.parameters(), lr=0.001)
    while True:
        if phase == 0:
            loss = model(x).sum()
            yield "backward"
            loss.backward()
            opt.step()
        elif phase == 1:
            loss = model(x).sum()  # its reducer now expects the backward's hooks
            yield "all_reduce"
            dist.all_reduce(t)
            loss.backward()
        else:
            flag = torch.tensor([int(stopped())])
            work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
            yield "wait"
            work.wait()
            if int(flag):
                return
        time.sleep(0.02)


def check_stale(what, call, round_name):
    try:
        call()
    except ddp_torch.GroupChanged as e:
        raise AssertionError(f"{what}: GroupChanged after reform(), expected a stale-group error: {e}")
    except RuntimeError as e:
        assert round_name in str(e), f"{what}: the error does not name {round_name!r}: {e}"
        return
    raise AssertionError(f"{what}: no error after reform()")


def check_reformed(reformed, port_before):
    rank, world = reformed
    assert (rank, world) == (reformed.rank, reformed.world_size), reformed
    assert dist.get_rank() == rank and dist.get_world_size() == world, \
        (dist.get_rank(), dist.get_world_size(), reformed)
    env = os.environ
    assert int(env["RANK"]) == rank and int(env["WORLD_SIZE"]) == world, (env["RANK"], reformed)
    assert env["LOCAL_RANK"] == "0" and env["LOCAL_WORLD_SIZE"] == "1", env["LOCAL_RANK"]
    assert int(env["GROUP_RANK"]) == reformed.group_rank, (env["GROUP_RANK"], reformed)
    assert int(env["GROUP_WORLD_SIZE"]) == reformed.group_world_size == world, reformed
    assert env["MASTER_PORT"] != port_before, "MASTER_PORT is the ended round's"
    assert reformed.why, reformed
    assert reformed.round >= 0 and reformed.seconds > 0, reformed


def in_place():
    ddp_torch.init_process_group(recover_in_place=True, timeout=timedelta(seconds=60))
    assert ddp_torch.recovers_in_place()
    say(f"started pid={os.getpid()}")
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 1)
    models, stale = [], None
    while True:
        site = None
        try:
            model = check_gradients(net, models)
            sub = dist.new_group()
            # torch numbers its groups from 0 in every formation (its store barrier's key
            # and the ddp groups' names come from it), also after a reform() that failed
            names = dist.distributed_c10d._pg_names
            assert (names[dist.group.WORLD], names[sub]) == ("0", "1"), names
            agreed = torch.tensor([int((DIR / "phase").read_text())])
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
            phase = int(agreed)
            say(f"formed rank={dist.get_rank()} world={dist.get_world_size()} phase={phase}")
            if stale is not None:
                old_sub, old_default, old_model, round_name = stale
                check_stale("the previous new_group", lambda: dist.all_reduce(torch.ones(2), group=old_sub),
                            round_name)
                check_stale("the previous default group",
                            lambda: dist.all_reduce(torch.ones(2), group=old_default), round_name)
                check_stale("the previous DDP", lambda: old_model(torch.ones(1, 8)), round_name)
                say("stale ok")
                stale = None
            for site in run_phase(phase, model, net):
                pass
            say(f"done rank={dist.get_rank()}")
            return
        except ddp_torch.GroupChanged as e:
            assert isinstance(e, RuntimeError)
            assert site in SITES, f"GroupChanged outside a phase's collective: {e}"
            say(f"changed at {site}: {e}")
            ended = re.match(r"(round \d+|the round this worker started in) ended: ", str(e))
            assert ended, f"GroupChanged does not name the round that ended: {e}"
            stale = (sub, dist.group.WORLD, model, ended.group(1))
            port_before = os.environ["MASTER_PORT"]
            while True:
                try:
                    reformed = ddp_torch.reform()
                    break
                except ddp_torch.GroupChanged as again:  # the next round ended too: once more
                    say(f"reform interrupted: {again} (MASTER_PORT={os.environ['MASTER_PORT']})")
            check_reformed(reformed, port_before)
            say(f"reformed rank={reformed.rank} world={reformed.world_size} round={reformed.round} "
                f"in {reformed.seconds:.3f} s (MASTER_PORT={os.environ['MASTER_PORT']})")


def restart():
    ddp_torch.init_process_group()  # no opt-in: the agent restarts this worker
    assert not ddp_torch.recovers_in_place()
    say(f"started pid={os.getpid()}")
    say(f"formed rank={dist.get_rank()} world={dist.get_world_size()}")
    t = torch.ones(4)
    while not stopped():
        dist.all_reduce(t)
        time.sleep(0.05)
    say(f"done rank={dist.get_rank()}")


if __name__ == "__main__":
    {"in_place": in_place, "restart": restart}[sys.argv[2]]()
    sys.stdout.flush()
    os._exit(0)  # torch 1.13 may deadlock in ~ProcessGroupGloo at exit
