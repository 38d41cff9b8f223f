"""DDP steps of an unmodified torch DistributedDataParallel model reach ddprun (2 ranks).

    steps.py <status port>     run by driver.py under ddprun --status_port=<port>

Each rank takes 8 synchronized steps, 3 steps under no_sync() and 2 forward passes
under torch.no_grad(); rank 1 computes 40 ms longer per step. Rank 0 then reads
ddprun's /status until both ranks show their steps, and checks: 8 synchronized
steps each (no_sync and no_grad passes are not counted as such), a step time and a
compute time on both, rank 1's compute longer than rank 0's by most of its 40 ms,
and rank 1 the slower in the straggler scores. Each rank prints "rank <r>: ok".
"""
import json
import sys
import time
import urllib.request

import torch
import torch.distributed as dist
import ddp_torch  # noqa: F401
import rank_main
from torch.nn.parallel import DistributedDataParallel as DDP

SYNCED, NO_SYNC, EXTRA_MS = 8, 3, 40


def status(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as reply:
        return json.load(reply)


def ranks_when_counted(port, deadline_s=30):
    """ddprun's view of the ranks once both show SYNCED steps (it publishes periodically)."""
    end = time.monotonic() + deadline_s
    ranks = []
    while time.monotonic() < end:
        ranks = status(port).get("ranks", [])
        if len(ranks) == 2 and all(r["steps"] >= SYNCED for r in ranks):
            return {r["rank"]: r for r in ranks}
        time.sleep(0.2)
    raise AssertionError(f"ddprun's /status never showed {SYNCED} steps on both ranks: {ranks}")


def main():
    port = int(sys.argv[1])
    dist.init_process_group("ddp")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(16, 64)
    for _ in range(SYNCED):
        if rank == 1:
            time.sleep(EXTRA_MS / 1000)  # "compute": before the backward asks for its gradients
        opt.zero_grad()
        model(data).sum().backward()
        opt.step()
    with model.no_sync():
        for _ in range(NO_SYNC):
            model(data).sum().backward()
    with torch.no_grad():
        model(data)
        model(data)
    dist.barrier()
    if rank == 0:
        ranks = ranks_when_counted(port)
        time.sleep(1.5)  # the no_sync and no_grad passes had their chance to be counted
        ranks = {r["rank"]: r for r in status(port)["ranks"]}
        for r in (0, 1):
            assert ranks[r]["steps"] == SYNCED, f"rank {r}: {ranks[r]['steps']} steps, not {SYNCED}"
            assert ranks[r]["step_time_s"] and ranks[r]["compute_s"], ranks[r]
        slower = ranks[1]["compute_s"] - ranks[0]["compute_s"]
        assert slower > 0.6 * EXTRA_MS / 1000, f"rank 1 computes only {slower * 1000:.1f} ms longer: {ranks}"
        assert ranks[1]["straggler_score"] < ranks[0]["straggler_score"], ranks
    dist.barrier()
    print(f"rank {rank}: ok", flush=True)


if __name__ == "__main__":
    rank_main.run(main)
