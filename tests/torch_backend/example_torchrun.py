"""examples/torch_fashion_mnist_elastic/train.py restarts cleanly under torchrun.

torchrun (tests/pytorch/run_torchrun.py) runs the example on 2 ranks with --max_restarts=1
and the package on PYTHONPATH; rank 1's worker is SIGKILLed once rank 0 passed global
step 12. Expected: torchrun restarts both workers (the example opted in, but torchrun
passes no control channel, so nothing is kept), the new ones resume from the checkpoint
rank 0 wrote, rank 0's steps go on from the checkpoint's step + 1 without a gap, the run
ends with its accuracy and torchrun exits 0.

    example_torchrun.py        (DDP_BUILD_BIN: the build's bin folder; exit 77: skipped)
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from driver import PYTHON, TORCHRUN, base_env, free_port, package_dir_or_skip, skip

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "torch_fashion_mnist_elastic" / "train.py"
DATA = Path("/usr/share/datasets/fashion-mnist")
LIMIT_S = 240
STEP = re.compile(r"^(?:\[\S+\]:)?step=(\d+) world=(\d+) rank=0 ")
RESUMED = re.compile(r"resumed from checkpoint \S+: epoch \d+, position \d+, global step (\d+)")


def fail(why, out):
    print(out)
    print(f"FAILED: {why}")
    sys.exit(1)


def workers_of(marker, local_rank):
    """Pids of the example's processes for `marker` (its checkpoint path) with LOCAL_RANK."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in cmdline and f"LOCAL_RANK={local_rank}".encode() in environ:
            pids.append(int(entry.name))
    return pids


def main():
    package = package_dir_or_skip()
    if not (DATA / "train-images-idx3-ubyte.gz").exists():
        skip(f"the Fashion-MNIST files are not in {DATA} (scripts/setup installs them)")
    with tempfile.TemporaryDirectory(prefix="example_torchrun_") as tmp:
        checkpoint = str(Path(tmp) / "ckpt.pt")
        env = base_env(tmp)
        env["PYTHONPATH"] = str(package)
        argv = [PYTHON, str(TORCHRUN), "--nnodes=1", "--nproc_per_node=2", "--max_restarts=1",
                "--monitor_interval=0.1", "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{free_port()}", "--rdzv_id=example_torchrun",
                str(EXAMPLE), "--epochs=1", "--train-limit=3840", "--test-limit=500",
                "--hidden=64", "--log-every=1", "--checkpoint-every=5", "--throttle-ms=60",
                f"--checkpoint={checkpoint}"]
        proc = subprocess.Popen(argv, env=env, cwd=tmp, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines, killed = [], []

        def read():
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                m = STEP.search(lines[-1])
                if m and int(m.group(1)) >= 12 and not killed:
                    pids = workers_of(checkpoint, 1)
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                    killed.append((int(m.group(1)), pids))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            reader.join(timeout=10)
        out = "\n".join(lines)
        if not killed or not killed[0][1]:
            fail(f"rank 1's worker was not found to kill ({killed})", out)
        if proc.returncode != 0:
            fail(f"torchrun exited {proc.returncode}", out)
        resumed = [int(m.group(1)) for m in map(RESUMED.search, lines) if m]
        if len(resumed) != 1:  # rank 0 of the restarted group says it
            fail(f"expected one resume from the checkpoint: {resumed}", out)
        steps = [int(m.group(1)) for m in map(STEP.search, lines) if m]
        restart_at = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
        before, after = steps[:restart_at], steps[restart_at:]
        if before != list(range(1, len(before) + 1)):
            fail(f"rank 0's steps before the kill: {before}", out)
        if after != list(range(resumed[0] + 1, resumed[0] + 1 + len(after))):
            fail(f"rank 0's steps after resuming from step {resumed[0]}: {after}", out)
        if not any("final test accuracy:" in line for line in lines):
            fail("no final accuracy", out)
        print(f"killed rank 1 (pids {killed[0][1]}) at rank 0's step {killed[0][0]}; "
              f"resumed from step {resumed[0]}; rank 0's steps 1-{before[-1]}, then "
              f"{after[0]}-{after[-1]}; {[l for l in lines if 'final test accuracy' in l][0]}")
    os._exit(0)


if __name__ == "__main__":
    main()
