"""torch 1.13's own distributed test suite, bound to one backend.

Importing this module builds the test class from the environment, as torch's
suite expects it to be set before its module is imported:

  BACKEND          the backend name given to init_process_group ("gloo", "ddp", ...)
  WORLD_SIZE       the number of ranks each test spawns
  TEMP_DIR         a folder for the suite's file barrier (each test makes its own)
  TORCH_SUITE_BACKEND_MODULE
                   a module to import first, in the driver and in every spawned
                   rank, that registers BACKEND with torch (ddp_torch for "ddp");
                   empty for torch's built-in backends
  TORCH_SUITE_START_METHOD
                   how each rank's process starts: "spawn" (torch's driver: a
                   fresh interpreter that imports torch and this module, seconds
                   a rank) or "forkserver" (forked from a server process that
                   imported them once, and nothing else: no thread, no process
                   group, no test state)
  TORCH_SUITE_REPLICATED_TENSOR_DDP
                   "1": keep what torch's TestDistBackend._run does in each rank,
                   turning on DDP's experimental ReplicatedTensor mode; anything
                   else: DDP stays in its default mode, the one users run. The
                   mode imports torch.distributed._shard, which torch 1.13 cannot
                   import under Python 3.11 (a dataclass field with a mutable
                   default, refused since 3.11): with it on, every DDP test of the
                   suite fails on every backend before it communicates.
  TORCH_SUITE_VERBOSE
                   "1": keep the suite's INFO log (each rank's start and barriers)
  TORCH_SUITE_GATES_AS
                   a backend name, or empty: the suite's module is imported with
                   BACKEND set to it, so that its decorators, which pick the tests
                   to run by backend name ("Only gloo backend supports timeouts",
                   require_backend({"gloo"}), ...), pick the tests they pick for
                   that backend; then the module's BACKEND becomes the real one,
                   which init_process_group and the test bodies use. With "gloo",
                   a plugin backend runs every test Gloo runs.
  TORCH_SUITE_BACKEND_FEATURES
                   the suite's feature sets (DistTestCases.backend_feature in
                   torch.testing._internal.common_distributed) that BACKEND
                   joins, comma-separated: the suite runs a test gated on a
                   feature only for the backends in its set. torch's own
                   backends are in theirs already.

The driver (run_suite.py) sets these and imports this module; torch's
multiprocessing spawn re-imports it by name in every rank, with the same
environment, so each rank registers the backend before init_process_group.
"""

import importlib
import logging
import os
import sys

# torch's test utilities import expecttest, which Debian does not ship: the
# stand-in (stand_ins/expecttest.py says what the suite needs of it) is used
# only when the package is missing. Spawned ranks inherit sys.path.
try:
    import expecttest  # noqa: F401
except ImportError:
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "stand_ins"))

_backend_module = os.environ.get("TORCH_SUITE_BACKEND_MODULE", "")
if _backend_module:
    importlib.import_module(_backend_module)

from torch.nn.parallel import _replicated_tensor_ddp_utils  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402


def _keep_default_ddp_mode(requested):
    """Stands for torch's _set_ddp_with_replicated_tensor, which each rank's
    TestDistBackend._run calls with True: DDP keeps its default mode."""
    _replicated_tensor_ddp_utils._set_ddp_with_replicated_tensor_of_torch(False)


if os.environ.get("TORCH_SUITE_REPLICATED_TENSOR_DDP") != "1":
    if not hasattr(_replicated_tensor_ddp_utils, "_set_ddp_with_replicated_tensor_of_torch"):
        _replicated_tensor_ddp_utils._set_ddp_with_replicated_tensor_of_torch = (
            _replicated_tensor_ddp_utils._set_ddp_with_replicated_tensor)
    _replicated_tensor_ddp_utils._set_ddp_with_replicated_tensor = _keep_default_ddp_mode

# The suite reads these sets in its decorators, when its module is imported
# below: a plugin backend joins them before that.
for _feature in filter(None, os.environ.get("TORCH_SUITE_BACKEND_FEATURES", "").split(",")):
    if _feature not in DistTestCases.backend_feature:
        raise RuntimeError(
            f"TORCH_SUITE_BACKEND_FEATURES: unknown feature '{_feature}' "
            f"(torch's suite knows {sorted(DistTestCases.backend_feature)})")
    DistTestCases.backend_feature[_feature].add(os.environ["BACKEND"])

import multiprocessing.context  # noqa: E402

import torch.multiprocessing  # noqa: E402

# The suite's decorators read BACKEND once, on import; init_process_group and
# the test bodies read the module's BACKEND when they run.
_backend = os.environ["BACKEND"]
_gates_as = os.environ.get("TORCH_SUITE_GATES_AS", "")
if _gates_as:
    os.environ["BACKEND"] = _gates_as
from torch.testing._internal.distributed import distributed_test  # noqa: E402

os.environ["BACKEND"] = _backend
distributed_test.BACKEND = _backend

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

# torch's common_distributed logs every rank's start and barrier at INFO; a
# rank's exception is logged at ERROR and reaches the parent's report anyway.
if os.environ.get("TORCH_SUITE_VERBOSE") != "1":
    logging.getLogger().setLevel(logging.WARNING)


class TorchDistributedSuite(TestDistBackend, DistributedTest._DistTestBase):
    """Every test of torch's suite; each spawns WORLD_SIZE ranks on BACKEND,
    which run the test and report to this process (MultiProcessTestCase)."""

    def setUp(self):
        super().setUp()
        method = os.environ.get("TORCH_SUITE_START_METHOD", "spawn")
        if method == "spawn":
            self._spawn_processes()
        else:
            self._start_processes(_forkserver_process())


def _forkserver_process():
    """The Process class of a forkserver context whose server has imported
    this module (and so torch, the suite and the backend's module)."""
    context = torch.multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return RankWithTestEnvironment


class RankWithTestEnvironment(multiprocessing.context.ForkServerProcess):
    """A rank forked from the server, run in the environment its test gave it:
    each test's setUp makes its own TEMP_DIR and INIT_METHOD (torch's
    initialize_temp_directories), which a spawned rank inherits and reads on
    import, while the server kept the driver's. The environment is taken when
    the rank is created and set, with the suite's INIT_METHOD, before it runs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._test_environment = dict(os.environ)

    def run(self):
        os.environ.clear()
        os.environ.update(self._test_environment)
        distributed_test.INIT_METHOD = os.environ.get("INIT_METHOD", "env://")
        super().run()
