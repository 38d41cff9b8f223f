# Reads every variable torchrun gives a worker, checks what a script can rely
# on, and fails on purpose in rank 1 under torch.distributed.elastic's @record,
# which writes the traceback to TORCHELASTIC_ERROR_FILE for the launcher's
# failure report. Each rank writes <out>/rank<RANK>.json first: its whole
# environment and what the ranks agreed on.
# The backend is Gloo, or what DDP_TEST_BACKEND names: with "ddp" (ddprun's own,
# tests/pytorch/matrix.py's ddp cases) the script imports ddp_torch, which registers it.
import json
import os
import sys

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

BACKEND = os.environ.get("DDP_TEST_BACKEND", "gloo")
if BACKEND == "ddp":
    import ddp_torch  # noqa: F401  (registers the backend "ddp")

# What torchrun (torch 1.13) sets in every worker.
TORCHRUN_VARIABLES = [
    "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
    "LOCAL_WORLD_SIZE", "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
    "NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS",
]


def shared_values(env):
    """The values every rank of a one-node job must see alike."""
    names = ["GROUP_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "GROUP_WORLD_SIZE",
             "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
             "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"]
    return {name: env[name] for name in names}


@record
def main():
    out = sys.argv[1]
    env = {name: os.environ.get(name) for name in TORCHRUN_VARIABLES}
    missing = [name for name, value in env.items() if value is None]
    if missing:
        raise RuntimeError(f"torchrun variables missing: {missing}")

    dist.init_process_group(BACKEND)  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank = dist.get_rank()
    assert rank == int(env["RANK"]) and dist.get_world_size() == int(env["WORLD_SIZE"])
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {"rank": rank, "shared": shared_values(env),
                                      "error_file": env["TORCHELASTIC_ERROR_FILE"]})
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "backend": dist.get_backend(), "environ": dict(os.environ),
                   "gathered": everyone}, f)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 1:
        raise ValueError(f"rank {rank}: planned failure (bad batch size 7)")


if __name__ == "__main__":
    main()
