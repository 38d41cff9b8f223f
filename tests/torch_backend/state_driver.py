"""Runs one test of ddp_torch.sync_state or ElasticDistributedSampler (tests/torch_backend/CMakeLists.txt).

    state_driver.py sync       state_sync.py on 3 ranks started here over env:// (backend "ddp",
                               no launcher, no agent); every rank must print "rank <r>: ok", and
                               rank 0, a fresh process among two live ones, must log that it
                               received the state of rank 1 (live)
    state_driver.py sampler    sampler_check.py in one process: the sampler against torch's
                               DistributedSampler and across world sizes

Exits 77 (skipped) when /usr/bin/python3 has no torch or the build has no ddp_torch.
Every process started runs in its own session, killed at the end; the temporary
directory (their working directory and TMPDIR) is removed.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from driver import PYTHON, base_env, free_port, package_dir_or_skip

HERE = Path(__file__).resolve().parent
LIMIT_S = 120
RANKS = 3


def start(argv, env, tmp):
    return subprocess.Popen(argv, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def finish(procs):
    """Each process's (exit code, output); kills every session at the end."""
    results = []
    deadline = time.monotonic() + LIMIT_S
    try:
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate()
                out += f"\n[driver] killed after {LIMIT_S} s"
            results.append((proc.returncode, out))
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return results


def sampler(env, tmp):
    [(code, out)] = finish([start([PYTHON, str(HERE / "sampler_check.py")], env, tmp)])
    print(out)
    return code == 0 and "sampler: ok" in out


def sync(env, tmp):
    port = free_port()
    procs = []
    for rank in range(RANKS):
        rank_env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                        WORLD_SIZE=str(RANKS), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(RANKS))
        procs.append(start([PYTHON, str(HERE / "state_sync.py")], rank_env, tmp))
    results = finish(procs)
    for rank, (code, out) in enumerate(results):
        print(f"---- rank {rank} (exit {code})\n{out}")
    oks = set(int(r) for r in re.findall(r"rank (\d+): ok", "".join(o for _, o in results)))
    received = re.search(r"ddp_torch: received the state of rank 1 \(live\): [0-9.]+ MiB in [0-9.]+ s",
                         results[0][1])
    if not received:
        print("[driver] rank 0 did not log that it received the state of rank 1 (live)")
    return all(c == 0 for c, _ in results) and oks == set(range(RANKS)) and bool(received)


def main():
    package_dir = package_dir_or_skip()
    test = {"sampler": sampler, "sync": sync}[sys.argv[1]]
    start_s = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ddp-torch-state-") as tmp:
        env = base_env(tmp)
        env["PYTHONPATH"] = str(package_dir)
        passed = test(env, Path(tmp))
    print(f"[driver] {sys.argv[1]}: {time.monotonic() - start_s:.1f} s: {'PASSED' if passed else 'FAILED'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
