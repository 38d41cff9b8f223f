"""sync_state_bench: ddp_torch.sync_state against torch's all_reduce of the same bytes on the "ddp"
backend, interleaved in one run (replica_state_bench's Python counterpart). Run it under ddprun:

    ddprun --standalone --nproc_per_node=3 /usr/bin/python3 sync_state_bench.py [--hidden 512,256]
           [--iters 50]

The state is the demo's MLP 784-H...-10 with SGD momentum (one step taken, so every parameter has
its momentum buffer: 4.09 MiB at --hidden 512,256) and 3 counters. Every rank syncs once first
(all live: rank 0 stays the root). Each iteration, after a barrier: one sync_state, then one
float32 all_reduce of the state's bytes; a time is the slowest rank's. Rank 0 prints, medians:

    sync_state ranks=N bytes=B total_ms=T transfer_ms=S allreduce_ms=A state_gbps=<B/T>
      transfer_gbps=<B/S> busbw_gbps=<B/A x 2(N-1)/N> state_ratio=<state_gbps/busbw_gbps>
      transfer_ratio=<transfer_gbps/busbw_gbps>

total: the whole call (the layouts' all_gather_object included); transfer: ReplicaState::sync's own
time (last_sync().seconds, the slowest rank's).
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import ddp_torch


def slowest(seconds):
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def timed(op):
    dist.barrier()
    start = time.perf_counter()
    op()
    return slowest(time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", default="512,256")
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("ddp")
    n = dist.get_world_size()
    widths = [784] + [int(h) for h in args.hidden.split(",")] + [10]
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(4, 784)).sum().backward()
    opt.step()
    counters = {"step": 1, "epoch": 0, "position": 64}
    ddp_torch.sync_state(net, opt, counters)
    state_bytes = ddp_torch.last_sync().bytes
    flat = torch.ones(state_bytes // 4)
    total, transfer, allreduce = [], [], []
    for _ in range(args.iters):
        total.append(timed(lambda: ddp_torch.sync_state(net, opt, counters)))
        transfer.append(slowest(ddp_torch.last_sync().seconds))
        allreduce.append(timed(lambda: dist.all_reduce(flat)))
    if dist.get_rank() == 0:
        t, s, a = (statistics.median(v) for v in (total, transfer, allreduce))
        busbw = state_bytes / a / 1e9 * 2 * (n - 1) / n
        print(f"sync_state ranks={n} bytes={state_bytes} total_ms={t * 1e3:.3f} transfer_ms={s * 1e3:.3f} "
              f"allreduce_ms={a * 1e3:.3f} state_gbps={state_bytes / t / 1e9:.2f} "
              f"transfer_gbps={state_bytes / s / 1e9:.2f} busbw_gbps={busbw:.2f} "
              f"state_ratio={state_bytes / t / 1e9 / busbw:.2f} "
              f"transfer_ratio={state_bytes / s / 1e9 / busbw:.2f}", flush=True)
    dist.barrier()
    os._exit(0)  # torch 1.13 can deadlock at exit in its process groups' destructors


if __name__ == "__main__":
    main()
