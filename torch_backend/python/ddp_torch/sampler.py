"""ElasticDistributedSampler: torch's DistributedSampler that can resume mid-epoch on another world.

    sampler = ddp_torch.ElasticDistributedSampler(dataset, shuffle=True, seed=0)
    ...after a re-form, with counters from sync_state:
    sampler.set_epoch(counters["epoch"]); sampler.set_position(counters["position"])

The epoch's global order is torch's: the dataset's indices, shuffled with the
generator seeded seed + epoch when shuffle is on. At position 0 every rank gets
exactly what torch.utils.data.DistributedSampler gives it (the same padding to
a multiple of the world size, or the same truncation with drop_last).

A position is the number of samples of the epoch the job trained, over all
ranks: a global step of B samples per rank on W ranks moves it by B x W, since
rank r's first k samples are the order's items r, r + W, ..., and all ranks'
first k together are exactly the order's first k x W. set_position(P) splits the
rest of the order (items P onwards) among the current world as torch splits a
whole epoch: rank r takes rest[r::W], the rest padded with its own first items
to a multiple of W (or truncated to one with drop_last). Each remaining sample
is thus given to exactly one rank (except the padding, as in torch), however
the world size changed since the epoch began; positions at or past the
dataset's size leave nothing. set_epoch starts the next epoch at position 0.

num_replicas and rank, when not given, are the current torch.distributed world
size and rank, read again whenever the sampler is used (iter(), len(),
set_epoch, set_position): after ddp_torch.reform() the sampler follows the new
world without being made again. Given ones stay fixed.
"""

import math

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler


class ElasticDistributedSampler(DistributedSampler):
    """torch's DistributedSampler plus set_position(global_position); see the module's docstring."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        self._fixed_replicas = num_replicas
        self._fixed_rank = rank
        self.position = 0
        super().__init__(dataset, num_replicas=self._world_size(), rank=self._rank(), shuffle=shuffle,
                         seed=seed, drop_last=drop_last)
        self._refresh()

    def _world_size(self):
        if self._fixed_replicas is not None:
            return self._fixed_replicas
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ElasticDistributedSampler: no num_replicas given and no process group "
                               "initialized")
        return dist.get_world_size()

    def _rank(self):
        return self._fixed_rank if self._fixed_rank is not None else dist.get_rank()

    def _remaining(self):
        return max(0, len(self.dataset) - self.position)

    def _refresh(self):
        """Re-reads the world (when not fixed) and sizes this rank's share of the rest of the epoch."""
        self.num_replicas = self._world_size()
        self.rank = self._rank()
        if self.rank >= self.num_replicas or self.rank < 0:
            raise ValueError(f"Invalid rank {self.rank}, rank should be in the interval "
                             f"[0, {self.num_replicas - 1}]")
        remaining = self._remaining()
        if self.drop_last:
            self.num_samples = remaining // self.num_replicas
        else:
            self.num_samples = math.ceil(remaining / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch):
        """Starts epoch `epoch` at position 0."""
        super().set_epoch(epoch)
        self.position = 0
        self._refresh()

    def set_position(self, global_position):
        """Skips the first `global_position` samples of the epoch's order (trained on any world)."""
        if global_position < 0:
            raise ValueError(f"set_position: {global_position} is negative")
        self.position = int(global_position)
        self._refresh()

    def _order(self):
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            return torch.randperm(len(self.dataset), generator=g).tolist()
        return list(range(len(self.dataset)))

    def __iter__(self):
        self._refresh()
        rest = self._order()[self.position:]
        if not self.drop_last:
            padding = self.total_size - len(rest)
            if padding <= len(rest):
                rest += rest[:padding]
            else:
                rest += (rest * math.ceil(padding / len(rest)))[:padding]
        else:
            rest = rest[:self.total_size]
        assert len(rest) == self.total_size
        return iter(rest[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        self._refresh()
        return self.num_samples


__all__ = ["ElasticDistributedSampler"]
