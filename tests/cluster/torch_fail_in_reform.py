"""Runs a training script with ddp_torch.reform() made to fail once on one node: the
worker of the node named in MARKER (a file holding the node's number, read at each
re-form) completes the re-form, says so, removes MARKER and exits 3 before it syncs.
Its peers wait in that round's collectives; ddprun must fall back to a restart.

    torch_fail_in_reform.py MARKER SCRIPT ARGS...

The node is the worker's DDP_CLUSTER_NODE (scripts/cluster sets it in every node).
"""
import os
import runpy
import sys

import ddp_torch

marker = sys.argv[1]
real_reform = ddp_torch.reform


def reform_then_fail_on_the_marked_node():
    got = real_reform()
    try:
        with open(marker) as f:
            node = f.read().strip()
    except FileNotFoundError:
        return got
    if node != os.environ.get("DDP_CLUSTER_NODE"):
        return got
    os.remove(marker)
    print(f"torch_fail_in_reform: rank {got.rank} fails during the re-form (round {got.round})",
          flush=True)
    os._exit(3)


ddp_torch.reform = reform_then_fail_on_the_marked_node
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
