# A torchrun script that guards its work with torch's file timer
# (torch.distributed.elastic.timer.expires, served by the launcher when
# TORCHELASTIC_ENABLE_FILE_TIMER=1 on the FIFO named by TORCHELASTIC_TIMER_FILE).
# Gloo on CPU, 2 ranks. Each rank records what it did in <out>/rank<RANK>.json
# (rewritten whole after every step, so a killed rank leaves what it reached).
#
#   --case overrun    expires(after=2, scope="step"): rank 1's step takes 10 s
#   --case in_time    the same scope; every step takes 0.2 s: exit 0
#   --case allreduce  expires(after=3, scope="allreduce") around an all_reduce
#                     that rank 1 never reaches (it blocks before it)
#   --case healthy    expires(after=30, scope="healthy") around a wait for
#                     <out>/go (written by the test): exit 0
#
# The ranks never wait for each other in a collective while a peer may be
# killed (they meet through files in <out> there): a collective whose peer
# died fails at once, and the test wants exactly one failed rank.
# A script not about exiting leaves with os._exit(0): torch 1.13 can deadlock
# at exit in ~ProcessGroupGloo.
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic import timer

STEP_SCOPE = "step"
ALLREDUCE_SCOPE = "allreduce"
HEALTHY_SCOPE = "healthy"
# Bounds the file waits: the test's own limits are shorter.
WAIT_S = 30


class Record:
    def __init__(self, out, rank):
        self.path = os.path.join(out, f"rank{rank}.json")
        self.values = {"rank": rank, "pid": os.getpid(),
                       "timer_file": os.environ.get("TORCHELASTIC_TIMER_FILE")}
        self.note()

    def note(self, **values):
        self.values.update(values)
        temp = self.path + ".tmp"
        with open(temp, "w") as f:
            json.dump(self.values, f)
        os.replace(temp, self.path)


def wait_for_file(path, seconds=WAIT_S):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {seconds} s")
        time.sleep(0.02)


def all_reduce_sum(value):
    tensor = torch.tensor([float(value)])
    dist.all_reduce(tensor)
    return tensor.item()


def step(record, rank, case):
    """One training step under a 2 s timer; rank 1 overruns it in 'overrun'."""
    seconds = 10.0 if case == "overrun" and rank == 1 else 0.2
    with timer.expires(after=2, scope=STEP_SCOPE):
        record.note(step_entered=time.time())
        time.sleep(seconds)  # the step's compute
    record.note(step_done=time.time())
    with open(os.path.join(os.path.dirname(record.path), f"step_done{rank}"), "w"):
        pass
    # Meet outside the scope, through files (see above), then all-reduce.
    wait_for_file(os.path.join(os.path.dirname(record.path), f"step_done{1 - rank}"))


def blocked_allreduce(record, rank):
    """Rank 1 blocks before the collective; rank 0 comes 2 s later (loading its
    batch), so its own timer would expire 2 s after rank 1's."""
    if rank == 0:
        time.sleep(2.0)
    with timer.expires(after=3, scope=ALLREDUCE_SCOPE):
        record.note(scope_entered=time.time())
        if rank == 1:
            time.sleep(1000)  # stuck before the collective
        all_reduce_sum(rank)


def healthy(record, out):
    with timer.expires(after=30, scope=HEALTHY_SCOPE):
        record.note(in_scope=time.time())
        wait_for_file(os.path.join(out, "go"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", required=True, choices=["overrun", "in_time", "allreduce", "healthy"])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    record = Record(args.out, rank)
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    record.note(warmup=all_reduce_sum(rank + 1))

    if args.case in ("overrun", "in_time"):
        step(record, rank, args.case)
    elif args.case == "allreduce":
        blocked_allreduce(record, rank)
    else:
        healthy(record, args.out)

    record.note(total=all_reduce_sum(rank + 1), finished=time.time())
    os._exit(0)


if __name__ == "__main__":
    main()
