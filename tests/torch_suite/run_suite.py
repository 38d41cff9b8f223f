#!/usr/bin/python3
"""Runs torch 1.13's own distributed test suite (torch.testing._internal.
distributed.distributed_test, as torch's test/distributed/test_distributed_spawn.py
runs it) against one backend, and records or checks which tests pass.

  run_suite.py --backend gloo [--world-size 2] [--only NAME ...]
      runs the suite (or the named tests) and prints one line a test and a summary
  run_suite.py --backend gloo --write-passing passing_on_gloo.txt
      also writes the names of the tests that passed, sorted, to the file
  run_suite.py --backend ddp --gates-as gloo --check passing_on_gloo.txt \
               --exclusions excluded_on_ddp.txt
      runs every test the list names but the excluded ones, the suite choosing
      its tests as for Gloo; exits 1 unless each passes, and when an exclusion
      names a test that is not on the list
  --results FILE   writes every test's outcome and reason as JSON

The backend is set up as torch's driver sets it up: BACKEND, WORLD_SIZE,
TEMP_DIR and INIT_METHOD in the environment before the suite's module is
imported, each test spawning WORLD_SIZE ranks that meet through a file store.
A backend that is not torch's own is registered by importing its module
(--backend-module, ddp_torch for "ddp") in the driver and in every rank, and
joins the suite's feature sets (--features; see suite_cases.py). Exits 77
(skipped) when torch or that module cannot be imported.
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
import unittest

SKIPPED = 77
TORCH_BACKENDS = ("gloo", "nccl", "mpi", "ucc")
# The suite's feature sets gloo is in on a CPU machine (DistTestCases in
# torch.testing._internal.common_distributed): another backend claims the same
# features by default, so that it runs every test gloo runs; "plugin" makes the
# suite treat it as available and pair it with gloo where a test wants a
# second backend.
PLUGIN_FEATURES = "gpu,cuda,ddp,subgroup,plugin"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--world-size", type=int, default=2,
                        help="ranks a test spawns (torch's run_test.py uses 3 on a CPU-only machine)")
    parser.add_argument("--init-method", choices=("env", "file"), default="file",
                        help="INIT_METHOD when the suite is imported: env:// or file:// (torch's "
                             "run_test.py runs the suite once with each); it only decides "
                             "whether the barrier timeout tests, which need file://, run")
    parser.add_argument("--start-method", choices=("spawn", "forkserver"), default="forkserver",
                        help="how a test's ranks start: spawn (torch's driver; a fresh interpreter "
                             "imports torch for each rank of each test) or forkserver (forked "
                             "from one process that imported torch, the suite and the backend)")
    parser.add_argument("--replicated-tensor-ddp", action="store_true",
                        help="let each rank turn on DDP's ReplicatedTensor mode as torch's "
                             "TestDistBackend does (under Python 3.11 every DDP test then fails "
                             "on every backend: see suite_cases.py)")
    parser.add_argument("--gates-as", metavar="NAME", default="",
                        help="let the suite choose its tests as for this backend (its decorators "
                             "skip many by backend name: 'Only gloo backend supports timeouts'), "
                             "and run them on --backend; see suite_cases.py")
    parser.add_argument("--backend-module",
                        help="module that registers the backend (default: ddp_torch for ddp, "
                             "none for torch's own backends)")
    parser.add_argument("--features",
                        help=f"suite feature sets the backend joins (default: none for torch's "
                             f"own backends, {PLUGIN_FEATURES} for others)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these tests")
    parser.add_argument("--write-passing", metavar="FILE")
    parser.add_argument("--check", metavar="LIST")
    parser.add_argument("--exclusions", metavar="FILE")
    parser.add_argument("--results", metavar="FILE")
    parser.add_argument("--test-timeout", type=int, default=300,
                        help="seconds a test's ranks may run before they are killed (torch's default: 300)")
    args = parser.parse_args(argv)
    if args.exclusions and not args.check:
        parser.error("--exclusions goes with --check")
    if args.backend_module is None:
        args.backend_module = "ddp_torch" if args.backend == "ddp" else ""
    if args.features is None:
        args.features = "" if args.backend in TORCH_BACKENDS else PLUGIN_FEATURES
    return args


def read_names(path):
    """The test names of a list file: one a line; '#' starts a comment."""
    names = []
    with open(path) as f:
        for line in f:
            name = line.split("#", 1)[0].strip()
            if name:
                names.append(name)
    return names


def read_exclusions(path):
    """{test name: reason} of an exclusion file: 'name  # reason' a line; a
    reason is required."""
    exclusions = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            name, _, reason = line.partition("#")
            if not reason.strip():
                raise SystemExit(f"{path}:{number}: '{name.strip()}' has no reason (name  # reason)")
            exclusions[name.strip()] = reason.strip()
    return exclusions


def set_up_environment(args, temp_dir):
    """The environment torch's suite reads at import and each rank inherits."""
    os.environ["BACKEND"] = args.backend
    os.environ["WORLD_SIZE"] = str(args.world_size)
    os.environ["TEMP_DIR"] = temp_dir
    # Everything the suite and multiprocessing make in the temporary folder
    # goes under the driver's own, removed at the end: torch's
    # MultiProcessTestCase leaves its store file of every test, and the
    # forkserver's socket folder outlives a driver that leaves with os._exit.
    os.environ["TMPDIR"] = temp_dir
    tempfile.tempdir = temp_dir
    os.environ["INIT_METHOD"] = "env://" if args.init_method == "env" else f"file://{temp_dir}/"
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(args.test_timeout)
    os.environ["TORCH_SUITE_BACKEND_MODULE"] = args.backend_module
    os.environ["TORCH_SUITE_BACKEND_FEATURES"] = args.features
    os.environ["TORCH_SUITE_START_METHOD"] = args.start_method
    os.environ["TORCH_SUITE_GATES_AS"] = args.gates_as
    os.environ["TORCH_SUITE_REPLICATED_TENSOR_DDP"] = "1" if args.replicated_tensor_ddp else "0"
    # The forkserver imports suite_cases by name, and Python 3.11's forkserver
    # does not take the driver's sys.path (it takes the environment).
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    for folder in ("barrier", "test_dir"):
        os.mkdir(os.path.join(temp_dir, folder))


class OutcomeRecorder(unittest.TextTestResult):
    """Keeps each test's outcome, reason and time, and prints one line a test."""

    def __init__(self, stream, descriptions, verbosity):
        super().__init__(stream, descriptions, 0)
        self.outcomes = {}
        self._started = 0.0

    def startTest(self, test):
        self._started = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome, reason=""):
        name = test.id().rsplit(".", 1)[-1]
        seconds = time.monotonic() - self._started
        self.outcomes[name] = {"outcome": outcome, "reason": reason, "seconds": round(seconds, 2)}
        line = summary_line(reason)
        print(f"{outcome:7} {name} ({seconds:.1f} s){'  ' + line[:200] if line else ''}", flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "xfail")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "xpass")


def select_tests(args):
    """(the tests to run, the list checked or None, the exclusions): with
    --check, the listed tests but the excluded ones (of those, only the ones
    --only names, if given); else the tests --only names, or [] for all."""
    if not args.check:
        return list(args.only or []), None, {}
    expected = read_names(args.check)
    exclusions = read_exclusions(args.exclusions) if args.exclusions else {}
    names = [name for name in expected if name not in exclusions]
    if args.only:
        names = [name for name in names if name in args.only]
    return names, expected, exclusions


def summary_line(reason):
    """The line of a test's traceback that says what went wrong: the last
    exception line (a rank's error comes with torch's C++ frames after it),
    else the last line."""
    lines = [line.strip() for line in reason.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Timeout)\w*: ", line):
            return line
    return lines[-1] if lines else ""


def suite_test_names(case_class):
    return sorted(unittest.TestLoader().getTestCaseNames(case_class))


def run(args):
    # torch's test utilities parse sys.argv when imported, and each spawned
    # rank receives the driver's: they see none of the driver's options.
    sys.argv = sys.argv[:1]
    try:
        import torch  # noqa: F401
    except ImportError as error:
        print(f"skipped: {sys.executable} cannot import torch ({error}); scripts/setup installs "
              f"python3-torch")
        return SKIPPED
    try:
        import suite_cases
    except ImportError as error:
        # Only the backend's module missing is a skip: a module it fails to
        # import (its extension, say) is an error.
        if args.backend_module and getattr(error, "name", None) == args.backend_module:
            print(f"skipped: the module {args.backend_module} that registers the backend "
                  f"'{args.backend}' cannot be imported ({error}); build it, or put its folder "
                  f"on PYTHONPATH")
            return SKIPPED
        raise
    case_class = suite_cases.TorchDistributedSuite
    known = suite_test_names(case_class)

    names, expected, exclusions = select_tests(args)
    unknown = [name for name in names + list(exclusions) if name not in known]
    if unknown:
        print(f"not tests of torch's suite: {' '.join(unknown)}")
        return 2
    if not args.check and not args.only:
        names = known

    suite = unittest.TestSuite(case_class(name) for name in names)
    runner = unittest.TextTestRunner(stream=sys.stderr, resultclass=OutcomeRecorder, verbosity=0)
    started = time.monotonic()
    result = runner.run(suite)
    wall = time.monotonic() - started

    outcomes = result.outcomes
    counts = {key: sum(1 for o in outcomes.values() if o["outcome"] == key)
              for key in ("pass", "fail", "error", "skip", "xfail", "xpass")}
    print(f"torch_suite backend={args.backend} world_size={args.world_size} "
          f"init_method={args.init_method} start_method={args.start_method} "
          f"replicated_tensor_ddp={int(args.replicated_tensor_ddp)} "
          f"gates_as={args.gates_as or args.backend} "
          f"tests={len(outcomes)} passed={counts['pass']} "
          f"failed={counts['fail']} errors={counts['error']} skipped={counts['skip']} "
          f"wall_s={wall:.0f}", flush=True)

    if args.results:
        with open(args.results, "w") as f:
            json.dump(outcomes, f, indent=1, sort_keys=True)
    if args.write_passing:
        write_passing(args, outcomes)
    if expected is not None:
        return check(args, names, expected, exclusions, outcomes)
    return 0


def write_passing(args, outcomes):
    import torch
    passing = sorted(name for name, o in outcomes.items() if o["outcome"] == "pass")
    with open(args.write_passing, "w") as f:
        f.write(f"# The tests of torch {torch.__version__}'s distributed suite that pass on "
                f"'{args.backend}' at world size {args.world_size} on a CPU-only machine.\n"
                f"# Written by: tests/torch_suite/run_suite.py --backend {args.backend} "
                f"--world-size {args.world_size} --init-method {args.init_method} "
                f"--start-method {args.start_method}"
                f"{' --replicated-tensor-ddp' if args.replicated_tensor_ddp else ''} "
                f"--write-passing <this file>\n")
        f.writelines(f"{name}\n" for name in passing)


def check(args, names, expected, exclusions, outcomes):
    """1 unless every test of `names` (the listed tests that ran) passed, and
    every exclusion names a listed test."""
    stale = sorted(name for name in exclusions if name not in expected)
    not_passing = sorted(name for name in names
                         if outcomes.get(name, {}).get("outcome") != "pass")
    for name in stale:
        print(f"stale exclusion: {name} is not on {args.check}; remove it from {args.exclusions}")
    for name in not_passing:
        o = outcomes.get(name, {"outcome": "not run", "reason": ""})
        print(f"NOT PASSING on {args.backend}: {name}: {o['outcome']} "
              f"{summary_line(o['reason'])[:300]}")
    if stale or not_passing:
        return 1
    excluded = f", {len(exclusions)} excluded with reasons in {args.exclusions}" if exclusions else ""
    print(f"every test of {args.check} that ran passed on {args.backend} ({len(names)} run"
          f"{excluded})")
    return 0


def main(argv):
    args = parse_args(argv)
    temp_dir = tempfile.mkdtemp(prefix="torch_suite_")
    try:
        set_up_environment(args, temp_dir)
        code = run(args)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # torch 1.13 can deadlock at exit in ~ProcessGroupGloo; nothing is left to tear down.
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
