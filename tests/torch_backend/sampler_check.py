"""ddp_torch.ElasticDistributedSampler in one process (run by state_driver.py sampler).

- At position 0 it gives every rank exactly torch's DistributedSampler indices
  and length: shuffle on and off, drop_last on and off, world sizes 1 to 5,
  dataset sizes that divide and do not, epochs 0 and 3.
- Across world sizes 3 -> 2 -> 3 within one epoch (set_position after each
  change, positions advancing by whole global batches), every sample of the
  epoch is trained exactly once (without drop_last the last world's padding
  repeats only samples already given, as torch's does), in the epoch's order.
- Without num_replicas and rank it follows torch.distributed's current world,
  read again when used (a stand-in for reform(): the world functions replaced).
- set_epoch goes back to position 0; a position past the end leaves nothing.
Prints "sampler: ok".
"""
import torch.distributed as dist
from torch.utils.data import DistributedSampler

import ddp_torch
import rank_main


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def same_as_torch():
    for n in (1, 7, 10, 12, 13, 100):
        for world in range(1, 6):
            for shuffle in (True, False):
                for drop_last in (True, False):
                    for epoch in (0, 3):
                        for rank in range(world):
                            args = dict(num_replicas=world, rank=rank, shuffle=shuffle, seed=5,
                                        drop_last=drop_last)
                            ref = DistributedSampler(range(n), **args)
                            ours = ddp_torch.ElasticDistributedSampler(range(n), **args)
                            ref.set_epoch(epoch)
                            ours.set_epoch(epoch)
                            what = f"n={n} {args} epoch={epoch}"
                            expect(list(ours) == list(ref), f"{what}: {list(ours)} != {list(ref)}")
                            expect(len(ours) == len(ref), f"{what}: len {len(ours)} != {len(ref)}")
                            expect(isinstance(ours, DistributedSampler), "not a DistributedSampler")


def trained(n, worlds, batch, drop_last, epoch=2):
    """The samples the global steps train, in order, over `worlds` = [(world size, steps), ...]; the last world
    trains to the end of its sampler."""
    position, out = 0, []
    for k, (world, steps) in enumerate(worlds):
        samplers = [ddp_torch.ElasticDistributedSampler(range(n), num_replicas=world, rank=r, seed=9,
                                                        drop_last=drop_last) for r in range(world)]
        for s in samplers:
            s.set_epoch(epoch)
            s.set_position(position)
        shares = [list(s) for s in samplers]
        expect(len(set(len(x) for x in shares)) == 1, f"unequal shares {shares}")
        expect(all(len(x) == len(s) for x, s in zip(shares, samplers)), "len() disagrees with iter()")
        last = k == len(worlds) - 1
        steps = -(-len(shares[0]) // batch) if last else steps
        for step in range(steps):
            for j in range(step * batch, min((step + 1) * batch, len(shares[0]))):
                out.extend(shares[r][j] for r in range(world))  # the step's samples in global order
            position += batch * world
    return out


def elastic():
    n, batch = 104, 4
    ref = ddp_torch.ElasticDistributedSampler(range(n), num_replicas=1, rank=0, seed=9)
    ref.set_epoch(2)
    order = list(ref)
    rest = order[3 * 3 * batch + 2 * 5 * batch:]  # what the last world of 3 splits: 28 samples
    got = trained(n, [(3, 3), (2, 5), (3, 100)], batch, False)
    expect(got[:n] == order, f"3 -> 2 -> 3: not each sample once in the epoch's order: {got}")
    expect(got[n:] == rest[:2], f"3 -> 2 -> 3: the padding is {got[n:]}, not {rest[:2]}")
    got = trained(n, [(3, 3), (2, 5), (3, 100)], batch, True)
    expect(got == order[:n - 1], f"3 -> 2 -> 3, drop_last: {got}")
    # Regrouped in the middle of a world's epoch, a world of 1 among them.
    got = trained(n, [(2, 1), (3, 2), (1, 7), (2, 100)], 3, False)
    expect(got[:n] == order and got[n:] == order[45:46], f"2 -> 3 -> 1 -> 2: {got}")


def follows_the_world():
    real = dist.is_initialized, dist.get_world_size, dist.get_rank
    world = {"size": 3, "rank": 2}
    dist.is_initialized = lambda: True
    dist.get_world_size = lambda group=None: world["size"]
    dist.get_rank = lambda group=None: world["rank"]
    try:
        s = ddp_torch.ElasticDistributedSampler(range(20), shuffle=False)
        expect((s.num_replicas, s.rank, list(s)) == (3, 2, [2, 5, 8, 11, 14, 17, 0]),
               f"world of 3: {s.num_replicas} {s.rank} {list(s)}")
        world.update(size=2, rank=1)  # what reform() does to torch's default group
        s.set_position(6)
        expect((s.num_replicas, s.rank, len(s), list(s)) == (2, 1, 7, [7, 9, 11, 13, 15, 17, 19]),
               f"world of 2 from 6: {s.num_replicas} {s.rank} {list(s)}")
        world.update(size=4, rank=0)
        expect(list(s) == [6, 10, 14, 18], f"world of 4, read at iter(): {list(s)}")
        fixed = ddp_torch.ElasticDistributedSampler(range(20), num_replicas=5, rank=1, shuffle=False)
        expect(list(fixed) == [1, 6, 11, 16], f"fixed {list(fixed)}")
        s.set_position(25)
        expect(list(s) == [] and len(s) == 0, f"past the end {list(s)}")
        s.set_epoch(1)
        expect(list(s) == [0, 4, 8, 12, 16], f"set_epoch's position 0: {list(s)}")
    finally:
        dist.is_initialized, dist.get_world_size, dist.get_rank = real


def main():
    same_as_torch()
    elastic()
    follows_the_world()
    print("sampler: ok", flush=True)


if __name__ == "__main__":
    rank_main.run(main)
