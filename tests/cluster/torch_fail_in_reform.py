"""Runs a training script with ddp_torch.reform() made to fail once on chosen nodes: the
worker of a node whose file MARKER.<node> exists says so, removes the file and exits 3
instead of re-forming (a kept worker that cannot re-form). ddprun must fall back to a
restart of that node's worker.

    torch_fail_in_reform.py MARKER SCRIPT ARGS...

The node is the worker's DDP_CLUSTER_NODE (scripts/cluster sets it in every node).
"""
import os
import runpy
import sys

import ddp_torch

marker = f"{sys.argv[1]}.{os.environ.get('DDP_CLUSTER_NODE', 'x')}"
real_reform = ddp_torch.reform


def fail_on_a_marked_node_else_reform():
    try:
        os.remove(marker)
    except FileNotFoundError:
        return real_reform()
    print(f"torch_fail_in_reform: rank {os.environ.get('RANK')} fails during the re-form",
          flush=True)
    os._exit(3)


ddp_torch.reform = fail_on_a_marked_node_else_reform
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
