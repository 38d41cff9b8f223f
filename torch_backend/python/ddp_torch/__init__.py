"""The torch.distributed backend "ddp": torch's collectives on ddprun's worker library.

    import ddp_torch                       # registers the backend
    torch.distributed.init_process_group("ddp")

ddprun puts this package on its workers' PYTHONPATH; under torchrun, add
<ddprun prefix>/lib/ddprun/python to PYTHONPATH.
"""

import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed as _dist

from ddp_torch import _C, recovery, steps
from ddp_torch.recovery import GroupChanged, Reformed, init_process_group, recovers_in_place, reform
from ddp_torch.sampler import ElasticDistributedSampler
from ddp_torch.state import SyncInfo, last_sync, sync_state

BACKEND = "ddp"


def _register():
    # A second import (another name for the same folder, importlib.reload)
    # finds the backend already registered: torch refuses a second creator.
    if BACKEND.upper() not in _dist.Backend._plugins:
        _dist.Backend.register_backend(BACKEND, _C.create_process_group)


_register()
steps.install()
recovery._install()

__all__ = ["BACKEND", "GroupChanged", "Reformed", "init_process_group", "recovers_in_place", "reform",
           "ElasticDistributedSampler", "SyncInfo", "last_sync", "sync_state"]
