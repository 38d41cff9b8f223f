"""One case of the PyTorch matrix: an unmodified torchrun script (scripts/) run
under ddprun and under torchrun with the same flags, each run checked on its own
and then against the other.

    matrix.py CASE [BACKEND]   CASE: ddp_train, env_record, module, no_python, resume
                               BACKEND: gloo (the default) or ddp (ddp_train,
                               env_record and resume only)

The scripts that communicate take their backend from DDP_TEST_BACKEND, which
this driver sets to BACKEND in both launchers' environments. With "ddp" (the
backend of ddp_torch, which the scripts then import) the workers must find
ddp_torch: under ddprun through the PYTHONPATH ddprun itself gives them (the
driver's own PYTHONPATH is not passed on), under torchrun through PYTHONPATH
set here to the build's package folder, <build>/lib/ddprun/python, the build
being the parent of $DDP_BUILD_BIN. Everything checked on gloo is checked on
ddp.

ddprun is $DDP_BUILD_BIN/ddprun; torchrun is run_torchrun.py (python3 -m
torch.distributed.run, with a fix for torch 1.13 under Python 3.11). Both run
the scripts with /usr/bin/python3 (PYTHON_EXEC), with --nproc_per_node=2
--monitor_interval=0.1 (torchrun polls its workers every monitor interval, 5 s
by default; ddprun accepts and ignores it), from a copy of scripts/ in a
temporary directory (also their TMPDIR), removed at the end. ddprun runs with
--standalone; torchrun with what its --standalone means, but on a free port:
torch 1.13's --standalone always serves the rendezvous on port 29400, so two
torchrun jobs at once (ctest -j) would meet in one store.

Exit code: 0 when both launchers give the expected and the same outcome, 1
otherwise (the problems and both launchers' output are printed), 2 for a bad
command line, 77 (skipped) when /usr/bin/python3 has no torch, or, with
BACKEND ddp, when the build has no ddp_torch.
"""
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
PYTHON = "/usr/bin/python3"
LAUNCHERS = ("ddprun", "torchrun")
NPROC = 2
COMMON_FLAGS = [f"--nproc_per_node={NPROC}", "--monitor_interval=0.1"]
# Generous: a run takes seconds; these only bound a hang on a loaded machine.
RUN_TIMEOUT_S = 120
STOP_GRACE_S = 15
LEFTOVER_GRACE_S = 5
BACKENDS = ("gloo", "ddp")
# The cases whose scripts take their backend from DDP_TEST_BACKEND.
BACKEND_CASES = ("ddp_train", "env_record", "resume")


def standalone_flags(launcher):
    """One node, a store of its own on a free port, a fresh run id."""
    if launcher == "ddprun":
        return ["--standalone"]
    return ["--nnodes=1", "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0",
            f"--rdzv_id={uuid.uuid4()}"]


def expected_worker_env(rank):
    """What torchrun (torch 1.13) sets in every worker, with the value worker
    `rank` of a one-node job of NPROC workers must see (None: checked apart)."""
    return {
        "LOCAL_RANK": str(rank), "RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(NPROC), "WORLD_SIZE": str(NPROC),
        "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(NPROC),
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "False", "NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": None, "MASTER_PORT": None, "TORCHELASTIC_RUN_ID": None,
        "TORCHELASTIC_ERROR_FILE": None,
    }


TORCHRUN_VARIABLES = set(expected_worker_env(0))
# Values that differ between any two runs (addresses, ports, random ids, paths).
PER_RUN_VARIABLES = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}
# ddprun's own additions (docs/using.md, "What every worker gets"): the store for
# its worker library (DDP_STORE_TOKEN only with an authenticated store), the
# progress page, the control channel of in-place recovery, faulthandler for
# a hung Python worker's tracebacks, PYTHONPATH with the folder of ddp_torch
# (in a build with the torch backend), and TORCH_NCCL_ASYNC_ERROR_HANDLING (torch
# 2.x's name for NCCL_ASYNC_ERROR_HANDLING, which 2.x's torchrun sets).
DDPRUN_OWN_VARIABLES = {"DDP_STORE_ADDR", "DDP_STORE_PORT", "DDP_STORE_PREFIX", "DDP_PROGRESS_FD",
                        "DDP_CONTROL_FD", "DDP_CHANGE_GRACE_MS", "PYTHONFAULTHANDLER", "PYTHONPATH",
                        "TORCH_NCCL_ASYNC_ERROR_HANDLING", "DDP_JOB_RESTART_COUNT",
                        "DDP_MEMBERSHIP_CHANGES"}


# ---------------------------------------------------------------- processes

def session_members(session_id):
    """Pids of the live (not zombie) processes of a session."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # After "(comm)": state ppid pgrp session ...
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == session_id and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def wait_for_empty_session(session_id, seconds):
    """Whether the session has no live process within `seconds`."""
    deadline = time.monotonic() + seconds
    while session_members(session_id):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stop_session(session_id):
    """SIGTERM, then SIGKILL after STOP_GRACE_S, to every process of a session."""
    for signo in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_members(session_id):
            try:
                os.kill(pid, signo)
            except ProcessLookupError:
                pass
        if wait_for_empty_session(session_id, STOP_GRACE_S):
            return


# Sessions (launchers) this driver started and has not seen end.
_live_sessions = set()


@dataclass
class Run:
    launcher: str
    argv: list
    env: dict
    code: int | None  # 128 + signal when killed by a signal; None: timed out
    stdout: str
    stderr: str
    seconds: float
    out: Path  # where the ranks wrote their results
    leftovers: list  # processes of the launcher's session alive after it exited

    def rank_results(self, checks, suffix=".json", parse=json.loads):
        """{rank: parsed <out>/rank<rank><suffix>}; a missing file is a problem."""
        results = {}
        for rank in range(NPROC):
            path = self.out / f"rank{rank}{suffix}"
            if checks.expect(path.is_file(), f"rank {rank} wrote no {path.name}"):
                results[rank] = parse(path.read_text())
        return results


def launcher_env(work):
    """The driver's environment without what a launcher sets, plus the
    interpreter (PYTHON_EXEC, which torchrun honours too) and a private TMPDIR
    (both launchers' log directories land there)."""
    env = {name: value for name, value in os.environ.items()
           if name not in TORCHRUN_VARIABLES
           and not name.startswith(("PET_", "TORCHELASTIC_", "DDP_STORE_"))}
    env.update(PYTHON_EXEC=PYTHON, TMPDIR=str(work / "tmp"), PYTHONDONTWRITEBYTECODE="1")
    return env


def ddp_torch_folder(ddprun):
    """The build's folder of the package ddp_torch (<build>/lib/ddprun/python)."""
    return Path(ddprun).parent.parent / "lib" / "ddprun" / "python"


def backend_env(env, launcher, backend, ddprun):
    """DDP_TEST_BACKEND for the scripts, and with "ddp" where they find ddp_torch:
    under ddprun only through the PYTHONPATH ddprun adds, under torchrun through
    PYTHONPATH set to the build's package folder, as a torchrun user sets it."""
    env["DDP_TEST_BACKEND"] = backend
    if backend == "ddp":
        env.pop("PYTHONPATH", None)
        if launcher == "torchrun":
            env["PYTHONPATH"] = str(ddp_torch_folder(ddprun))
    return env


def run_launcher(launcher, case, work, ddprun, backend="gloo"):
    out = work / launcher / "out"
    state = work / launcher / "state"
    out.mkdir(parents=True)
    state.mkdir()
    prefix = [str(ddprun)] if launcher == "ddprun" else [PYTHON, str(HERE / "run_torchrun.py")]
    argv = prefix + standalone_flags(launcher) + COMMON_FLAGS + case.flags + case.program(out, state)
    env = backend_env(launcher_env(work), launcher, backend, ddprun)
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=work / "src", env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    _live_sessions.add(proc.pid)
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    except subprocess.TimeoutExpired:
        stop_session(proc.pid)
        stdout, stderr = proc.communicate()
        code = None
    seconds = time.monotonic() - start
    leftovers = [] if wait_for_empty_session(proc.pid, LEFTOVER_GRACE_S) else session_members(proc.pid)
    stop_session(proc.pid)
    _live_sessions.discard(proc.pid)
    return Run(launcher, argv, env, code, stdout, stderr, seconds, out, leftovers)


# ---------------------------------------------------------------- checks

@dataclass
class Checks:
    problems: list = field(default_factory=list)
    scope: str = ""

    def expect(self, ok, what):
        if not ok:
            self.problems.append(f"{self.scope}{what}")
        return ok

    def about(self, scope):
        """Checks adding to the same problem list, each problem prefixed by `scope`."""
        return Checks(self.problems, f"{scope}: ")


def close(a, b, tolerance):
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, tolerance) for x, y in zip(a, b))
    return math.isclose(a, b, rel_tol=0, abs_tol=tolerance)


def is_loopback(host):
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        return False
    return bool(addresses) and all(a.startswith("127.") or a == "::1" for a in addresses)


def failure_report(stderr, title):
    """The torchrun-format report titled "<title> FAILED" in `stderr`, from
    border to border, or None."""
    lines = stderr.splitlines()
    try:
        start = lines.index(f"{title} FAILED") - 1
    except ValueError:
        return None
    if start < 0 or not lines[start] or set(lines[start]) != {"="}:
        return None
    border = lines[start]
    for end in range(start + 1, len(lines)):
        if lines[end] == border:
            return "\n".join(lines[start:end + 1])
    return None


def normalized_report(report):
    """The report without what differs between any two runs: times, host, pids,
    the log directory (and the border widths, which follow its length)."""
    text = re.sub(r"(?m)^(  time      : ).*$", r"\1<time>", report)
    text = re.sub(r"(?m)^(  host      : ).*$", r"\1<host>", text)
    text = re.sub(r"\(pid: \d+\)", "(pid: <pid>)", text)
    text = re.sub(r"(?m)^(  error_file: ).*(/attempt_\d+/\d+/error\.json)$", r"\1<log dir>\2", text)
    return re.sub(r"(?m)^(=+|-+)$", "<border>", text)


def expect_exit(run, checks, expected):
    checks.expect(run.code == expected, f"exit code {run.code}, expected {expected}")


def launcher_added_env(run, environ):
    """The worker's variables its launcher added to the environment it was given."""
    return {name: value for name, value in environ.items() if name not in run.env}


# ---------------------------------------------------------------- the cases

@dataclass
class Case:
    what: str
    flags: list
    # (out dir, state dir) -> the program and its arguments, as typed after the flags
    program: Callable
    # Checks one launcher's run.
    check: Callable
    # Checks that both launchers' runs agree (ddprun's, torchrun's).
    compare: Callable


# ---- ddp_train: DistributedSampler + DataLoader + set_epoch under DDP

SAMPLES = 24
EPOCHS = 2


def check_ddp_train(run, checks):
    expect_exit(run, checks, 0)
    ranks = run.rank_results(checks)
    if len(ranks) != NPROC:
        return
    for epoch in range(EPOCHS):
        slices = [ranks[rank]["seen"][epoch] for rank in range(NPROC)]
        checks.expect(all(len(s) == SAMPLES // NPROC for s in slices),
                      f"epoch {epoch}: slice sizes {[len(s) for s in slices]}, expected {SAMPLES // NPROC}")
        checks.expect(not set(slices[0]) & set(slices[1]),
                      f"epoch {epoch}: the ranks' slices overlap: {sorted(set(slices[0]) & set(slices[1]))}")
        checks.expect(sorted(slices[0] + slices[1]) == list(range(SAMPLES)),
                      f"epoch {epoch}: the slices do not cover the {SAMPLES} samples")
    checks.expect(all(ranks[rank]["seen"][0] != ranks[rank]["seen"][1] for rank in range(NPROC)),
                  "set_epoch did not reshuffle: a rank saw the same order in both epochs")
    checks.expect(ranks[0]["params"] == ranks[1]["params"],
                  f"the replicas' parameters differ: {ranks[0]['params']} vs {ranks[1]['params']}")


def compare_ddp_train(ddprun, torchrun, checks):
    a, b = ddprun.rank_results(checks), torchrun.rank_results(checks)
    for rank in sorted(a.keys() & b.keys()):
        checks.expect(a[rank]["seen"] == b[rank]["seen"],
                      f"rank {rank} saw other samples: {a[rank]['seen']} vs {b[rank]['seen']}")
        checks.expect(close(a[rank]["losses"], b[rank]["losses"], 1e-6),
                      f"rank {rank}'s losses differ: {a[rank]['losses']} vs {b[rank]['losses']}")
        checks.expect(close(a[rank]["params"], b[rank]["params"], 1e-6),
                      f"rank {rank}'s final parameters differ: {a[rank]['params']} vs {b[rank]['params']}")


# ---- env_record: every torchrun variable, @record, rank 1 raises

# Typed with a directory: the report's title is the program as typed.
ENV_PROGRAM = "./env_record.py"
ENV_EXCEPTION = "ValueError: rank 1: planned failure (bad batch size 7)"


def check_env_record(run, checks):
    expect_exit(run, checks, 1)
    ranks = run.rank_results(checks)
    tmpdir = run.env["TMPDIR"]
    for rank, result in ranks.items():
        environ = result["environ"]
        added = launcher_added_env(run, environ)
        missing = sorted(TORCHRUN_VARIABLES - added.keys())
        checks.expect(not missing, f"rank {rank}: variables not set: {missing}")
        for name, value in expected_worker_env(rank).items():
            if value is not None and name in added:
                checks.expect(added[name] == value, f"rank {rank}: {name}={added[name]!r}, expected {value!r}")
        checks.expect(is_loopback(environ.get("MASTER_ADDR", "")),
                      f"rank {rank}: MASTER_ADDR={environ.get('MASTER_ADDR')!r} is not this host's loopback")
        checks.expect(environ.get("MASTER_PORT", "").isdigit() and 0 < int(environ["MASTER_PORT"]) < 65536,
                      f"rank {rank}: MASTER_PORT={environ.get('MASTER_PORT')!r}")
        checks.expect(bool(environ.get("TORCHELASTIC_RUN_ID")), f"rank {rank}: empty TORCHELASTIC_RUN_ID")
        error_file = environ.get("TORCHELASTIC_ERROR_FILE", "")
        checks.expect(error_file.startswith(tmpdir + "/") and
                      error_file.endswith(f"/attempt_0/{rank}/error.json"),
                      f"rank {rank}: TORCHELASTIC_ERROR_FILE={error_file!r}, expected "
                      f"{tmpdir}/.../attempt_0/{rank}/error.json")
        shared = [g["shared"] for g in result["gathered"]]
        checks.expect(all(s == shared[0] for s in shared),
                      f"rank {rank}: the ranks saw different job-wide values: {shared}")

    report = failure_report(run.stderr, ENV_PROGRAM)
    if not checks.expect(report is not None, f"no '{ENV_PROGRAM} FAILED' report on stderr"):
        return
    for text in ("Root Cause (first observed failure):", "<NO_OTHER_FAILURES>",
                 "  rank      : 1 (local_rank: 1)", "  exitcode  : 1 (pid: ",
                 "  traceback : Traceback (most recent call last):", ENV_EXCEPTION):
        checks.expect(text in report, f"the report lacks {text!r}")
    if 1 in ranks:
        error_file = ranks[1]["environ"].get("TORCHELASTIC_ERROR_FILE")
        checks.expect(f"  error_file: {error_file}\n" in report,
                      f"the report does not name rank 1's error file {error_file}")


def compare_env_record(ddprun, torchrun, checks):
    a, b = ddprun.rank_results(checks), torchrun.rank_results(checks)
    for rank in sorted(a.keys() & b.keys()):
        ours = launcher_added_env(ddprun, a[rank]["environ"])
        theirs = launcher_added_env(torchrun, b[rank]["environ"])
        checks.expect(not theirs.keys() - ours.keys(),
                      f"rank {rank}: torchrun sets {sorted(theirs.keys() - ours.keys())}, ddprun does not")
        checks.expect(ours.keys() - theirs.keys() <= DDPRUN_OWN_VARIABLES,
                      f"rank {rank}: ddprun sets {sorted(ours.keys() - theirs.keys() - DDPRUN_OWN_VARIABLES)}, "
                      f"torchrun does not")
        for name in sorted((ours.keys() & theirs.keys()) - PER_RUN_VARIABLES):
            checks.expect(ours[name] == theirs[name],
                          f"rank {rank}: {name} is {ours[name]!r} under ddprun, {theirs[name]!r} under torchrun")
    reports = [failure_report(run.stderr, ENV_PROGRAM) for run in (ddprun, torchrun)]
    if None not in reports:
        ours, theirs = (normalized_report(r) for r in reports)
        checks.expect(ours == theirs, "the failure reports differ (normalized):\n--- ddprun\n" + ours +
                      "\n--- torchrun\n" + theirs)


# ---- module (-m) and no_python (a shell wrapper): how each rank was started

def collect_program(out, state, launch):
    return launch + ["--out", str(out), "--tag", "lr${local_rank}"]


def check_collect(via, module):
    def check(run, checks):
        expect_exit(run, checks, 0)
        for rank, result in run.rank_results(checks).items():
            expected = {"rank": rank, "local_rank": rank, "world_size": NPROC, "sum": 3.0,
                        "tag": f"lr{rank}", "via": via, "module": module, "script": "collect.py",
                        "executable": PYTHON}
            checks.expect(result == expected, f"rank {rank} reported {result}, expected {expected}")
    return check


def compare_same_results(files):
    """Compares the ranks' files: {suffix: parse}."""
    def compare(ddprun, torchrun, checks):
        for suffix, parse in files.items():
            a, b = ddprun.rank_results(checks, suffix, parse), torchrun.rank_results(checks, suffix, parse)
            for rank in sorted(a.keys() & b.keys()):
                checks.expect(a[rank] == b[rank], f"rank {rank}'s rank{rank}{suffix} differs: "
                                                  f"{a[rank]} under ddprun, {b[rank]} under torchrun")
    return compare


# ---- resume: a planned failure, --max_restarts=1, resume from the checkpoint

RESUME_STEPS = 6
RESUME_FAIL_AFTER = 3


def uninterrupted_resume_result():
    """What resume.py computes without a failure (its update rule, world size 2)."""
    w = [0.0] * 4
    for step in range(RESUME_STEPS):
        g = [sum(i * (rank + 1) + step for rank in range(NPROC)) for i in range(4)]
        w = [x * 0.5 + y * 0.1 for x, y in zip(w, g)]
    return w


def parse_json_lines(text):
    return [json.loads(line) for line in text.splitlines()]


def check_resume(run, checks):
    expect_exit(run, checks, 0)
    expected_attempts = [{"restart_count": 0, "start_step": 0},
                         {"restart_count": 1, "start_step": RESUME_FAIL_AFTER}]
    for rank, attempts in run.rank_results(checks, ".attempts", parse_json_lines).items():
        checks.expect(attempts == expected_attempts,
                      f"rank {rank}'s attempts were {attempts}, expected {expected_attempts}")
    expected_w = uninterrupted_resume_result()
    for rank, result in run.rank_results(checks).items():
        checks.expect(result["restart_count"] == 1 and result["max_restarts"] == "1",
                      f"rank {rank} finished with TORCHELASTIC_RESTART_COUNT={result['restart_count']}, "
                      f"TORCHELASTIC_MAX_RESTARTS={result['max_restarts']!r}, expected 1 and '1'")
        checks.expect(close(result["w"], expected_w, 1e-12),
                      f"rank {rank} finished with {result['w']}, an uninterrupted run gives {expected_w}")
    checks.expect(f"planned failure after step {RESUME_FAIL_AFTER}" in run.stdout + run.stderr,
                  "rank 1's planned failure is not in the output")


CASES = {
    "ddp_train": Case(
        "a DDP loop with DistributedSampler, DataLoader and set_epoch: disjoint slices, same training",
        [], lambda out, state: ["ddp_train.py", "--out", str(out), "--epochs", str(EPOCHS),
                                "--samples", str(SAMPLES)],
        check_ddp_train, compare_ddp_train),
    "env_record": Case(
        "every torchrun variable; @record; rank 1 raises: the report carries its traceback",
        [], lambda out, state: [ENV_PROGRAM, str(out)],
        check_env_record, compare_env_record),
    "module": Case(
        "-m trainpkg.collect with ${local_rank} in an argument",
        ["-m"], lambda out, state: collect_program(out, state, ["trainpkg.collect"]),
        check_collect("python", "trainpkg.collect"), compare_same_results({".json": json.loads})),
    "no_python": Case(
        "--no_python ./run_collect.sh (a shell wrapper) with ${local_rank} in an argument",
        ["--no_python"], lambda out, state: collect_program(out, state, ["./run_collect.sh"]),
        check_collect("wrapper", None), compare_same_results({".json": json.loads})),
    "resume": Case(
        "a planned failure, --max_restarts=1, resume from the script's own checkpoint",
        ["--max_restarts=1"],
        lambda out, state: ["resume.py", "--out", str(out), "--checkpoint", str(state / "ckpt.pt"),
                            "--steps", str(RESUME_STEPS), "--fail-after", str(RESUME_FAIL_AFTER)],
        check_resume, compare_same_results({".json": json.loads, ".attempts": parse_json_lines})),
}


# ---------------------------------------------------------------- main

def torch_missing_reason():
    """Why PYTHON cannot run the matrix, or None. Looks torch up without importing
    it (seconds): the scripts import it, and a broken torch fails them loudly."""
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return f"{PYTHON} has no module named 'torch' (scripts/setup installs python3-torch)"
    locations = spec.submodule_search_locations or []
    if not any((Path(location) / "distributed" / "run.py").is_file() for location in locations):
        return f"{PYTHON}'s torch has no torch.distributed.run (torchrun)"
    return None


def print_run(run):
    print(f"--- {run.launcher}: {' '.join(run.argv)}")
    print(f"--- {run.launcher} stdout:\n{run.stdout}--- {run.launcher} stderr:\n{run.stderr}", end="")


def leave_on_signal(signo, frame):
    raise SystemExit(128 + signo)


def start_driver(argv, cases):
    """What every driver (this one, watchdog.py) does first: read the case from
    argv, skip without torch, find ddprun in DDP_BUILD_BIN, stop its launchers on
    a signal. Returns (case name, ddprun's path), or the exit code to leave with
    (2 bad usage, 77 skipped, 1 no ddprun) after saying why."""
    if len(argv) != 2 or argv[1] not in cases:
        print(f"usage: {argv[0]} CASE    (CASE: {', '.join(cases)})", file=sys.stderr)
        return 2
    reason = torch_missing_reason()
    if reason:
        print(f"skipped: {reason}")
        return 77
    ddprun = Path(os.environ.get("DDP_BUILD_BIN", "")) / "ddprun"
    if not os.access(ddprun, os.X_OK):
        print(f"error: {ddprun} not found or not executable (set DDP_BUILD_BIN to the build's bin directory "
              f"and build the ddprun target)", file=sys.stderr)
        return 1
    for signo in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signo, leave_on_signal)
    return argv[1], ddprun


def main(argv):
    backend = argv[2] if len(argv) == 3 else "gloo"
    if len(argv) > 3 or backend not in BACKENDS or (backend != "gloo" and argv[1] not in BACKEND_CASES):
        print(f"usage: {argv[0]} CASE [BACKEND]    (CASE: {', '.join(CASES)}; BACKEND: "
              f"gloo, the default, or ddp, with {', '.join(BACKEND_CASES)} only)", file=sys.stderr)
        return 2
    started = start_driver(argv[:2], CASES)
    if isinstance(started, int):
        return started
    name, ddprun = started
    case = CASES[name]
    if backend == "ddp":
        package = ddp_torch_folder(ddprun) / "ddp_torch" / "__init__.py"
        if not package.is_file():
            print(f"skipped: the build has no ddp_torch (no {package}: configure with "
                  f"DDP_WITH_TORCH=ON and build the ddp_torch target)")
            return 77

    work = Path(tempfile.mkdtemp(prefix="ddprun-pytorch-"))
    try:
        shutil.copytree(HERE / "scripts", work / "src")
        (work / "tmp").mkdir()
        print(f"{name} on {backend}: {case.what}")
        runs = {launcher: run_launcher(launcher, case, work, ddprun, backend) for launcher in LAUNCHERS}
        checks = Checks()
        for run in runs.values():
            scoped = checks.about(run.launcher)
            scoped.expect(run.code is not None, f"did not finish within {RUN_TIMEOUT_S} s")
            scoped.expect(not run.leftovers, f"processes left running after it exited: {run.leftovers}")
            case.check(run, scoped)
            if name in BACKEND_CASES:
                for rank, result in run.rank_results(Checks()).items():
                    scoped.expect(result.get("backend") == backend, f"rank {rank} ran on backend "
                                  f"{result.get('backend')!r}, expected {backend!r}")
        case.compare(runs["ddprun"], runs["torchrun"], checks.about("ddprun vs torchrun"))
        for run in runs.values():
            print(f"{run.launcher:>8}: exit code {run.code}, {run.seconds:.1f} s")
        if checks.problems:
            for run in runs.values():
                print_run(run)
            print(f"FAIL {name} on {backend}:")
            for problem in checks.problems:
                print(f"  {problem}")
            return 1
        print(f"PASS {name} on {backend}: the same outcome under ddprun and torchrun")
        return 0
    finally:
        for session in list(_live_sessions):
            stop_session(session)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
