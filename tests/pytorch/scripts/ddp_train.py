# A small DDP training loop as a torchrun user writes it: env:// initialisation,
# DistributedSampler(shuffle=True) + DataLoader, set_epoch every epoch.
# Each rank writes <out>/rank<RANK>.json: the sample indices it saw per epoch,
# its losses and the final parameters.
# The backend is Gloo, or what DDP_TEST_BACKEND names: with "ddp" (ddprun's own,
# tests/pytorch/matrix.py's ddp cases) the script imports ddp_torch, which registers it.
import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

BACKEND = os.environ.get("DDP_TEST_BACKEND", "gloo")
if BACKEND == "ddp":
    import ddp_torch  # noqa: F401  (registers the backend "ddp")


def make_dataset(size):
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(size, 3, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.25
    return TensorDataset(torch.arange(size), x, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=24)
    args = parser.parse_args()

    dist.init_process_group(BACKEND)
    rank = dist.get_rank()
    torch.manual_seed(0)

    dataset = make_dataset(args.samples)
    sampler = DistributedSampler(dataset, shuffle=True, seed=1234)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler)
    model = DistributedDataParallel(torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    seen = []
    losses = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        indices = []
        for index, x, y in loader:
            indices += index.tolist()
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        seen.append(indices)

    result = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "seen": seen,
        "losses": losses,
        "params": [p.detach().flatten().tolist() for p in model.module.parameters()],
    }
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
