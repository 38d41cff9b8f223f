"""Runs one test of the torch backend "ddp" (tests/torch_backend/CMakeLists.txt).

    driver.py collectives ddprun|torchrun NPROC   collectives.py on NPROC ranks
    driver.py ddp ddprun|torchrun                 ddp_train.py on 2 ranks
    driver.py steps                               steps.py on 2 ranks under ddprun
                                                  --status_port (DDP steps in /status)
    driver.py errors mismatch|timeout|dead        errors.py, 2 ranks started here (env://)
    driver.py installed                           `cmake --install --component ddp_torch`
                                                  into a temporary prefix, the built ddprun
                                                  copied to its bin/: installed.py on 2 ranks
                                                  finds ddp_torch in <prefix>/lib/ddprun/python
    driver.py cuda                                cuda.py on 2 ranks under ddprun: CUDA tensors
                                                  through ddp::worker's NCCL groups; skipped
                                                  unless torch sees 2 CUDA devices and the
                                                  build has NCCL (DDP_WITH_NCCL=1, set by CMake)

Under ddprun ($DDP_BUILD_BIN/ddprun --standalone) the workers find ddp_torch
through the PYTHONPATH ddprun's agent gives them: the test's own environment
has no PYTHONPATH. Under torchrun (python3 -m torch.distributed.run, through
tests/pytorch/run_torchrun.py) and env:// the test sets PYTHONPATH to the build's
package folder, as a user would. Every rank must print "rank <r>: ok". Exits 77
(skipped) when /usr/bin/python3 has no torch or the build has no ddp_torch.
Everything started runs in its own session, killed at the end; the temporary
directory (the workers' TMPDIR) is removed.
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

PYTHON = "/usr/bin/python3"
HERE = Path(__file__).resolve().parent
TORCHRUN = HERE.parent / "pytorch" / "run_torchrun.py"
LIMIT_S = 240


def skip(why):
    print(f"skipped: {why}")
    sys.exit(77)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(tmp):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHON_EXEC=PYTHON, TMPDIR=str(tmp), PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    return env


def run(argv, env, tmp):
    """Runs argv in its own session; returns (exit code, output). Kills the session at the end."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=tmp, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n[driver] killed after {LIMIT_S} s"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    print(f"[driver] {' '.join(map(str, argv))}: exit {proc.returncode} after "
          f"{time.monotonic() - start:.1f} s")
    return proc.returncode, out


def launch(launcher, nproc, script, package_dir, tmp, extra_flags=(), script_args=()):
    env = base_env(tmp)
    flags = [f"--nproc_per_node={nproc}", "--monitor_interval=0.1", *extra_flags]
    if launcher == "ddprun":
        argv = [str(Path(os.environ["DDP_BUILD_BIN"]) / "ddprun"), "--standalone"] + flags
    else:
        env["PYTHONPATH"] = str(package_dir)
        argv = [PYTHON, str(TORCHRUN), "--nnodes=1", "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{free_port()}", "--rdzv_id=torch_backend_test"] + flags
    return run(argv + [str(HERE / script), *script_args], env, tmp)


def spawn_pair(scenario, package_dir, tmp):
    """errors.py <scenario> on 2 ranks over env:// (no launcher: a dead rank is the test)."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = base_env(tmp)
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", PYTHONPATH=str(package_dir))
        procs.append(subprocess.Popen([PYTHON, str(HERE / "errors.py"), scenario], env=env, cwd=tmp,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    outputs, codes = [], []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        outputs.append(out)
        codes.append(proc.returncode)
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return codes, outputs


def installed(tmp):
    """ddprun run from a prefix that holds the installed package."""
    prefix = tmp / "prefix"
    build_dir = Path(os.environ["DDP_BUILD_BIN"]).parent
    code, out = run([os.environ["DDP_CMAKE"], "--install", str(build_dir), "--prefix", str(prefix),
                     "--component", "ddp_torch"], base_env(tmp), tmp)
    if code != 0:
        print(out)
        return 1, out
    (prefix / "bin").mkdir()
    shutil.copy2(build_dir / "bin" / "ddprun", prefix / "bin" / "ddprun")
    package = prefix / "lib" / "ddprun" / "python"
    argv = [str(prefix / "bin" / "ddprun"), "--standalone", "--nproc_per_node=2",
            "--monitor_interval=0.1", str(HERE / "installed.py"), str(package)]
    return run(argv, base_env(tmp), tmp)


def cuda_missing_reason():
    """Why `driver.py cuda` cannot run here, or None: it needs a build with NCCL
    and a torch that sees at least 2 CUDA devices (asked only with NCCL)."""
    if os.environ.get("DDP_WITH_NCCL") != "1":
        return "the build has no NCCL (DDP_WITH_NCCL is off; CUDA tensors need ddp::worker's NCCL groups)"
    reasons = []
    count_devices = "import torch; print(torch.cuda.device_count(), torch.version.cuda)"
    probe = subprocess.run([PYTHON, "-c", count_devices], capture_output=True, text=True)
    if probe.returncode != 0:
        reasons.append(f"{PYTHON} could not count CUDA devices: {probe.stderr.strip()[-300:]}")
    else:
        count, cuda_version = probe.stdout.split()
        if cuda_version == "None":
            reasons.append(f"{PYTHON}'s torch is built without CUDA")
        elif int(count) < 2:
            reasons.append(f"torch sees {count} CUDA device(s), the test needs 2")
    return "; ".join(reasons) or None


def check_ok_lines(output, ranks):
    oks = set(int(r) for r in re.findall(r"rank (\d+): ok", output))
    return oks == set(range(ranks))


def package_dir_or_skip():
    """The build's folder that holds ddp_torch; exits 77 without torch or ddp_torch."""
    if subprocess.run([PYTHON, "-c", "import torch.distributed"], capture_output=True).returncode:
        skip(f"{PYTHON} has no torch (scripts/setup installs python3-torch)")
    package_dir = Path(os.environ["DDP_BUILD_BIN"]).parent / "lib" / "ddprun" / "python"
    if not (package_dir / "ddp_torch" / "__init__.py").exists():
        skip(f"no ddp_torch in {package_dir} (build the ddp_torch target)")
    return package_dir


def main():
    package_dir = package_dir_or_skip()
    test, arg = sys.argv[1], (sys.argv[2:] or [""])[0]
    if test == "cuda":
        reason = cuda_missing_reason()
        if reason:
            skip(reason)
    tmp = Path(tempfile.mkdtemp(prefix="ddp-torch-backend-"))
    try:
        if test == "installed":
            code, out = installed(tmp)
            print(out)
            passed = code == 0 and check_ok_lines(out, 2)
        elif test == "errors":
            codes, outputs = spawn_pair(arg, package_dir, tmp)
            for rank, out in enumerate(outputs):
                print(f"---- rank {rank} (exit {codes[rank]})\n{out}")
            ranks_ok = 2 if arg != "dead" else 1  # the dead rank says nothing
            passed = all(c == 0 for c in codes) and check_ok_lines("".join(outputs), ranks_ok)
        elif test == "cuda":
            code, out = launch("ddprun", 2, "cuda.py", package_dir, tmp)
            print(out)
            passed = code == 0 and check_ok_lines(out, 2)
        elif test == "steps":
            port = free_port()
            code, out = launch("ddprun", 2, "steps.py", package_dir, tmp,
                               [f"--status_port={port}"], [str(port)])
            print(out)
            passed = code == 0 and check_ok_lines(out, 2)
        else:
            nproc = int(sys.argv[3]) if test == "collectives" else 2
            script = {"collectives": "collectives.py", "ddp": "ddp_train.py"}[test]
            code, out = launch(arg, nproc, script, package_dir, tmp)
            print(out)
            passed = code == 0 and check_ok_lines(out, nproc)
        print("PASSED" if passed else "FAILED")
        return 0 if passed else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
