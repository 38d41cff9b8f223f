"""The demo's model and data (train_fashion_mnist: an MLP on Fashion-MNIST) in PyTorch,
with DistributedDataParallel on the torch.distributed backend "ddp", recovering in place.

    PYTHON_EXEC=/usr/bin/python3 ddprun --nnodes=2:3 --nproc_per_node=1 --rdzv_backend=c10d \
        --rdzv_endpoint=HOST:29400 examples/torch_fashion_mnist_elastic/train.py --epochs 2

Under ddprun the workers keep their processes when a node is lost or joins: the round
ends under a step (ddp_torch.GroupChanged), the step is dropped, the worker re-forms
(ddp_torch.reform), wraps the model in a new DDP and takes the state of the lowest live
rank (ddp_torch.sync_state), and the sampler splits what is left of the epoch among the
new world. A newcomer receives that state from a live rank. With --no-recover-in-place,
under torchrun or without an agent, the script just trains: a restart resumes from
--checkpoint (written by rank 0, atomically) when there is one. Without RANK in the
environment it trains alone (a world of 1).

A step counts once opt.step() returned: then the counters step (global steps), epoch and
position (samples of the epoch trained by all ranks) advance. Lines for tests and
benchmarks (rank 0 unless said):
    step=G world=W rank=0 epoch=E position=P loss=L      every --log-every steps
    step-time rank=R world=W global_step=G t=T          every rank and step, --step-times
    state-sync rank=R root=X received=0|1 live=0|1 bytes=N seconds=S t=T
                                                        every rank and sync, --step-times
    rank R: received the state of rank X (live) ...     a rank given a live rank's state
    re-formed in place (WHY): round N, W ranks (was V) in S s
    resumed from checkpoint PATH: epoch E, position P, global step G
    final test accuracy: A%
(T: CLOCK_MONOTONIC seconds, time.monotonic()). Ends with os._exit(0): torch 1.13 can
deadlock at exit in ~ProcessGroupGloo.
"""

import argparse
import gzip
import math
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_torch

# Fashion-MNIST's training-set pixel mean and standard deviation (as the demo).
MEAN, STD = 0.2860, 0.3530


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist",
                   help="folder with the gzip IDX files")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank and step")
    p.add_argument("--lr", type=float, default=0.05,
                   help="peak learning rate at a global batch of --lr-batch samples (cosine "
                   "decay to 0; scaled linearly with the global batch)")
    p.add_argument("--lr-batch", type=int, default=192,
                   help="the global batch --lr is for (3 ranks of 64 by default)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", default="256,128", help="hidden layer widths, comma-separated")
    p.add_argument("--seed", type=int, default=0, help="initialization and shuffling seed")
    p.add_argument("--train-limit", type=int, default=0, help="first N training samples (0: all)")
    p.add_argument("--test-limit", type=int, default=0, help="first N test samples (0: all)")
    p.add_argument("--checkpoint", default="", help="read at start when no live rank has a "
                   "state; written by rank 0 every --checkpoint-every steps, at epoch ends and "
                   "at --max-steps")
    p.add_argument("--checkpoint-every", type=int, default=200)
    p.add_argument("--log-every", type=int, default=50, help="rank 0's step line every N steps")
    p.add_argument("--max-steps", type=int, default=0, help="stop after global step N (0: none)")
    p.add_argument("--throttle-ms", type=int, default=0, help="sleep after each step")
    p.add_argument("--step-times", action="store_true",
                   help="every rank prints a step-time line per step and a state-sync line "
                   "per sync (benchmarks)")
    p.add_argument("--no-recover-in-place", action="store_true",
                   help="under ddprun, be restarted when the membership changes")
    a = p.parse_args(argv)
    if a.epochs < 1 or a.batch_size < 1:
        p.error("--epochs and --batch-size must be positive")
    return a


def say(*parts):
    print(*parts, flush=True)


def read_idx(path, magic, limit):
    """An IDX file's items (uint8 numpy array, first dimension at most `limit` when > 0)."""
    with gzip.open(path, "rb") as f:
        head = f.read(4)
        if int.from_bytes(head, "big") != magic:
            raise RuntimeError(f"{path}: not an IDX file of the expected kind")
        ndim = magic & 0xFF
        dims = [int.from_bytes(f.read(4), "big") for _ in range(ndim)]
        if limit > 0:
            dims[0] = min(dims[0], limit)
        size = math.prod(dims)
        data = f.read(size)
    if len(data) != size:
        raise RuntimeError(f"{path}: truncated data")
    return np.frombuffer(data, dtype=np.uint8).reshape(dims)


def load(data_dir, prefix, limit):
    """(images [n, 784] uint8, labels [n] int64) of train or t10k: the pixels are
    normalized a batch at a time (features()), since normalizing all 60,000 images up front
    takes seconds (3 passes over 188 MB of fresh float memory) that a joining node would
    spend before its first step."""
    images = read_idx(f"{data_dir}/{prefix}-images-idx3-ubyte.gz", 0x803, limit)
    labels = read_idx(f"{data_dir}/{prefix}-labels-idx1-ubyte.gz", 0x801, limit)
    if len(images) != len(labels):
        raise RuntimeError(f"{data_dir}: {prefix} images and labels differ in number")
    return (torch.from_numpy(images.reshape(len(images), -1)),
            torch.from_numpy(labels.astype(np.int64)))


def features(images):
    """The model's input for uint8 images [n, 784]: float32, normalized as the demo's."""
    return images.float().div_(255.0).sub_(MEAN).div_(STD)


def make_model(hidden, seed):
    """The demo's MLP: 784 inputs, the --hidden widths, 10 classes, ReLU between layers."""
    torch.manual_seed(seed)
    widths = [28 * 28] + [int(h) for h in hidden.split(",") if h] + [10]
    linears = [torch.nn.Linear(n_in, n_out) for n_in, n_out in zip(widths, widths[1:])]
    layers = [linears[0]]
    for linear in linears[1:]:
        layers += [torch.nn.ReLU(), linear]
    return torch.nn.Sequential(*layers)


def join_process_group(recover_in_place):
    """Joins the job's default group on the backend "ddp": a world of 1 without RANK in
    the environment (no agent). Returns whether this worker recovers in place."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    ddp_torch.init_process_group("ddp", recover_in_place=recover_in_place)
    return ddp_torch.recovers_in_place()


class Run:
    """What a rank trains with: the data, the model, its DDP wrapper, the optimizer, the
    sampler and the counters (step, epoch, position)."""

    def __init__(self, args):
        self.args = args
        self.train_x, self.train_y = load(args.data_dir, "train", args.train_limit)
        self.test_x, self.test_y = load(args.data_dir, "t10k", args.test_limit)
        self.net = make_model(args.hidden, args.seed)
        self.ddp = None  # DistributedDataParallel(self.net) on the current round's group
        self.opt = torch.optim.SGD(self.net.parameters(), lr=args.lr, momentum=args.momentum)
        self.sampler = ddp_torch.ElasticDistributedSampler(self.train_x, shuffle=True,
                                                           seed=args.seed)
        self.counters = {"step": 0, "epoch": 0, "position": 0}

    @property
    def size(self):
        return len(self.train_x)

    def wrap_and_sync(self):
        """Wraps the model in DDP on the current default group, then every rank takes the
        state of the lowest live rank (rank 0's on a fresh start). Returns whether that
        state was live (trained in a process that is still running)."""
        self.ddp = DDP(self.net)
        self.counters = ddp_torch.sync_state(self.net, self.opt, self.counters)
        got = ddp_torch.last_sync()
        rank = dist.get_rank()
        if self.args.step_times:
            say(f"state-sync rank={rank} root={got.root} received={int(got.received)} "
                f"live={int(got.from_live)} bytes={got.bytes} seconds={got.seconds:.6f} "
                f"t={time.monotonic():.6f}")
        if got.received and got.from_live:
            c = self.counters
            say(f"rank {rank}: received the state of rank {got.root} (live): "
                f"{got.bytes / 2**20:.2f} MiB in {got.seconds:.3f} s: epoch {c['epoch'] + 1}, "
                f"position {c['position']}, global step {c['step']}")
        return got.from_live

    def resume_from_checkpoint(self):
        path = self.args.checkpoint
        if not path or not os.path.exists(path):
            return
        ckpt = torch.load(path)
        self.net.load_state_dict(ckpt["model"])
        self.opt.load_state_dict(ckpt["optimizer"])
        self.counters = {k: int(v) for k, v in ckpt["counters"].items()}
        if dist.get_rank() == 0:
            c = self.counters
            say(f"resumed from checkpoint {path}: epoch {c['epoch'] + 1}, position "
                f"{c['position']}, global step {c['step']}")

    def save_checkpoint(self):
        """Rank 0 writes the checkpoint: a temporary file renamed over it."""
        if dist.get_rank() != 0:
            return
        path = self.args.checkpoint
        torch.save({"model": self.net.state_dict(), "optimizer": self.opt.state_dict(),
                    "counters": dict(self.counters)}, path + ".tmp")
        os.replace(path + ".tmp", path)

    def learning_rate(self, global_batch):
        """Cosine decay over the run, a function of the samples trained, times the global
        batch over --lr-batch (the linear scaling rule): a world that shrinks takes more,
        smaller steps, and learns about as much from each sample as before."""
        done = (self.counters["epoch"] + self.counters["position"] / self.size) / self.args.epochs
        scale = global_batch / self.args.lr_batch
        return self.args.lr * scale * 0.5 * (1.0 + math.cos(math.pi * min(done, 1.0)))

    def train_rest_of_epoch(self):
        """The steps left of the epoch in this world, or until --max-steps. Raises
        ddp_torch.GroupChanged when the round ends under a step (not counted)."""
        a, c = self.args, self.counters
        world, rank = dist.get_world_size(), dist.get_rank()
        global_batch = a.batch_size * world
        self.sampler.set_epoch(c["epoch"])
        self.sampler.set_position(c["position"])
        mine = torch.tensor(list(iter(self.sampler)), dtype=torch.int64)
        # Whole global batches only, so that every rank takes as many steps.
        steps = (self.size - c["position"]) // global_batch
        for k in range(steps):
            if a.max_steps and c["step"] >= a.max_steps:
                if a.checkpoint:
                    self.save_checkpoint()
                return
            idx = mine[k * a.batch_size:(k + 1) * a.batch_size]
            for group in self.opt.param_groups:
                group["lr"] = self.learning_rate(global_batch)
            self.opt.zero_grad(set_to_none=True)
            logits = self.ddp(features(self.train_x[idx]))
            loss = torch.nn.functional.cross_entropy(logits, self.train_y[idx])
            loss.backward()  # DDP all-reduces the gradients here
            self.opt.step()
            c["step"] += 1  # the step counts: every counter moves together
            c["position"] += global_batch
            if a.step_times:
                say(f"step-time rank={rank} world={world} global_step={c['step']} "
                    f"t={time.monotonic():.6f}")
            if rank == 0 and (c["step"] % a.log_every == 0 or k + 1 == steps):
                say(f"step={c['step']} world={world} rank={rank} epoch={c['epoch'] + 1} "
                    f"position={c['position']} loss={loss.item():.4f}")
            if a.checkpoint and c["step"] % a.checkpoint_every == 0:
                self.save_checkpoint()
            if a.throttle_ms > 0:
                time.sleep(a.throttle_ms / 1000.0)
        c["epoch"] += 1
        c["position"] = 0
        if a.checkpoint:
            self.save_checkpoint()

    def done(self):
        a, c = self.args, self.counters
        return c["epoch"] >= a.epochs or (a.max_steps > 0 and c["step"] >= a.max_steps)

    def recover(self, why):
        """After the round ended (`why`: what GroupChanged said): joins the next round,
        wraps the model in a new DDP on its group and takes the lowest live rank's state;
        again as long as the membership keeps changing meanwhile. Returns whether that
        state was live."""
        while True:
            self.ddp = None  # its reducer belongs to the round that ended
            try:
                r = ddp_torch.reform()
                live = self.wrap_and_sync()
            except ddp_torch.GroupChanged as e:
                why = str(e)
                continue
            if r.rank == 0:
                say(f"re-formed in place ({r.why or why}): round {r.round}, {r.world_size} ranks "
                    f"(was {r.previous_world_size}) in {r.seconds:.3f} s")
            return live

    def accuracy(self):
        """Test accuracy in percent, this rank alone on the whole test set (no collective)."""
        self.net.eval()
        with torch.no_grad():
            right = (self.net(features(self.test_x)).argmax(1) == self.test_y).sum().item()
        return 100.0 * right / max(len(self.test_y), 1)


def run_or_recover(part, run, in_place):
    """part(), or, when the round ends under it and this worker recovers in place, the
    recovery (`part` is not resumed: the caller's loop goes on from the counters).
    Returns what part() or run.recover() returned."""
    why = None
    try:
        return part()
    except ddp_torch.GroupChanged as e:
        if not in_place:
            raise
        why = str(e)
    # Outside the except block: its traceback no longer holds the old DDP's frames.
    return run.recover(why)


def main(argv):
    args = parse_args(argv)
    torch.set_num_threads(1)
    in_place = join_process_group(not args.no_recover_in_place)
    run = Run(args)
    rank = dist.get_rank()
    if rank == 0:
        say(f"train.py: {dist.get_world_size()} ranks, recovering in place: "
            f"{'yes' if in_place else 'no'}; {run.size} training samples")
    # A live rank's state when there is one (a newcomer, a restarted worker), else the
    # checkpoint when there is one, else rank 0's fresh model.
    live = run_or_recover(run.wrap_and_sync, run, in_place)
    if not live:
        run.resume_from_checkpoint()
    while not run.done():
        run_or_recover(run.train_rest_of_epoch, run, in_place)
    if rank == 0:
        say(f"final test accuracy: {run.accuracy():.2f}% after {run.counters['step']} steps")
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
