#!/usr/bin/python3
"""bench/torch_backend/torch_backend_bench.py, run as its users run it, on a tiny workload.

    torch_backend_bench_test.py SOURCE_DIR CASE

  missing   no ddp_torch anywhere: exit 2, nothing on stdout, the reason on stderr
  stand_in  a stand-in ddp_torch whose "ddp" is torch's Gloo and which, given a progress
            page, checks it as worker_lib's progress_recorder.cc does and writes 7 steps and
            11 completed collectives into it: exit 0, stdout exactly the three kinds of
            lines with consistent figures, the page's figures read back
  failing   a stand-in whose "ddp" cannot be created: exit 1 and no figure on stdout

Exits 77 (skipped, the reason printed) when /usr/bin/python3 has no torch.
"""
import os
import re
import subprocess
import sys
import tempfile

PYTHON = "/usr/bin/python3"
TINY = ["--rounds", "1", "--layers", "8,8,2", "--batch", "4", "--steps", "2", "--warmup", "1",
        "--sizes", "4096", "--seconds", "0.01", "--run-timeout", "120"]
TINY_PARAMS = 8 * 8 + 8 + 8 * 2 + 2

# A stand-in for the real module: "ddp" is torch's Gloo. It accepts the page only as
# worker_lib's map_progress_page does (sealed against growing and shrinking, one page,
# the magic and version), then writes what a recording backend would: the pid, 7 DDP
# steps and one group slot in use with 11 completed collectives (progress_page.h).
STAND_IN = r'''
import fcntl, mmap, os, struct
import torch.distributed as dist

def _record_into_page():
    text = os.environ.get("DDP_PROGRESS_FD")
    if not text:
        return
    fd = int(text)
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    needed = fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
    if seals & needed != needed or os.fstat(fd).st_size != 4096:
        raise RuntimeError("DDP_PROGRESS_FD is not a sealed one-page memfd")
    page = mmap.mmap(fd, 4096)
    if struct.unpack_from("<II", page, 0) != (0x50504444, 1):
        raise RuntimeError("the progress page lacks the magic and version")
    struct.pack_into("<i", page, 8, os.getpid())
    struct.pack_into("<Q", page, 16, 7)
    struct.pack_into("<I", page, 80, 1)
    struct.pack_into("<Q", page, 80 + 56, 11)

def _create(store, rank, size, timeout):
    if os.environ.get("STAND_IN_FAILS"):
        raise RuntimeError("the stand-in backend refuses to start")
    _record_into_page()
    return dist.ProcessGroupGloo(store, rank, size, timeout)

dist.Backend.register_backend("ddp", _create)
'''

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def run_bench(source, pythonpath, extra_env=None):
    env = dict(os.environ, PYTHONPATH=pythonpath)
    env.pop("DDP_PROGRESS_FD", None)
    env.update(extra_env or {})
    with tempfile.TemporaryDirectory(prefix="torch_backend_bench_test_") as empty_build:
        return subprocess.run(
            [PYTHON, os.path.join(source, "bench/torch_backend/torch_backend_bench.py"),
             "--build", empty_build, "--python", PYTHON] + TINY,
            env=env, capture_output=True, text=True, timeout=600)


def with_stand_in(source, extra_env=None):
    with tempfile.TemporaryDirectory(prefix="torch_backend_bench_test_") as modules:
        os.mkdir(os.path.join(modules, "ddp_torch"))
        with open(os.path.join(modules, "ddp_torch", "__init__.py"), "w") as f:
            f.write(STAND_IN)
        return run_bench(source, modules, extra_env)


def case_missing(source):
    out = run_bench(source, "")
    check(out.returncode == 2, f"exit {out.returncode}, not 2")
    check(out.stdout == "", f"stdout is not empty: {out.stdout!r}")
    check("cannot import ddp_torch" in out.stderr and "No module named 'ddp_torch'" in out.stderr,
          f"stderr does not say why: {out.stderr!r}")
    return out


NUMBER = r"([0-9]+(?:\.[0-9]+)?)"


def bounds(text):
    """The interval a printed figure rounds: half a unit of its last digit either side."""
    half = 0.5 * 10 ** -(len(text.split(".")[1]) if "." in text else 0)
    return float(text) - half, float(text) + half


def check_ratio(m, line):
    """ratio=<y/x>, as printed (2 decimals), from the unrounded x and y: within what the
    rounding of all three allows."""
    (x_lo, x_hi), (y_lo, y_hi) = bounds(m.group(1)), bounds(m.group(2))
    ratio = float(m.group(3))
    check(x_lo > 0 and y_lo / x_hi - 0.005 <= ratio <= y_hi / x_lo + 0.005,
          f"ratio={ratio} is not y/x in: {line}")


def case_stand_in(source):
    out = with_stand_in(source)
    check(out.returncode == 0, f"exit {out.returncode}, not 0")
    lines = out.stdout.splitlines()
    check(len(lines) == 3, f"{len(lines)} lines on stdout, not 3: {lines}")
    if len(lines) != 3:
        return out
    m = re.fullmatch(rf"torch_backend model=mlp params={TINY_PARAMS} ranks=2 "
                     rf"gloo_samples_per_s={NUMBER} ddp_samples_per_s={NUMBER} ratio={NUMBER}",
                     lines[0])
    check(m is not None, f"not the training line: {lines[0]}")
    if m:
        check_ratio(m, lines[0])
    m = re.fullmatch(rf"torch_allreduce bytes=4096 ranks=2 gloo_busbw_gbps={NUMBER} "
                     rf"ddp_busbw_gbps={NUMBER} ratio={NUMBER}", lines[1])
    check(m is not None, f"not the all-reduce line: {lines[1]}")
    if m:
        check_ratio(m, lines[1])
    m = re.fullmatch(rf"torch_backend_progress ranks=2 step_ms_unrecorded={NUMBER} "
                     rf"step_ms_recorded={NUMBER} overhead_pct=-?{NUMBER} runs=1 "
                     r"recorded_steps=7 recorded_collectives=11", lines[2])
    check(m is not None, f"not the progress line with the pages' 7 steps and 11 "
          f"collectives: {lines[2]}")
    check(re.search(r"train ddp \(progress pages\).*pages: pid=\[[1-9][0-9]*, [1-9][0-9]*\]",
                    out.stderr) is not None,
          "stderr does not show both ranks' pids read back from their pages")
    return out


def case_failing(source):
    out = with_stand_in(source, {"STAND_IN_FAILS": "1"})
    check(out.returncode == 1, f"exit {out.returncode}, not 1")
    check(not re.search(r"^torch_", out.stdout, re.M), f"figures on stdout: {out.stdout!r}")
    check("the stand-in backend refuses to start" in out.stderr,
          "stderr does not carry the rank's error")
    return out


CASES = {"missing": case_missing, "stand_in": case_stand_in, "failing": case_failing}


def main():
    source, case = sys.argv[1], sys.argv[2]
    probe = subprocess.run([PYTHON, "-c", "import torch.distributed"], capture_output=True)
    if probe.returncode != 0:
        print(f"skipped: {PYTHON} cannot import torch.distributed")
        return 77
    out = CASES[case](source)
    if failures:
        print(f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}", file=sys.stderr)
        for failure in failures:
            print(f"FAILED: {failure}", file=sys.stderr)
        return 1
    print(f"torch_backend_bench {case}: as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
