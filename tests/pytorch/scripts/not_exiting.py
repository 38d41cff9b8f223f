# A torchrun script whose rank 1 never exits: both ranks all-reduce over Gloo,
# then rank 0 records its exit time in <out>/rank0.json and exits 0, while
# rank 1 records its pid and sleeps forever in linger_after_last_collective()
# (no timer: the launcher's --hang_timeout must find it, and faulthandler,
# on SIGABRT, prints this function in rank 1's traceback).
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def write_record(out, rank, **values):
    path = os.path.join(out, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(dict(rank=rank, pid=os.getpid(), **values), f)
    os.replace(path + ".tmp", path)


def linger_after_last_collective():
    while True:
        time.sleep(3600)


def main():
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tensor = torch.tensor([float(rank + 1)])
    dist.all_reduce(tensor)
    dist.barrier()
    if rank == 0:
        write_record(out, rank, total=tensor.item(), exited=time.time())
        os._exit(0)  # torch 1.13 can deadlock at exit in ~ProcessGroupGloo
    write_record(out, rank, total=tensor.item(), faulthandler=os.environ.get("PYTHONFAULTHANDLER"))
    linger_after_last_collective()


if __name__ == "__main__":
    main()
