# Prints torch.utils.data.DistributedSampler's indices for the cases the C++
# test asks for. Input (stdin): one case per line
#   "<dataset_size> <num_replicas> <rank> <shuffle 0|1> <seed> <epoch> <drop_last 0|1>"
# Output: one line per case with the indices separated by spaces ("-" when empty).
import sys

import torch
from torch.utils.data import DistributedSampler


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


for line in sys.stdin:
    if not line.strip():
        continue
    n, replicas, rank, shuffle, seed, epoch, drop_last = (int(x) for x in line.split())
    sampler = DistributedSampler(Sized(n), num_replicas=replicas, rank=rank,
                                 shuffle=bool(shuffle), seed=seed, drop_last=bool(drop_last))
    sampler.set_epoch(epoch)
    indices = list(iter(sampler))
    assert len(indices) == len(sampler)
    print(" ".join(str(i) for i in indices) if indices else "-")
