"""Run by driver.py's `installed` test under an installed ddprun: ddp_torch must
come from the prefix's lib/ddprun/python (argv[1]), found through the PYTHONPATH
ddprun gave, and one all_reduce must run on "ddp". Prints "rank <r>: ok"."""
import os
import sys

import torch
import torch.distributed as dist

import ddp_torch
import rank_main


def main():
    where = os.path.realpath(ddp_torch.__file__)
    expected = os.path.realpath(sys.argv[1])
    assert where.startswith(expected + os.sep), f"ddp_torch from {where}, not from {expected}"
    assert os.environ["PYTHONPATH"].split(":")[-1] == sys.argv[1], os.environ["PYTHONPATH"]
    dist.init_process_group("ddp")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    assert t.item() == 3.0, t
    print(f"rank {dist.get_rank()}: ok ddp_torch from {where}", flush=True)


if __name__ == "__main__":
    rank_main.run(main)
