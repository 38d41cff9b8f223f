"""Mistakes on the backend "ddp" are errors, not hangs. Run by driver.py, which
starts the ranks itself (env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).

    errors.py mismatch   2 ranks that disagree on a collective's size, dtype, op,
                         root and kind: a RuntimeError on every rank, naming both
                         sides, within seconds (timeout 60 s); the group stays usable
    errors.py timeout    rank 1 never joins rank 0's all_reduce: rank 0 fails after
                         init_process_group's 3 s timeout, not before, naming it
    errors.py dead       rank 1 dies: rank 0's next all_reduce fails naming rank 1,
                         long before the 60 s timeout

Each rank prints "rank <r>: ok ..." and exits 0, or raises (exit 1).
"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import ddp_torch  # noqa: F401  (registers "ddp")
import rank_main


def expect_error(what, call, *needles, within=10.0):
    start = time.monotonic()
    try:
        call()
    except RuntimeError as e:
        elapsed = time.monotonic() - start
        text = str(e)
        missing = [n for n in needles if n.lower() not in text.lower()]
        if missing:
            raise AssertionError(f"{what}: the error does not name {missing}: {text}")
        if elapsed > within:
            raise AssertionError(f"{what}: the error came after {elapsed:.1f} s (> {within} s)")
        return elapsed, text
    raise AssertionError(f"{what}: no error")


def mismatch(rank):
    dist.init_process_group("ddp", timeout=timedelta(seconds=60))
    cases = [
        ("size", lambda: dist.all_reduce(torch.ones(4 + rank)), ("4", "5")),
        ("dtype", lambda: dist.all_reduce(torch.ones(4, dtype=(torch.float32, torch.int32)[rank])),
         ("float32", "int32")),
        ("op", lambda: dist.all_reduce(torch.ones(4), op=(dist.ReduceOp.SUM, dist.ReduceOp.MAX)[rank]),
         ("sum", "max")),
        ("root", lambda: dist.broadcast(torch.ones(4), src=rank), ("root=0", "root=1")),
        ("kind", lambda: (dist.all_reduce(torch.ones(4)) if rank == 0 else dist.broadcast(torch.ones(4), 0)),
         ("allreduce", "broadcast")),
    ]
    for what, call, needles in cases:
        elapsed, text = expect_error(f"ranks disagreeing on {what}", call, "ranks [0]", "ranks [1]", *needles)
        print(f"rank {rank}: {what}: {elapsed:.2f} s: {text}", flush=True)
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)  # still usable
    assert t.tolist() == [3.0, 3.0, 3.0], t
    print(f"rank {rank}: ok", flush=True)


def timeout(rank):
    dist.init_process_group("ddp", timeout=timedelta(seconds=3))
    dist.barrier()
    if rank == 1:
        time.sleep(7)  # never joins; rank 0 gives up at 3 s
        print(f"rank {rank}: ok", flush=True)
        return
    elapsed, text = expect_error("a missing rank", lambda: dist.all_reduce(torch.ones(4)),
                                 "timed out after 3000 ms", "did not arrive: [1]", within=6.5)
    if elapsed < 2.5:
        raise AssertionError(f"the timeout of 3 s was not honoured: failed after {elapsed:.2f} s")
    print(f"rank {rank}: {elapsed:.2f} s: {text}", flush=True)
    print(f"rank {rank}: ok", flush=True)


def dead(rank):
    dist.init_process_group("ddp", timeout=timedelta(seconds=60))
    dist.barrier()
    if rank == 1:
        os._exit(0)  # dies without a word: rank 0 must not wait 60 s
    time.sleep(0.3)
    elapsed, text = expect_error("a dead peer", lambda: dist.all_reduce(torch.ones(1 << 16)),
                                 "did not arrive: [1]", within=15)
    print(f"rank {rank}: {elapsed:.2f} s: {text}", flush=True)
    print(f"rank {rank}: ok", flush=True)


if __name__ == "__main__":
    rank_main.run({"mismatch": mismatch, "timeout": timeout, "dead": dead}[sys.argv[1]],
                  int(os.environ["RANK"]))
