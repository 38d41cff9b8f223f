#!/usr/bin/python3
"""Chaos test: the Fashion-MNIST demo, killed and resumed, ends bit-identical.

For one configuration (the number of ranks, the all-reduce's transport) this
runs the reduced demo once uninterrupted, then once per seed under
`ddprun --max_restarts 3` while SIGKILLing one worker: the seed picks the
rank, the global step after which it dies and a delay into the next step.
Each run must

  - finish (exit 0) after exactly one restart of the worker group,
  - end with a final checkpoint (weights, momentum, sampler position, step
    counter, settings) equal byte for byte to the uninterrupted run's,
  - leave nothing behind: no process of the run (zombies count as gone), no
    listening socket of its processes, no /dev/shm segment they created, no
    file in the TMPDIR it ran with, no temporary checkpoint file.

Every run prints its seed and the command that replays it alone, e.g.

  DDP_BUILD_BIN=build/bin tests/chaos/chaos_test.py --ranks 3 --transport tcp --seed 601

(--plan prints what each seed does without running anything.)

Binaries come from --bin, else $DDP_BUILD_BIN, else build/bin. Exit status 0
when every run passed, 1 otherwise (each failure names its seed), 2 on bad
arguments, 77 (skipped) without the dataset-fashion-mnist package. SIGTERM
and SIGINT stop the run in progress and remove what the test made.
"""

import argparse
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

# The reduced demo: 2 epochs of 15 steps of 16 samples per rank, a checkpoint
# every 4 steps (so that a resume recomputes up to 3 steps), one hidden layer of
# 96. The gradients are one bucket of 76,330 floats (298 KiB): over TCP, 2 ranks
# all-reduce it with the one-round-trip "direct" algorithm and 3 ranks with
# Gloo's ring (direct only while bytes x (ranks - 1) <= 512 KiB), so both TCP
# algorithms are exercised; over shared memory it is split among the ranks.
BATCH = 16
STEPS_PER_EPOCH = 15
EPOCHS = 2
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH
CHECKPOINT_EVERY = 4
HIDDEN = "96"
# Each step sleeps this long in the chaos runs (not in the uninterrupted one:
# it changes nothing that is computed), so that a kill chosen at least
# KILL_MARGIN_STEPS steps before the end lands long before the run could end.
THROTTLE_MS = 50
KILL_MARGIN_STEPS = 8
MAX_RESTARTS = 3
RUN_TIMEOUT_S = 180
CLEANUP_GRACE_S = 10
STOP_GRACE_S = 15
POLL_S = 0.01
SOCKET_POLL_S = 0.05

PROGRESS = re.compile(r"^\[default0\]:epoch (\d+)/(\d+) step (\d+) .*: (\d+) steps an epoch\)$")
STEPS_LINE = re.compile(r"^\[default0\]:training .* (\d+) steps/epoch\)")
RESUMED = re.compile(r"^\[default0\]:resumed from checkpoint .* \(global step (\d+)\)")
RESTARTING = "restarting the worker group ("
TCP_GROUP = "all-reduce uses TCP (rank 0:"  # logged by every rank 0 whose group has no shared memory


class Interrupted(Exception):
    """SIGTERM or SIGINT arrived: stop, clean up, fail."""


class Failure(Exception):
    """One run did not do what it must."""


# ---------------------------------------------------------------- /proc helpers

def proc_stat(pid):
    """(state, ppid, session, start time) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = data[data.rfind(")") + 2:].split()
    # Fields after the name: 3 state, 4 ppid, 5 pgrp, 6 session, ... 22 start time.
    return fields[0], int(fields[1]), int(fields[3]), int(fields[19])


def running(pid, start_time=None):
    """Whether pid is a live process (not a zombie), and the one that started at start_time."""
    st = proc_stat(pid)
    if st is None or st[0] in ("Z", "X"):
        return False
    return start_time is None or st[3] == start_time


def children_of(pid):
    kids = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.update(int(p) for p in f.read().split())
        except OSError:
            pass
    return kids


def environ_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def socket_inodes_of(pid):
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def listening_sockets():
    """{inode: 'address:port'} of every TCP socket listening in this network namespace."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A":  # TCP_LISTEN
                address, port = fields[1].rsplit(":", 1)
                if len(address) == 8:  # IPv4, as the kernel prints it: a little-endian word
                    address = socket.inet_ntoa(bytes.fromhex(address)[::-1])
                found[int(fields[9])] = f"{address}:{int(port, 16)}"
    return found


def session_members(sid):
    """Live (non-zombie) processes of session sid."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None and st[2] == sid and st[0] not in ("Z", "X"):
                members.append(int(entry))
    return members


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- one ddprun run

class Plan:
    """What a seed decides: the victim rank, the global step after which it dies,
    and how long after that step's progress line the SIGKILL is sent."""

    def __init__(self, seed, ranks):
        rng = random.Random(seed)
        self.seed = seed
        self.rank = rng.randrange(ranks)
        self.step = rng.randint(1, TOTAL_STEPS - KILL_MARGIN_STEPS)
        self.delay_ms = rng.randrange(THROTTLE_MS)


class Run:
    """One ddprun job of the demo, watched: its processes, their sockets, its output;
    optionally SIGKILLs one worker as planned."""

    def __init__(self, args, run_dir, plan=None):
        self.args = args
        self.run_dir = run_dir
        self.plan = plan
        self.checkpoint = os.path.join(run_dir, "ckpt.bin")
        self.tmpdir = os.path.join(run_dir, "tmp")
        os.makedirs(self.tmpdir)
        self.lines = []
        self.workers = {}          # (pid, start time) -> RANK
        self.pending = set()       # children seen before they exec'd the demo
        self.sockets = set()       # inodes of every socket a process of the run held
        self.listening_seen = {}   # inode -> address of those seen listening
        self.proc = None
        self.port = None
        self.killed = None         # (pid, after global step) once the victim was killed
        self.kill_at = None
        self.last_step = 0
        self.steps_per_epoch = None

    def command(self):
        a = self.args
        train_limit = BATCH * STEPS_PER_EPOCH * a.ranks
        cmd = [os.path.join(a.bin, "ddprun"), "--nnodes", "1", "--nproc_per_node", str(a.ranks),
               "--max_restarts", str(MAX_RESTARTS), "--master_port", str(self.port),
               os.path.join(a.bin, "train_fashion_mnist"),
               "--train-limit", str(train_limit), "--test-limit", "200", "--hidden", HIDDEN,
               "--batch-size", str(BATCH), "--epochs", str(EPOCHS),
               "--checkpoint", self.checkpoint, "--checkpoint-every", str(CHECKPOINT_EVERY),
               "--log-every", "1"]
        if self.plan is not None:
            cmd += ["--throttle-ms", str(THROTTLE_MS)]
        return cmd

    def environment(self):
        # Nothing inherited may change how ddprun runs or what its output looks like.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("PET_") and k != "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"}
        env["TMPDIR"] = self.tmpdir
        env["DDP_LOG_LEVEL"] = "info"  # the group's transport is logged at info
        if self.args.transport == "tcp":
            env["DDP_SHM_DISABLE"] = "1"
        else:
            env.pop("DDP_SHM_DISABLE", None)
        return env

    def execute(self):
        """Runs the job to its end; returns its exit status."""
        for _ in range(5):  # another program may take the port between our probe and ddprun's bind
            self.port = free_port()
            status = self._watch()
            in_use = any("is the port already in use?" in line for line in self.lines)
            if not (status != 0 and in_use and not self.workers):
                return status
        return status

    def _watch(self):
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.environment(),
                                     start_new_session=True)
        lines = self.lines = []
        reader = threading.Thread(target=self._read, args=(self.proc.stdout, lines), daemon=True)
        reader.start()
        deadline = time.monotonic() + RUN_TIMEOUT_S
        next_socket_poll = 0.0
        seen = 0
        while self.proc.poll() is None:
            now = time.monotonic()
            if now > deadline:
                raise Failure(f"the job did not end within {RUN_TIMEOUT_S} s")
            self._track_processes()
            if now >= next_socket_poll:
                self._track_sockets()
                next_socket_poll = now + SOCKET_POLL_S
            while seen < len(lines):
                self._on_line(lines[seen])
                seen += 1
            if self.kill_at is not None and self.killed is None and time.monotonic() >= self.kill_at:
                self._kill_victim()
            time.sleep(POLL_S)
        reader.join()
        for line in lines[seen:]:
            self._on_line(line)
        return self.proc.returncode

    @staticmethod
    def _read(stream, lines):
        for raw in stream:
            lines.append(raw.decode(errors="replace").rstrip("\n"))
        stream.close()

    def _on_line(self, line):
        m = STEPS_LINE.match(line)
        if m:
            self.steps_per_epoch = int(m.group(1))
        m = PROGRESS.match(line)
        if not m:
            return
        self.last_step = int(m.group(3))  # the global step
        if self.plan is not None and self.kill_at is None and self.last_step >= self.plan.step:
            self.kill_at = time.monotonic() + self.plan.delay_ms / 1000.0

    def _track_processes(self):
        for pid in children_of(self.proc.pid) | self.pending:
            st = proc_stat(pid)
            if st is None:
                self.pending.discard(pid)
                continue
            key = (pid, st[3])
            if key in self.workers:
                continue
            rank = environ_of(pid).get("RANK")
            if rank is None:  # forked, not yet exec'd: environ is still ddprun's
                self.pending.add(pid)
                continue
            self.pending.discard(pid)
            self.workers[key] = int(rank)

    def _track_sockets(self):
        pids = [self.proc.pid] + [pid for (pid, _) in self.workers]
        for pid in pids:
            self.sockets |= socket_inodes_of(pid)
        for inode, address in listening_sockets().items():
            if inode in self.sockets:
                self.listening_seen[inode] = address

    def _kill_victim(self):
        self._track_processes()
        victims = [(pid, start) for (pid, start), rank in self.workers.items()
                   if rank == self.plan.rank and running(pid, start)]
        if len(victims) != 1:
            raise Failure(f"seed {self.plan.seed}: found {len(victims)} running workers of rank "
                          f"{self.plan.rank} to kill after global step {self.last_step}; the kill came "
                          f"too late (the run was ending): this seed is invalid")
        self._track_sockets()  # every worker is up: see their listening sockets
        pid, _ = victims[0]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended (and was reaped) after running() saw it
            raise Failure(f"seed {self.plan.seed}: rank {self.plan.rank} (pid {pid}) ended before the "
                          f"kill after global step {self.last_step}; the kill came too late (the run "
                          f"was ending): this seed is invalid") from None
        self.killed = (pid, self.last_step)

    def stop(self):
        """Kills whatever of the job still runs (on failure or interruption)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            # SIGTERM first: ddprun stops and reaps its workers (a SIGKILLed ddprun
            # would leave them as zombies that nobody reaps on this image).
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for pid in session_members(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    # ------------------------------------------------------------ what it left

    def leftovers(self):
        """What the finished job left behind, as sentences; empty when nothing."""
        problems = []
        sid = self.proc.pid
        members = session_members(sid)
        if members:
            problems.append(f"processes of the run still running: {sorted(members)}")
        alive = sorted(pid for (pid, start) in self.workers if running(pid, start))
        if alive:
            problems.append(f"workers still running: {alive}")
        listening = listening_sockets()
        held = {inode: listening[inode] for inode in self.sockets if inode in listening}
        if held:
            problems.append(f"sockets of the run still listening: {sorted(held.values())}")
        # Segment names carry their creator's pid. Ours are dead by now: a running
        # process with such a pid is another one that got the pid since.
        ours = {pid for (pid, _) in self.workers} | {sid}
        try:
            segments = [name for name in os.listdir("/dev/shm")
                        if name.startswith("ddp-shm-") and _creator(name) in ours and not running(_creator(name))]
        except OSError:
            segments = []
        if segments:
            problems.append(f"/dev/shm segments of the run: {sorted(segments)}")
        left = sorted(os.listdir(self.tmpdir))
        if left:
            problems.append(f"left in the run's TMPDIR: {left}")
        temporaries = sorted(name for name in os.listdir(self.run_dir) if name.startswith("ckpt.bin.tmp."))
        if temporaries:
            problems.append(f"temporary checkpoint files left: {temporaries}")
        return problems

    def wait_for_no_leftovers(self):
        """Leftovers persist for CLEANUP_GRACE_S after the job's end: fail. (ddprun reaps
        its workers before it exits, so a clean run passes at the first look.)"""
        deadline = time.monotonic() + CLEANUP_GRACE_S
        while True:
            problems = self.leftovers()
            if not problems or time.monotonic() > deadline:
                return problems
            time.sleep(0.1)


def _creator(segment):
    """The creator's pid in a segment name ddp-shm-<pid>-<nonce>, or None."""
    parts = segment.split("-")
    return int(parts[2]) if len(parts) >= 4 and parts[2].isdigit() else None


# ---------------------------------------------------------------- the test

def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def tail(lines, n=40):
    return "\n".join("    " + line for line in lines[-n:])


def replay_command(args, seed):
    return (f"DDP_BUILD_BIN={args.bin} tests/chaos/chaos_test.py --ranks {args.ranks} "
            f"--transport {args.transport} --seed {seed}")


def check_common(run, status, restarts_expected):
    """What every run must do: succeed, restart as often as expected, see all its workers."""
    restarts = sum(1 for line in run.lines if RESTARTING in line)
    if status != 0:
        raise Failure(f"ddprun exited with status {status}")
    if run.steps_per_epoch != STEPS_PER_EPOCH:
        raise Failure(f"expected {STEPS_PER_EPOCH} steps per epoch, the demo says {run.steps_per_epoch}")
    if restarts != restarts_expected:
        raise Failure(f"{restarts} restarts of the worker group, expected {restarts_expected}")
    attempts = restarts + 1
    if len(run.workers) != attempts * run.args.ranks:
        raise Failure(f"saw {len(run.workers)} worker processes, expected {attempts * run.args.ranks} "
                      f"({attempts} attempts): the leftover checks would not be complete")
    tcp_groups = sum(1 for line in run.lines if line.startswith("[default0]:") and TCP_GROUP in line)
    expected_tcp_groups = attempts if run.args.transport == "tcp" else 0
    if tcp_groups != expected_tcp_groups:
        raise Failure(f"rank 0 said '{TCP_GROUP}' {tcp_groups} times, expected {expected_tcp_groups} "
                      f"(transport {run.args.transport}, {attempts} attempts)")
    if not any(address.endswith(f":{run.port}") for address in run.listening_seen.values()):
        raise Failure(f"never saw the store listen on port {run.port}: the socket checks would be blind")
    problems = run.wait_for_no_leftovers()
    if problems:
        raise Failure("; ".join(problems))


def run_baseline(args, work):
    run = Run(args, os.path.join(work, "uninterrupted"))
    try:
        status = run.execute()
        check_common(run, status, restarts_expected=0)
    except Failure as e:
        raise Failure(f"the uninterrupted run: {e}\n{tail(run.lines)}") from None
    finally:
        run.stop()
    with open(run.checkpoint, "rb") as f:
        return f.read()


def run_seed(args, work, seed, expected):
    plan = Plan(seed, args.ranks)
    print(f"chaos seed {seed}: {args.ranks} ranks, {args.transport}: SIGKILL rank {plan.rank} after "
          f"global step {plan.step} of {TOTAL_STEPS} (+{plan.delay_ms} ms); replay: "
          f"{replay_command(args, seed)}", flush=True)
    run = Run(args, os.path.join(work, f"seed-{seed}"), plan)
    started = time.monotonic()
    try:
        status = run.execute()
        if run.killed is None:
            raise Failure(f"the run ended (status {status}) before rank {plan.rank} was killed")
        check_common(run, status, restarts_expected=1)
        with open(run.checkpoint, "rb") as f:
            got = f.read()
        if got != expected:
            at = first_difference(got, expected)
            raise Failure(f"the final checkpoint differs from the uninterrupted run's: {len(got)} vs "
                          f"{len(expected)} bytes, first difference at byte {at}")
    except Failure as e:
        print(f"FAIL seed {seed}: {e}\n  replay: {replay_command(args, seed)}\n{tail(run.lines)}", flush=True)
        return False
    finally:
        run.stop()
        shutil.rmtree(run.run_dir, ignore_errors=True)
    resumed = [int(m.group(1)) for m in map(RESUMED.match, run.lines) if m]
    start = f"resumed at global step {resumed[0]}" if resumed else "restarted from scratch (no checkpoint yet)"
    print(f"PASS seed {seed}: killed rank {plan.rank} (pid {run.killed[0]}) after global step {run.killed[1]}, "
          f"{start}; final checkpoint identical ({len(expected)} bytes); nothing left behind "
          f"({time.monotonic() - started:.1f} s)", flush=True)
    return True


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, required=True, choices=(2, 3, 4), help="workers (one node)")
    parser.add_argument("--transport", choices=("shm", "tcp"), default="shm",
                        help="all-reduce through shared memory, or TCP (DDP_SHM_DISABLE=1)")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--seed", type=int, help="run this one seed (replay)")
    group.add_argument("--seeds", type=int, nargs="+", help="run these seeds")
    parser.add_argument("--bin", default=os.environ.get("DDP_BUILD_BIN", "build/bin"),
                        help="folder with ddprun and train_fashion_mnist (default: $DDP_BUILD_BIN or build/bin)")
    parser.add_argument("--plan", action="store_true", help="print what each seed would do, run nothing")
    args = parser.parse_args()
    args.seeds = [args.seed] if args.seed is not None else args.seeds
    for name in ("ddprun", "train_fashion_mnist"):
        if not args.plan and not os.access(os.path.join(args.bin, name), os.X_OK):
            parser.error(f"{os.path.join(args.bin, name)} is not an executable (build it, or pass --bin)")
    return args


def main():
    args = parse_args()
    if args.plan:
        for seed in args.seeds:
            p = Plan(seed, args.ranks)
            print(f"seed {seed}: {args.ranks} ranks, {args.transport}: kill rank {p.rank} after global step "
                  f"{p.step} (+{p.delay_ms} ms)")
        return 0
    if not os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"):
        print("dataset-fashion-mnist is not installed: skipped")
        return 77

    def interrupted(signo, frame):
        raise Interrupted(signal.Signals(signo).name)
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)

    work = tempfile.mkdtemp(prefix="ddp-chaos-")
    failed = []
    try:
        started = time.monotonic()
        expected = run_baseline(args, work)
        print(f"uninterrupted run: {args.ranks} ranks, {args.transport}, {TOTAL_STEPS} steps, final checkpoint "
              f"{len(expected)} bytes ({time.monotonic() - started:.1f} s)", flush=True)
        for seed in args.seeds:
            if not run_seed(args, work, seed, expected):
                failed.append(seed)
    except Failure as e:
        print(f"FAIL: {e}", flush=True)
        return 1
    except Interrupted as e:
        print(f"interrupted by {e}", flush=True)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failed:
        print(f"FAILED seeds: {failed}; replay one with: {replay_command(args, failed[0])}")
        return 1
    print(f"all {len(args.seeds)} seeds passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
