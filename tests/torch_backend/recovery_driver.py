"""In-place recovery of PyTorch scripts (ddp_torch.reform) under real ddprun agents on
this host, one worker per node (tests/torch_backend/CMakeLists.txt).

    recovery_driver.py in_place   recovery_worker.py in_place on 3 agents (--nnodes=2:5,
                                  c10d rendezvous, short keep-alives). Four changes, each
                                  announced to the workers through DIR/phase first:
                                    a node dies (agent 3 SIGKILLed): the survivors, in DDP
                                      steps, catch GroupChanged from loss.backward()
                                    a node joins (agent 4): they catch it from all_reduce;
                                      agent 4 dies as they re-form: reform() raises
                                      GroupChanged, and the next one joins world 2
                                    a node joins (agent 5): from work.wait()
                                    a worker dies (agent 5's, SIGKILLed; its agent starts
                                      another): from work.wait() on the dead peer
                                  Agents 1 and 2 each start one worker process, ever; agents
                                  1, 2 and 5 end with exit 0.
    recovery_driver.py restart    recovery_worker.py restart (no opt-in) on 2 agents: a
                                  worker SIGKILLed; the other node's worker is restarted
                                  too (a new pid), as before in-place recovery
    recovery_driver.py misuse     recovery_misuse.py, one process over env:// (no agent)

Exits 77 (skipped) without torch or ddp_torch. Everything started runs in its own
session, killed at the end; the temporary directory is removed.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from driver import PYTHON, base_env, free_port, package_dir_or_skip

HERE = Path(__file__).resolve().parent
WAIT_S = 90  # for one step of a scenario, on a loaded 2-core machine
CONF = "keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=1,join_timeout=60"


class Job:
    """ddprun agents of one job on this host; each agent's output in a file of its own."""

    def __init__(self, tmp, mode, nnodes):
        self.tmp, self.mode, self.nnodes = tmp, mode, nnodes
        self.endpoint = f"127.0.0.1:{free_port()}"
        self.agents = []  # (Popen, output path)

    def start_agent(self):
        index = len(self.agents)
        env = base_env(self.tmp)
        argv = [str(Path(os.environ["DDP_BUILD_BIN"]) / "ddprun"), f"--nnodes={self.nnodes}",
                "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint={self.endpoint}",
                "--rdzv_id=torch_in_place", f"--rdzv_conf={CONF}", "--max_restarts=3",
                "--monitor_interval=0.1", str(HERE / "recovery_worker.py"), str(self.tmp), self.mode]
        out = self.tmp / f"agent{index}.log"
        with open(out, "w") as sink:
            proc = subprocess.Popen(argv, env=env, cwd=self.tmp, stdout=sink, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.agents.append((proc, out))
        return index

    def start_store_host(self):
        """Starts the first agent and waits until it hosts the store on the endpoint: agents
        started together race to bind it, and the test kills nodes other than the host."""
        index = self.start_agent()
        host, port = self.endpoint.rsplit(":", 1)

        def listens():
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                return True
            except OSError:
                return False

        self.wait_for("the first agent hosts the store", listens)
        return index

    def output(self, index):
        return self.agents[index][1].read_text(errors="replace")

    def count(self, index, pattern):
        return len(re.findall(pattern, self.output(index)))

    def wait_for(self, what, condition):
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if condition():
                return
            if any(proc.poll() not in (None, 0) for proc, _ in self.agents if proc.returncode != -9):
                break
            time.sleep(0.05)
        raise AssertionError(f"never: {what}\n{self.all_output()}")

    def kill_agent(self, index):
        proc = self.agents[index][0]
        os.killpg(proc.pid, signal.SIGKILL)  # the node dies: its agent and its worker
        proc.wait()
        proc.returncode = -9

    def worker_pids(self, index):
        return [int(p) for p in re.findall(r"started pid=(\d+)", self.output(index))]

    def finish(self, indices):
        """Waits for the agents at `indices` to exit; returns their exit codes."""
        codes = []
        for i in indices:
            try:
                codes.append(self.agents[i][0].wait(timeout=WAIT_S))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def all_output(self):
        return "\n".join(f"---- agent {i}\n{self.output(i)}" for i in range(len(self.agents)))

    def kill_all(self):
        for proc, _ in self.agents:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


# The workers' timeout is 60 s: a change noticed by a timeout would take longer than this.
CHANGE_S = 30


def changed(job, what, condition, started):
    """Waits for `condition` after a change made at `started`; it must come before any timeout."""
    job.wait_for(what, condition)
    elapsed = time.monotonic() - started
    print(f"[driver] {what} after {elapsed:.1f} s")
    assert elapsed < CHANGE_S, f"{what} took {elapsed:.1f} s: a timeout, not the round's end?"


def formed(job, indices, world, phase):
    pattern = rf"formed rank=\d+ world={world} phase={phase}\b"
    return lambda: all(job.count(i, pattern) >= 1 for i in indices)


def set_phase(tmp, phase):
    (tmp / "phase.tmp").write_text(str(phase))
    (tmp / "phase.tmp").rename(tmp / "phase")


def in_place(tmp):
    set_phase(tmp, 0)
    job = Job(tmp, "in_place", "2:5")
    try:
        first = job.start_store_host()
        second, third = job.start_agent(), job.start_agent()
        survivors = (first, second)
        job.wait_for("3 workers in DDP steps", formed(job, (first, second, third), 3, 0))
        set_phase(tmp, 1)
        job.kill_agent(third)
        changed(job, "a node lost: the survivors re-formed into world 2", formed(job, survivors, 2, 1),
                time.monotonic())
        set_phase(tmp, 2)
        started = time.monotonic()
        fourth = job.start_agent()
        # Its worker starts once the round with it formed, and imports torch: the
        # survivors wait in reform() for it when its node dies.
        job.wait_for("agent 4 started its worker", lambda: children(job.agents[fourth][0].pid))
        job.kill_agent(fourth)
        changed(job, "a node joined and was lost: world 2 again", formed(job, survivors, 2, 2), started)
        set_phase(tmp, 3)
        started = time.monotonic()
        fifth = job.start_agent()
        changed(job, "a node joined: world 3", formed(job, (first, second, fifth), 3, 3), started)
        set_phase(tmp, 4)
        os.kill(job.worker_pids(fifth)[-1], signal.SIGKILL)
        changed(job, "agent 5's worker restarted: world 3", formed(job, (first, second, fifth), 3, 4),
                time.monotonic())
        (tmp / "stop").write_text("")
        codes = job.finish((first, second, fifth))
        print(job.all_output())
        assert codes == [0, 0, 0], f"agents' exit codes {codes}"
        for i in survivors:
            assert len(job.worker_pids(i)) == 1, f"agent {i} started {job.worker_pids(i)}"
            assert job.count(i, r"changed at backward: ") >= 1, f"agent {i}: no GroupChanged at backward"
            assert job.count(i, r"changed at all_reduce: ") == 1, f"agent {i}: all_reduce"
            assert job.count(i, r"reform interrupted: round \d+ ended while this worker joined it") >= 1, \
                f"agent {i}: reform() did not raise GroupChanged when its round ended"
            assert job.count(i, r"changed at wait: ") == 2, f"agent {i}: wait"
            assert job.count(i, r"stale ok") >= 4, f"agent {i}: stale groups unchecked"
            assert job.count(i, r"done rank=") == 1, f"agent {i}: not done"
        assert len(job.worker_pids(fifth)) == 2, f"agent 5 started {job.worker_pids(fifth)}"
        return True
    finally:
        job.kill_all()


def children(pid):
    """The processes `pid` started (any of its threads)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += (task / "children").read_text().split()
        except OSError:
            pass
    return found


def restart(tmp):
    job = Job(tmp, "restart", "2:3")
    try:
        first, second = job.start_agent(), job.start_agent()
        world2 = r"formed rank=\d+ world=2"
        job.wait_for("2 workers", lambda: job.count(first, world2) and job.count(second, world2))
        os.kill(job.worker_pids(second)[-1], signal.SIGKILL)
        job.wait_for("both nodes restarted their workers",
                     lambda: job.count(first, world2) >= 2 and job.count(second, world2) >= 2)
        (tmp / "stop").write_text("")
        codes = job.finish((first, second))
        print(job.all_output())
        assert codes == [0, 0], f"agents' exit codes {codes}"
        pids = job.worker_pids(first)
        assert len(pids) == 2 and pids[0] != pids[1], f"agent 0's workers: {pids}"
        return True
    finally:
        job.kill_all()


def misuse(tmp, package_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDP_", "TORCHELASTIC_"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", PYTHONPATH=str(package_dir), TMPDIR=str(tmp))
    proc = subprocess.run([PYTHON, str(HERE / "recovery_misuse.py")], env=env, cwd=tmp,
                          capture_output=True, text=True, timeout=WAIT_S)
    print(proc.stdout + proc.stderr)
    return proc.returncode == 0 and "misuse: ok" in proc.stdout


def main():
    package_dir = package_dir_or_skip()
    scenario = sys.argv[1]
    tmp = Path(tempfile.mkdtemp(prefix="ddp-torch-recovery-"))
    start = time.monotonic()
    try:
        if scenario == "misuse":
            passed = misuse(tmp, package_dir)
        else:
            passed = {"in_place": in_place, "restart": restart}[scenario](tmp)
    except AssertionError as e:
        print(f"[driver] {e}")
        passed = False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"[driver] {scenario}: {time.monotonic() - start:.1f} s")
    print("PASSED" if passed else "FAILED")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
