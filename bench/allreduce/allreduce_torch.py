"""torch.distributed gloo all_reduce with the same sizes and formulas as
allreduce_bench (time per op, algbw, busbw = algbw * 2(n-1)/n).

Run under ddprun or torchrun with /usr/bin/python3 (torch 1.13):
    PYTHON_EXEC=/usr/bin/python3 ddprun --standalone --nproc_per_node=2 allreduce_torch.py --json out.jsonl
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def parse_size(text):
    units = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    if text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def human(n):
    if n >= 1024 ** 2:
        return f"{n // 1024 ** 2}M"
    if n >= 1024:
        return f"{n // 1024}K"
    return str(n)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--min", default="4K")
    parser.add_argument("--max", default="256M")
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--json", default="")
    parser.add_argument("--backend", default="gloo", choices=["gloo", "ddp"],
                        help="ddp: the ddp backend (import ddp_torch, on PYTHONPATH)")
    args = parser.parse_args()
    if args.backend == "ddp":
        import ddp_torch  # noqa: F401  registers the backend "ddp"
    dist.init_process_group(args.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    out = open(args.json, "w") if rank == 0 and args.json else None
    if rank == 0:
        print(f"# torch {torch.__version__} {args.backend} all_reduce, float32 sum, {n} ranks")
        print(f"{'size':>10} {'iters':>8} {'time_us':>12} {'median_us':>12} {'algbw_GB/s':>12} {'busbw_GB/s':>12}")
    size = parse_size(args.min)
    big = torch.ones(parse_size(args.max) // 4)
    while size <= parse_size(args.max):
        t = big[: size // 4]
        for _ in range(3):
            dist.all_reduce(t)
        t0 = time.perf_counter()
        dist.all_reduce(t)
        one = time.perf_counter() - t0
        iters = torch.tensor([min(2000, max(3, int(args.seconds / max(one, 1e-6))))])
        dist.broadcast(iters, 0)
        iters = int(iters.item())
        dist.barrier()
        each = []
        start = time.perf_counter()
        for _ in range(iters):
            t1 = time.perf_counter()
            dist.all_reduce(t)
            each.append(time.perf_counter() - t1)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        seconds = elapsed.item() / iters
        median = sorted(each)[len(each) // 2]
        algbw = size / seconds / 1e9
        busbw = algbw * 2 * (n - 1) / n
        if rank == 0:
            print(f"{human(size):>10} {iters:>8} {seconds * 1e6:>12.1f} {median * 1e6:>12.1f} {algbw:>12.3f} {busbw:>12.3f}", flush=True)
            if out:
                out.write(json.dumps({"impl": "torch", "backend": args.backend, "bytes": size, "iters": iters,
                                      "time_us": seconds * 1e6, "median_us": median * 1e6, "algbw": algbw, "busbw": busbw}) + "\n")
        size *= 2
    if out:
        out.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
