"""One rank of torch_backend_bench: the same PyTorch program on backend "gloo" or "ddp".

Started by torch_backend_bench.py as 2 processes with torch's env:// variables
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) and,
for "ddp" runs with progress recording, DDP_PROGRESS_FD. Rank 0 writes one JSON
object to --out; nothing is printed on stdout. Every rank leaves with
os._exit (torch 1.13's Gloo can deadlock in ~ProcessGroupGloo at exit): 0 when
the run completed, 1 after printing the exception.

  train      torch.nn.parallel.DistributedDataParallel on an MLP (--layers), SGD, a fixed
             batch per rank; --warmup steps untimed, then --steps timed between two
             barriers. Writes samples_per_s, step_ms (the slower rank's), params, loss.
  allreduce  torch.distributed.all_reduce (float32, SUM) for each of --sizes bytes: a
             check that ones sum to the world size, --warmup untimed ops (at least 2,
             2 above 16 MiB), then as many ops as fit in --seconds at the mean time of
             the warm-up's ops after the first on rank 0 (at least 5). Writes, per size, the
             iterations, the mean time per op (the slower rank's) and the bus bandwidth
             as nccl-tests define it: bytes / time * 2(n-1)/n.

Usage: torch_backend_worker.py --backend gloo|ddp --mode train|allreduce --out FILE [options]
"""
import argparse
import json
import os
import sys
import time
import traceback


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=["gloo", "ddp"], required=True)
    p.add_argument("--mode", choices=["train", "allreduce"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--layers", default="784,1536,1536,10")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--sizes", default="4096,1048576,268435456")
    p.add_argument("--seconds", type=float, default=0.5)
    return p.parse_args()


def init(backend):
    import torch
    import torch.distributed as dist
    if backend == "ddp":
        import ddp_torch  # noqa: F401  registers the backend "ddp"
    torch.set_num_threads(1)  # 2 ranks on 2 cores: one compute thread each, both backends
    dist.init_process_group(backend)
    return torch, dist


def slowest(torch, dist, seconds):
    """The largest of the ranks' `seconds`."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def mlp(torch, widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def train(a, torch, dist):
    widths = [int(w) for w in a.layers.split(",")]
    torch.manual_seed(0)
    model = mlp(torch, widths)
    params = sum(p.numel() for p in model.parameters())
    ddp_model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    x = torch.randn(a.batch, widths[0], generator=g)
    y = torch.randint(0, widths[-1], (a.batch,), generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()
    loss = None

    def step():
        opt.zero_grad()
        out = loss_fn(ddp_model(x), y)
        out.backward()
        opt.step()
        return out

    for _ in range(a.warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    dist.barrier()
    secs = slowest(torch, dist, time.perf_counter() - t0)
    n = dist.get_world_size()
    return {"params": params, "steps": a.steps, "warmup": a.warmup,
            "samples_per_s": a.steps * a.batch * n / secs, "step_ms": 1000 * secs / a.steps,
            "loss": loss.item()}


# Above this many bytes one all-reduce takes a good part of a second on Gloo: 2 warm-up ops
# at most, which is enough to have every buffer allocated and touched.
LARGE = 16 << 20


def check_sum(torch, dist, t):
    """all_reduce of ones must give the world size everywhere: a wrong backend is no benchmark."""
    t.fill_(1)
    dist.all_reduce(t)
    n = dist.get_world_size()
    if not bool((t == n).all()):
        raise RuntimeError(f"all_reduce of {t.numel()} ones gave values other than {n}")


def time_allreduce(a, torch, dist, size):
    t = torch.empty(size // 4, dtype=torch.float32)
    check_sum(torch, dist, t)
    t.zero_()  # zeros stay zeros: no overflow, whatever the iteration count
    dist.all_reduce(t)  # the first: whatever a backend sets up on first use, untimed
    warmups = max(1, a.warmup - 1 if size <= LARGE else 1)
    t0 = time.perf_counter()
    for _ in range(warmups):
        dist.all_reduce(t)
    one = (time.perf_counter() - t0) / warmups
    iters = torch.tensor([min(100000, max(5, int(a.seconds / max(one, 1e-7))))])
    dist.broadcast(iters, 0)  # rank 0's count, so that both ranks run the same number
    iters = int(iters.item())
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    secs = slowest(torch, dist, time.perf_counter() - t0) / iters
    n = dist.get_world_size()
    return {"bytes": size, "iters": iters, "time_us": secs * 1e6,
            "busbw_gbps": size / secs * 2 * (n - 1) / n / 1e9}


def allreduce(a, torch, dist):
    return {"sizes": [time_allreduce(a, torch, dist, int(s)) for s in a.sizes.split(",")]}


def main():
    a = parse_args()
    try:
        torch, dist = init(a.backend)
        result = train(a, torch, dist) if a.mode == "train" else allreduce(a, torch, dist)
        dist.barrier()
        if dist.get_rank() == 0:
            result.update(backend=a.backend, mode=a.mode, ranks=dist.get_world_size(),
                          torch=torch.__version__)
            with open(a.out, "w") as f:
                json.dump(result, f)
    except BaseException:  # noqa: B036  any failure, KeyboardInterrupt included, is this rank's exit 1
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
