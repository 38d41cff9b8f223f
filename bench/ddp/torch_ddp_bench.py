"""PyTorch's side of ddp_bench: the same MLP, batch and bucket cap under
torch.nn.parallel.DistributedDataParallel with the gloo backend. Started by
ddp_bench as 2 processes with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set;
rank 0 prints one line "RESULT samples_per_s=<x> step_ms=<y> ...".

--local trains the plain module (no DDP, no communication) for the step time
without communication. Otherwise the RESULT line also carries PyTorch's own
runtime statistics (DDP's logger samples iterations 1-10 and every 100th): the
mean all-reduce span per step (torch_comm_ms) and the part of it that overlapped
the backward computation (torch_overlap_ms), over the sampled timed steps.

Usage: /usr/bin/python3 torch_ddp_bench.py --layers 784,1024,1024,10 --batch 64 --steps 50 --warmup 5
           --bucket-cap-mb 25 [--local] [--gradient-as-bucket-view] [--fp16-hook]
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", default="784,1024,1024,10")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--local", action="store_true")
    p.add_argument("--gradient-as-bucket-view", action="store_true")
    p.add_argument("--fp16-hook", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    widths = [int(w) for w in a.layers.split(",")]
    mods = []
    for i in range(len(widths) - 1):
        mods.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            mods.append(nn.ReLU())
    torch.manual_seed(0)
    model = nn.Sequential(*mods)
    if not a.local:
        model = nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=a.bucket_cap_mb, gradient_as_bucket_view=a.gradient_as_bucket_view)
        if a.fp16_hook:
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    x = torch.randn(a.batch, widths[0], generator=g)
    y = torch.randint(0, widths[-1], (a.batch,), generator=g)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    comm, overlap = [], []
    last_sample = None
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(a.steps):
        step()
        if not a.local and a.warmup + i + 1 <= 10:  # the logger's sampled iterations
            d = model._get_ddp_logging_data()
            if d.get("backward_comm_time_start") != last_sample:
                last_sample = d.get("backward_comm_time_start")
                comm.append(d["backward_comm_time"] / 1e6)
                overlap.append(d["backward_compute_comm_overlap_time"] / 1e6)
    dist.barrier()
    secs = time.perf_counter() - t0
    if dist.get_rank() == 0:
        sps = a.steps * a.batch * dist.get_world_size() / secs
        extra = ""
        if comm:
            extra = f" torch_comm_ms={sum(comm) / len(comm):.3f} torch_overlap_ms={sum(overlap) / len(overlap):.3f}"
        print(f"RESULT samples_per_s={sps:.1f} step_ms={1000 * secs / a.steps:.3f}{extra}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
