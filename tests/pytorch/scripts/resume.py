# Resumes from its own checkpoint after a restart, as torchrun users write it:
# rank 0 checkpoints after every step (written aside, then renamed into place,
# so a crash never leaves half a file), and every rank starts from the last
# checkpoint. On the first attempt (TORCHELASTIC_RESTART_COUNT=0) rank 1 fails
# on purpose after --fail-after steps; the launcher's --max_restarts=1 restarts
# the job, which must end with what an uninterrupted run computes.
#
# Each rank appends one line per attempt to <out>/rank<RANK>.attempts and writes
# its final state to <out>/rank<RANK>.json.
# The backend is Gloo, or what DDP_TEST_BACKEND names: with "ddp" (ddprun's own,
# tests/pytorch/matrix.py's ddp cases) the script imports ddp_torch, which registers it.
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

BACKEND = os.environ.get("DDP_TEST_BACKEND", "gloo")
if BACKEND == "ddp":
    import ddp_torch  # noqa: F401  (registers the backend "ddp")

PLANNED_EXIT_CODE = 3


def load_checkpoint(path):
    if not os.path.exists(path):
        return 0, torch.zeros(4, dtype=torch.float64)
    state = torch.load(path)
    return state["step"], state["w"]


def save_checkpoint(path, step, w):
    tmp = path + ".tmp"
    torch.save({"step": step, "w": w}, tmp)
    os.replace(tmp, path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--fail-after", type=int, default=3)
    args = parser.parse_args()

    restart_count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group(BACKEND)
    rank = dist.get_rank()
    start, w = load_checkpoint(args.checkpoint)
    with open(os.path.join(args.out, f"rank{rank}.attempts"), "a") as f:
        f.write(json.dumps({"restart_count": restart_count, "start_step": start}) + "\n")

    for step in range(start, args.steps):
        g = torch.arange(4, dtype=torch.float64) * (rank + 1) + step
        dist.all_reduce(g)
        w = torch.add(w * 0.5, g * 0.1)
        if rank == 0:
            save_checkpoint(args.checkpoint, step + 1, w)
        dist.barrier()
        if restart_count == 0 and step + 1 == args.fail_after and rank == 1:
            print(f"rank {rank}: planned failure after step {step + 1}", file=sys.stderr)
            sys.exit(PLANNED_EXIT_CODE)

    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "backend": dist.get_backend(), "w": w.tolist(),
                   "restart_count": restart_count,
                   "max_restarts": os.environ["TORCHELASTIC_MAX_RESTARTS"]}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
