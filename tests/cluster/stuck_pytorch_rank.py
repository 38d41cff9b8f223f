# A PyTorch DDP script on the backend "ddp" (import ddp_torch: nothing else
# added) in which rank <stuck> stops before its <step>th step: it writes the
# time into <mark_dir>/stall_<stuck> and sleeps in stopped_before_its_step(),
# so its peers wait in DDP's all-reduce. ddprun's --hang_timeout must name it,
# and faulthandler, on the SIGABRT that ends it, prints this function in its
# traceback.
#   stuck_pytorch_rank.py <stuck> <step> <steps> <mark_dir>
import os
import sys
import time

import torch
import torch.distributed as dist
import ddp_torch  # noqa: F401  registers the backend "ddp"
from torch.nn.parallel import DistributedDataParallel as DDP


def stopped_before_its_step(mark_dir, rank):
    path = os.path.join(mark_dir, f"stall_{rank}")
    with open(path + ".tmp", "w") as f:
        f.write(f"{time.time():.9f}")
    os.replace(path + ".tmp", path)
    while True:
        time.sleep(3600)


def main():
    stuck, stuck_step, steps, mark_dir = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("ddp")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(32, 64)
    for step in range(1, steps + 1):
        if rank == stuck and step == stuck_step:
            stopped_before_its_step(mark_dir, rank)
        opt.zero_grad()
        model(data).sum().backward()
        opt.step()
        time.sleep(0.05)
    os._exit(0)


if __name__ == "__main__":
    main()
