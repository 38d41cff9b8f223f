"""The watchdogs a PyTorch script meets under ddprun: torch's file timer
(torch.distributed.elastic.timer.expires, served when
TORCHELASTIC_ENABLE_FILE_TIMER=1) and --hang_timeout's not_exiting rule.

    watchdog.py CASE

    timer_expired    rank 1 overruns expires(after=2, scope="step"): under ddprun
                     and torchrun, --max_restarts=0, rank 1 is SIGKILLed, both
                     fail the same way (exit code, failed rank, -9)
    timer_in_time    the same scope, not overrun: both exit 0
    timer_allreduce  rank 1 blocks before an all_reduce under
                     expires(after=3, scope="allreduce"): ddprun kills rank 1
    hang_not_exiting no timer, --hang_timeout=3: rank 0 exits 0, rank 1 never
                     does: ddprun names rank 1 (not_exiting), writes the incident,
                     and rank 1's faulthandler prints its Python traceback
    timer_bad_input  garbage, a 1 MiB line and a request for a process that is
                     not a worker, written to the timer FIFO of a healthy job:
                     nothing changes (exit 0, the process lives, the FIFO goes)

The scripts (scripts/timer_step.py, scripts/not_exiting.py) run with
/usr/bin/python3 (torch 1.13, Gloo on CPU), 2 workers, from a copy of scripts/
in a temporary directory (also TMPDIR), removed at the end. ddprun is
$DDP_BUILD_BIN/ddprun; torchrun is run_torchrun.py; the process, report and
environment helpers are the script matrix's (matrix.py). Every launcher runs in
a session of its own, stopped (SIGTERM, then SIGKILL) if anything is left.

Exit code: 0 when every check holds, 1 otherwise (the problems and the
launchers' output are printed), 2 for a bad command line, 77 (skipped) when
/usr/bin/python3 has no torch.
"""
import json
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import matrix  # noqa: E402  (the script matrix: processes, reports, environment)

PYTHON = matrix.PYTHON
LAUNCHERS = ("ddprun", "torchrun")
NPROC = 2
FLAGS = [f"--nproc_per_node={NPROC}", "--monitor_interval=0.1", "--max_restarts=0"]
TIMER_ENV = {"TORCHELASTIC_ENABLE_FILE_TIMER": "1"}
# Bounds a run that should take seconds (a hang on a loaded machine).
RUN_TIMEOUT_S = 90
# How late after a scope's deadline its worker may die and the launcher end:
# the server looks every 100 ms, then the launcher stops the other rank.
KILL_SLACK_S = 5.0
# How late after --hang_timeout the not_exiting hang may end the job (native
# stacks are collected first, within ddprun's stack timeout).
HANG_SLACK_S = 25.0
KILL_LINE = re.compile(r"^ddprun: timer of scope '(?P<scope>[^']*)' expired on rank (?P<rank>\d+) "
                       r"\(local rank (?P<local_rank>\d+), pid (?P<pid>\d+)\): sending (?P<signal>\S+)$",
                       re.MULTILINE)


@dataclass
class Run:
    launcher: str
    argv: list
    code: int | None  # 128 + signal when killed by a signal; None: timed out
    stdout: str
    stderr: str
    started: float  # time.time()
    ended: float
    out: Path
    leftovers: list
    problem: str | None = None  # what went wrong in `during`

    @property
    def seconds(self):
        return self.ended - self.started

    def ranks(self):
        """{rank: <out>/rank<rank>.json} for the ranks that wrote one."""
        results = {}
        for rank in range(NPROC):
            path = self.out / f"rank{rank}.json"
            if path.is_file():
                results[rank] = json.loads(path.read_text())
        return results


_live_sessions = set()
# Figures printed with the verdict (reaction times).
_notes = []


def run_launcher(launcher, work, ddprun, flags, program, extra_env, during=None):
    """Runs one launcher to its end (bounded by RUN_TIMEOUT_S). `program` maps
    the rank output directory to the program and its arguments; `during(proc,
    out, stderr_path)` runs while the launcher does."""
    base = work / launcher
    out = base / "out"
    out.mkdir(parents=True)
    prefix = [str(ddprun)] if launcher == "ddprun" else [PYTHON, str(HERE / "run_torchrun.py")]
    argv = prefix + matrix.standalone_flags(launcher) + FLAGS + flags + program(out)
    env = matrix.launcher_env(work)
    env.update(extra_env)
    if launcher == "ddprun":
        env["DDP_LOG_LEVEL"] = "info"  # the file timer's "Reaping worker_pid=..." lines
    stdout_path, stderr_path = base / "stdout", base / "stderr"
    started = time.time()
    with open(stdout_path, "w") as stdout, open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(argv, cwd=work / "src", env=env, stdin=subprocess.DEVNULL,
                                stdout=stdout, stderr=stderr, start_new_session=True)
    _live_sessions.add(proc.pid)
    problem = None
    try:
        if during is not None:
            try:
                during(proc, out, stderr_path)
            except (OSError, TimeoutError, ValueError) as e:
                problem = f"while it ran: {type(e).__name__}: {e}"
                matrix.stop_session(proc.pid)
        code = proc.wait(timeout=max(1.0, started + RUN_TIMEOUT_S - time.time()))
        code = code if code >= 0 else 128 - code
    except subprocess.TimeoutExpired:
        matrix.stop_session(proc.pid)
        proc.wait()
        code = None
    ended = time.time()
    leftovers = ([] if matrix.wait_for_empty_session(proc.pid, matrix.LEFTOVER_GRACE_S)
                 else matrix.session_members(proc.pid))
    matrix.stop_session(proc.pid)
    _live_sessions.discard(proc.pid)
    return Run(launcher, argv, code, stdout_path.read_text(errors="replace"),
               stderr_path.read_text(errors="replace"), started, ended, out, leftovers, problem)


def report_failures(report):
    """[{rank, local_rank, exitcode, pid, traceback}] of a torchrun-format
    failure report, in its order (the other failures, then the root cause)."""
    failures = []
    for block in re.split(r"(?m)^\[\d+\]:$", report)[1:]:
        rank = re.search(r"(?m)^  rank      : (-?\d+) \(local_rank: (\d+)\)$", block)
        exit_ = re.search(r"(?m)^  exitcode  : (-?\d+) \(pid: (\d+)\)$", block)
        traceback = re.search(r"(?m)^  traceback : (.*)$", block)
        failures.append({
            "rank": int(rank.group(1)) if rank else None,
            "local_rank": int(rank.group(2)) if rank else None,
            "exitcode": int(exit_.group(1)) if exit_ else None,
            "pid": int(exit_.group(2)) if exit_ else None,
            "traceback": traceback.group(1) if traceback else None,
        })
    return failures


def failed_ranks(failures):
    """The failures' ranks, ascending (None where a block had no rank line)."""
    return sorted((f["rank"] for f in failures), key=lambda rank: -1 if rank is None else rank)


def check_common(run, checks):
    checks.expect(run.problem is None, run.problem)
    checks.expect(run.code is not None, f"did not finish within {RUN_TIMEOUT_S} s")
    checks.expect(not run.leftovers, f"processes left running after it exited: {run.leftovers}")


def check_fifo_gone(path, checks):
    if checks.expect(bool(path), "the workers saw no TORCHELASTIC_TIMER_FILE"):
        checks.expect(not os.path.lexists(path), f"the timer FIFO {path} is still there after the launcher exited")


def timer_program(case):
    return lambda out: ["timer_step.py", "--case", case, "--out", str(out)]


def killed_failure(run, checks, scope, rank_record):
    """The failure report of a run whose rank 1 the timer killed: only rank 1
    failed, with -9, and its pid. Returns the outcome to compare, or None."""
    report = matrix.failure_report(run.stderr, "timer_step.py")
    if not checks.expect(report is not None, "no 'timer_step.py FAILED' report on stderr"):
        return None
    failures = report_failures(report)
    failed = failed_ranks(failures)
    checks.expect(failed == [1], f"the failed ranks are {failed}, expected [1]")
    rank1 = [f for f in failures if f["rank"] == 1]
    if not rank1:
        return None
    failure = rank1[-1]
    checks.expect(failure["exitcode"] == -signal.SIGKILL,
                  f"rank 1's exitcode is {failure['exitcode']}, expected -9 (SIGKILL)")
    checks.expect(failure["pid"] == rank_record.get("pid"),
                  f"the report's pid {failure['pid']} is not rank 1's {rank_record.get('pid')}")
    if run.launcher == "torchrun":
        expected = f"Signal 9 (SIGKILL) received by PID {failure['pid']}"
        checks.expect(failure["traceback"] == expected,
                      f"torchrun's traceback line is {failure['traceback']!r}, expected {expected!r}")
    else:
        checks.expect(f"the file timer of scope '{scope}' expired" in (failure["traceback"] or ""),
                      f"the traceback line {failure['traceback']!r} does not name the timer of scope '{scope}'")
    # The launchers' exit codes differ on purpose: torchrun exits 1 after any
    # worker failure (ChildFailedError); ddprun with the root cause's exit code,
    # 128 + signal for a signalled worker (docs/using.md, "Failures").
    root_code = failures[-1]["exitcode"] or 0
    expected_code = 1 if run.launcher == "torchrun" else (128 - root_code if root_code < 0 else root_code)
    checks.expect(run.code == expected_code, f"exit code {run.code}, expected {expected_code}")
    return {"failed ranks": failed, "rank 1 exitcode": failure["exitcode"],
            "root cause rank": failures[-1]["rank"],
            "root cause exit code": failures[-1]["exitcode"]}


def check_ddprun_kill_line(run, checks, scope, rank_record):
    lines = [m.groupdict() for m in KILL_LINE.finditer(run.stderr)]
    expected = {"scope": scope, "rank": "1", "local_rank": "1", "pid": str(rank_record.get("pid")),
                "signal": "SIGKILL"}
    checks.expect(lines == [expected], f"the timer lines on stderr are {lines}, expected [{expected}]")
    reaping = f"Reaping worker_pid=[{rank_record.get('pid')}]. Expired timers: [{scope}]"
    checks.expect(reaping in run.stderr, f"stderr lacks {reaping!r}")


# ---------------------------------------------------------------- the cases

def expect_ended_within(run, scoped, entered, scope_s):
    """The run ended within KILL_SLACK_S of rank 1's scope of `scope_s` seconds
    expiring (`entered`: when rank 1 entered it)."""
    late = run.ended - entered
    _notes.append(f"{run.launcher}: ended {late:.1f} s after rank 1 entered its {scope_s} s scope")
    scoped.expect(late <= scope_s + KILL_SLACK_S,
                  f"the run ended {late:.1f} s after rank 1 entered its {scope_s} s scope "
                  f"(expected within {scope_s + KILL_SLACK_S:.0f} s)")


def case_timer_expired(work, ddprun, checks):
    runs = [run_launcher(launcher, work, ddprun, [], timer_program("overrun"), TIMER_ENV)
            for launcher in LAUNCHERS]
    outcomes = {}
    for run in runs:
        scoped = checks.about(run.launcher)
        check_common(run, scoped)
        scoped.expect(run.code not in (0, None), f"exit code {run.code}, expected a failure")
        ranks = run.ranks()
        if not scoped.expect(sorted(ranks) == [0, 1], f"ranks {sorted(ranks)} wrote a record, expected [0, 1]"):
            continue
        rank1 = ranks[1]
        scoped.expect("step_done" not in rank1, "rank 1 finished its 10 s step: the timer did not kill it")
        scoped.expect("finished" not in ranks[0], "rank 0 finished: it should have been stopped")
        if scoped.expect("step_entered" in rank1, "rank 1 never entered its step"):
            expect_ended_within(run, scoped, rank1["step_entered"], 2)
        check_fifo_gone(rank1.get("timer_file"), scoped)
        outcomes[run.launcher] = killed_failure(run, scoped, "step", rank1)
        if run.launcher == "ddprun":
            check_ddprun_kill_line(run, scoped, "step", rank1)
    if all(outcomes.get(launcher) for launcher in LAUNCHERS):
        checks.expect(outcomes["ddprun"] == outcomes["torchrun"],
                      f"ddprun vs torchrun: the outcomes differ: {outcomes['ddprun']} vs {outcomes['torchrun']}")
    return runs


def case_timer_in_time(work, ddprun, checks):
    runs = [run_launcher(launcher, work, ddprun, [], timer_program("in_time"), TIMER_ENV)
            for launcher in LAUNCHERS]
    for run in runs:
        scoped = checks.about(run.launcher)
        check_common(run, scoped)
        scoped.expect(run.code == 0, f"exit code {run.code}, expected 0")
        ranks = run.ranks()
        for rank in range(NPROC):
            record = ranks.get(rank, {})
            scoped.expect(record.get("total") == 3.0,
                          f"rank {rank} did not finish (its record: {record})")
        check_fifo_gone(ranks.get(0, {}).get("timer_file"), scoped)
        scoped.expect("FAILED" not in run.stderr, "a failure report on stderr")
        if run.launcher == "ddprun":
            scoped.expect(not KILL_LINE.search(run.stderr), "ddprun reports an expired timer")
            scoped.expect("Reaping worker_pid" not in run.stderr, "ddprun reaped a worker")
    codes = {run.launcher: run.code for run in runs}
    checks.expect(codes["ddprun"] == codes["torchrun"], f"ddprun vs torchrun: exit codes {codes}")
    return runs


def case_timer_allreduce(work, ddprun, checks):
    run = run_launcher("ddprun", work, ddprun, [], timer_program("allreduce"), TIMER_ENV)
    scoped = checks.about("ddprun")
    check_common(run, scoped)
    scoped.expect(run.code not in (0, None), f"exit code {run.code}, expected a failure")
    ranks = run.ranks()
    if not scoped.expect(sorted(ranks) == [0, 1], f"ranks {sorted(ranks)} wrote a record, expected [0, 1]"):
        return [run]
    rank1 = ranks[1]
    scoped.expect("finished" not in rank1 and "finished" not in ranks[0], "a rank finished the all_reduce")
    if scoped.expect("scope_entered" in rank1, "rank 1 never entered the 'allreduce' scope"):
        expect_ended_within(run, scoped, rank1["scope_entered"], 3)
    check_ddprun_kill_line(run, scoped, "allreduce", rank1)
    report = matrix.failure_report(run.stderr, "timer_step.py")
    if scoped.expect(report is not None, "no 'timer_step.py FAILED' report on stderr"):
        failures = report_failures(report)
        root = failures[-1] if failures else {}
        scoped.expect(root.get("rank") == 1 and root.get("exitcode") == -9 and root.get("pid") == rank1["pid"],
                      f"the root cause is {root}, expected rank 1, exitcode -9, pid {rank1['pid']}")
        scoped.expect("the file timer of scope 'allreduce' expired" in (root.get("traceback") or ""),
                      f"the root cause's traceback {root.get('traceback')!r} does not name the scope")
    check_fifo_gone(rank1.get("timer_file"), scoped)
    return [run]


def case_hang_not_exiting(work, ddprun, checks):
    # A --log_dir of its own: without one, ddprun's private log directory,
    # where the incident is written, is removed when ddprun exits.
    log_dir = work / "logs"
    run = run_launcher("ddprun", work, ddprun, ["--hang_timeout=3", f"--log_dir={log_dir}"],
                       lambda out: ["not_exiting.py", str(out)], {})
    scoped = checks.about("ddprun")
    check_common(run, scoped)
    scoped.expect(run.code not in (0, None), f"exit code {run.code}, expected a failure")
    ranks = run.ranks()
    if not scoped.expect(sorted(ranks) == [0, 1], f"ranks {sorted(ranks)} wrote a record, expected [0, 1]"):
        return [run]
    scoped.expect(ranks[1].get("faulthandler") == "1",
                  f"rank 1 has PYTHONFAULTHANDLER={ranks[1].get('faulthandler')!r}, expected '1'")
    after = run.ended - ranks[0]["exited"]
    _notes.append(f"{run.launcher}: ended {after:.1f} s after rank 0 exited (--hang_timeout=3)")
    scoped.expect(3 <= after + 0.5 and after <= 3 + HANG_SLACK_S,
                  f"the job ended {after:.1f} s after rank 0 exited, expected 3 to {3 + HANG_SLACK_S:.0f} s")
    err = run.stderr
    scoped.expect(re.search(r"(?m)^ddprun: HANG \(not_exiting\) detected by node 0 ", err) is not None,
                  "stderr lacks 'ddprun: HANG (not_exiting) detected by node 0 ...'")
    scoped.expect(re.search(r"(?m)^  culprit rank\(s\): 1;", err) is not None,
                  "stderr lacks 'culprit rank(s): 1'")
    incident = re.search(r"(?m)^ddprun: incident written to (\S+)$", err)
    if scoped.expect(incident is not None, "stderr lacks 'ddprun: incident written to <path>'"):
        path = Path(incident.group(1))
        scoped.expect(path.parent.parent.parent == log_dir,
                      f"the incident {path} is not in <log_dir>/<run_id>/attempt_0 ({log_dir})")
        if scoped.expect(path.is_file(), f"the incident {path} does not exist"):
            doc = json.loads(path.read_text())
            scoped.expect(doc.get("hang_kind") == "not_exiting" and doc.get("culprits") == [1],
                          f"the incident has hang_kind {doc.get('hang_kind')!r}, culprits {doc.get('culprits')}")
    rank1_lines = [line[len("[default1]:"):] for line in err.splitlines() if line.startswith("[default1]:")]
    scoped.expect(any("Fatal Python error: Aborted" in line for line in rank1_lines),
                  "rank 1's stderr lacks faulthandler's 'Fatal Python error: Aborted'")
    frames = [line for line in rank1_lines if line.lstrip().startswith('File "')]
    scoped.expect(any("not_exiting.py" in f and "in linger_after_last_collective" in f for f in frames),
                  f"rank 1's traceback lacks linger_after_last_collective: its File lines are {frames}")
    report = matrix.failure_report(err, "not_exiting.py")
    if scoped.expect(report is not None, "no 'not_exiting.py FAILED' report on stderr"):
        failures = report_failures(report)
        failed = failed_ranks(failures)
        scoped.expect(failed == [1], f"the failed ranks are {failed}, expected [1]")
        root = failures[-1] if failures else {}
        scoped.expect(root.get("exitcode") == -signal.SIGABRT and root.get("pid") == ranks[1]["pid"],
                      f"the root cause is {root}, expected exitcode -6 (SIGABRT), pid {ranks[1]['pid']}")
    return [run]


# Lines that are not valid requests, each aimed where a bug would hurt: at a
# worker, expired, SIGKILL.
def bad_lines(worker_pid, past):
    valid = {"version": 1, "pid": worker_pid, "scope_id": "bad", "expiration_time": past, "signal": 9}
    wrong = [dict(valid, version=2), dict(valid, pid=str(worker_pid)), dict(valid, scope_id=7),
             dict(valid, expiration_time=str(past)), dict(valid, signal=99), dict(valid, pid=-worker_pid),
             {key: value for key, value in valid.items() if key != "scope_id"}]
    lines = [b"garbage", b"{not json", b"[1, 2, 3]", b"{}", b"null", b"\x00\xff\xfe binary",
             b'{"version": 1, "pid": {"nested": [1, 2]}}']
    lines += [json.dumps(request).encode() for request in wrong]
    return b"".join(line + b"\n" for line in lines)


def write_bounded(path, payloads, seconds):
    """Writes the payloads to the FIFO without blocking past `seconds`."""
    deadline = time.monotonic() + seconds
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        for payload in payloads:
            view = memoryview(payload)
            while view:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"could not write to {path} within {seconds} s "
                                       f"({len(view)} bytes left): nobody reads it")
                _, writable, _ = select.select([], [fd], [], min(left, 0.5))
                if not writable:
                    continue
                try:
                    view = view[os.write(fd, view):]
                except BlockingIOError:
                    pass
    finally:
        os.close(fd)


def wait_until(what, predicate, seconds):
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {seconds} s")
        time.sleep(0.05)


def case_timer_bad_input(work, ddprun, checks):
    fifo = work / "timer" / "watchdog.fifo"
    fifo.parent.mkdir()
    bystander = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)
    probe_scope = "probe-after-junk"
    sent = {}

    def feed(proc, out, stderr_path):
        def in_scope():
            records = [out / f"rank{rank}.json" for rank in range(NPROC)]
            return proc.poll() is not None or all(
                path.is_file() and "in_scope" in json.loads(path.read_text()) for path in records)
        wait_until("the ranks did not enter their scope", in_scope, 60)
        if proc.poll() is not None:
            return
        if not stat.S_ISFIFO(os.lstat(fifo).st_mode):
            raise ValueError(f"{fifo} is not a FIFO")
        rank0 = json.loads((out / "rank0.json").read_text())
        past = time.time() - 60
        intruder = {"version": 1, "pid": bystander.pid, "scope_id": "intruder",
                    "expiration_time": past, "signal": 9}
        # A request ddprun applies (rank 0, signal 0: report, do not signal):
        # logged once read, so the lines before it were read too.
        probe = {"version": 1, "pid": rank0["pid"], "scope_id": probe_scope,
                 "expiration_time": past, "signal": 0}
        sent.update(rank0_pid=rank0["pid"])
        write_bounded(fifo, [bad_lines(rank0["pid"], past),
                             b"x" * (1024 * 1024), b"\n",
                             json.dumps(intruder).encode() + b"\n",
                             json.dumps(probe).encode() + b"\n"], 20)
        marker = f"Reaping worker_pid=[{rank0['pid']}]. Expired timers: [{probe_scope}]"
        wait_until(f"ddprun did not log {marker!r}",
                   lambda: proc.poll() is not None or marker in stderr_path.read_text(errors="replace"), 20)
        time.sleep(0.3)  # a few more of the server's 100 ms looks
        sent.update(bystander_alive_during=bystander.poll() is None)
        (out / "go").touch()

    try:
        run = run_launcher("ddprun", work, ddprun, [], timer_program("healthy"),
                           dict(TIMER_ENV, TORCHELASTIC_TIMER_FILE=str(fifo)), during=feed)
        bystander_alive = bystander.poll() is None
    finally:
        if bystander.poll() is None:
            bystander.kill()
        bystander.wait()
    scoped = checks.about("ddprun")
    check_common(run, scoped)
    scoped.expect(run.code == 0, f"exit code {run.code}, expected 0")
    ranks = run.ranks()
    for rank in range(NPROC):
        record = ranks.get(rank, {})
        scoped.expect(record.get("timer_file") == str(fifo),
                      f"rank {rank} got TORCHELASTIC_TIMER_FILE={record.get('timer_file')!r}, expected {str(fifo)!r}")
        scoped.expect(record.get("total") == 3.0, f"rank {rank} did not finish (its record: {record})")
    scoped.expect(sent.get("bystander_alive_during") is True and bystander_alive,
                  f"the `sleep 60` (pid {bystander.pid}, not a worker) was killed: exit status {bystander.returncode}")
    scoped.expect(f"worker_pid=[{bystander.pid}]" not in run.stderr,
                  f"ddprun took the request for pid {bystander.pid} (not a worker)")
    scoped.expect(not KILL_LINE.search(run.stderr), "ddprun reports an expired timer")
    scoped.expect("FAILED" not in run.stderr, "a failure report on stderr")
    check_fifo_gone(str(fifo), scoped)
    return [run]


CASES = {
    "timer_expired": case_timer_expired,
    "timer_in_time": case_timer_in_time,
    "timer_allreduce": case_timer_allreduce,
    "hang_not_exiting": case_hang_not_exiting,
    "timer_bad_input": case_timer_bad_input,
}


def main(argv):
    started = matrix.start_driver(argv, CASES)
    if isinstance(started, int):
        return started
    name, ddprun = started

    work = Path(tempfile.mkdtemp(prefix="ddprun-watchdog-"))
    try:
        shutil.copytree(HERE / "scripts", work / "src")
        (work / "tmp").mkdir()
        checks = matrix.Checks()
        runs = []
        try:
            runs = CASES[name](work, ddprun, checks)
        except TimeoutError as e:
            checks.expect(False, str(e))
        for run in runs:
            print(f"{run.launcher:>8}: exit code {run.code}, {run.seconds:.1f} s")
        for note in _notes:
            print(f"  {note}")
        if checks.problems:
            for run in runs:
                matrix.print_run(run)
            print(f"FAIL {name}:")
            for problem in checks.problems:
                print(f"  {problem}")
            return 1
        print(f"PASS {name}")
        return 0
    finally:
        for session in list(_live_sessions):
            matrix.stop_session(session)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
