"""torch.nn.parallel.DistributedDataParallel on the backend "ddp", against Gloo.

Run by driver.py under a launcher. Two copies of one seeded MLP train on the
same per-rank batches for a few steps, one wrapped in DDP over the default
"ddp" group, the other over a Gloo group of the same ranks; a third copy trains
on "ddp" with a comm hook (fp16 compression: a future chained on our Work's).
Checks: each model's parameters are bit-identical across ranks, and the "ddp"
model matches the Gloo model within torch's tolerances. Prints "ok ..." and
exits 0, or raises (exit 1).
"""
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_torch  # noqa: F401  (registers "ddp")
import rank_main

STEPS = 6


def model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 4))


def train(net, rank):
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    for _ in range(STEPS):
        x = torch.randn(16, 32, generator=gen)
        y = torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def identical_across_ranks(flat, gloo, what):
    everyone = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat, group=gloo)
    for r, other in enumerate(everyone):
        if not torch.equal(other.view(torch.int32), flat.view(torch.int32)):
            raise AssertionError(f"{what}: rank {r}'s parameters differ from rank {dist.get_rank()}'s")


def main():
    dist.init_process_group("ddp", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    on_ddp = train(DDP(model()), rank)
    on_gloo = train(DDP(model(), process_group=gloo), rank)
    hooked = DDP(model())
    hooked.register_comm_hook(None, default_hooks.fp16_compress_hook)
    with_hook = train(hooked, rank)
    identical_across_ranks(on_ddp, gloo, "DDP on ddp")
    identical_across_ranks(on_gloo, gloo, "DDP on gloo")
    identical_across_ranks(with_hook, gloo, "DDP on ddp with fp16_compress_hook")
    torch.testing.assert_close(on_ddp, on_gloo, msg=lambda m: f"ddp against gloo: {m}")
    torch.testing.assert_close(with_hook, on_gloo, rtol=1e-2, atol=1e-3,
                               msg=lambda m: f"fp16 hook against gloo: {m}")
    assert not torch.equal(on_ddp, model_params()), "training changed nothing"
    dist.barrier()
    print(f"rank {rank}: ok DDP on ddp bit-identical across ranks and matching gloo "
          f"(max difference {(on_ddp - on_gloo).abs().max().item():.3g})", flush=True)


def model_params():
    return torch.cat([p.detach().reshape(-1) for p in model().parameters()])


if __name__ == "__main__":
    rank_main.run(main)
