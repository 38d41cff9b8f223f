#!/usr/bin/python3
"""torch_backend_bench: PyTorch on backend "ddp" (import ddp_torch) against the same
program on torch's "gloo", same machine, same run, 2 ranks.

The driver starts each run's 2 ranks itself, through torch's env:// variables, as
torchrun and ddprun do (torch_backend_worker.py is the rank program), so that it can
give each rank of a "ddp" run a progress page of its own, made as ddprun's agent makes
it, and read the page back once the run is over. Runs are interleaved, --rounds times:

  train      DistributedDataParallel on an MLP of 3.6 M parameters (784,1536,1536,10):
             "gloo", "ddp" with a progress page per rank (as under ddprun) and "ddp"
             with DDP_PROGRESS_FD unset (no recording);
  allreduce  torch.distributed.all_reduce, float32 SUM, 4 KiB, 1 MiB, 256 MiB: "gloo",
             "ddp" with progress pages.

stdout gets exactly these lines; everything else (each run's figures, the pages read
back) goes to stderr:

  torch_backend model=mlp params=<n> ranks=2 gloo_samples_per_s=<x> ddp_samples_per_s=<y> ratio=<y/x>
  torch_allreduce bytes=<b> ranks=2 gloo_busbw_gbps=<x> ddp_busbw_gbps=<y> ratio=<y/x>   (one per size)
  torch_backend_progress ranks=2 step_ms_unrecorded=<a> step_ms_recorded=<b> overhead_pct=<c> runs=<r> recorded_steps=<s> recorded_collectives=<k>

Samples/s and bus bandwidth are each backend's best round (the same rule for both: the
round least disturbed by other work on the machine); busbw is nccl-tests' all-reduce bus
bandwidth, bytes / time * 2(n-1)/n, in GB/s (10^9 bytes, 4 significant digits). The
progress line gives the median step times of the "ddp" training runs with and without
pages, and overhead_pct: over the rounds, the median of each round's pair (run side by
side, in turns first) of recorded / unrecorded - 1. recorded_steps and
recorded_collectives are what the pages of the last recorded run held (the fewest over its
ranks); a page that recorded no DDP step or no collective makes the progress figure
invalid, and the line says so.

When ddp_torch cannot be imported, the driver says why on stderr and exits 2 without
running anything; a run that fails or outlasts --run-timeout makes it exit 1.

Usage: torch_backend_bench.py [--build DIR] [--rounds 3] [--steps 30] [--seconds 0.5]
ddp_torch is looked up on PYTHONPATH, then in DIR/lib/ddprun/python (DIR: the build
folder, build/ of this checkout by default), which is where the build puts it.
"""
import argparse
import fcntl
import json
import math
import mmap
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "torch_backend_worker.py")
RANKS = 2

# The progress page's layout (worker_contract/include/ddp/worker_contract/progress_page.h,
# version 1, x86-64): the header fields and the group slots this driver reads back.
PAGE_BYTES = 4096
PAGE_MAGIC = 0x50504444
PAGE_VERSION = 1
PAGE_PID = 8             # Page::pid, int32: the rank's pid once it mapped the page
PAGE_STEPS = 16          # Page::steps, uint64
PAGE_GROUPS = 80         # Page::groups[0]
MAX_GROUPS = 8
GROUP_SLOT_BYTES = 104   # sizeof(GroupSlot)
SLOT_COMPLETED = 56      # GroupSlot::completed, uint64 (in_use: uint32 at 0)


def log(message):
    print(message, file=sys.stderr, flush=True)


class ProgressPage:
    """One rank's progress page, made as ddprun's agent makes it
    (agent/src/progress_page_file.cc): a one-page memfd, sealed against growing and
    shrinking, that starts with the page's magic and version, the rest zero. The rank
    finds it through DDP_PROGRESS_FD; this side keeps a mapping to read it back."""

    def __init__(self):
        self.fd = os.memfd_create("torch-backend-bench-progress",
                                  os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, PAGE_BYTES)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
        self.memory = mmap.mmap(self.fd, PAGE_BYTES)
        struct.pack_into("<II", self.memory, 0, PAGE_MAGIC, PAGE_VERSION)

    def attached_pid(self):
        return struct.unpack_from("<i", self.memory, PAGE_PID)[0]

    def steps(self):
        return struct.unpack_from("<Q", self.memory, PAGE_STEPS)[0]

    def collectives(self):
        """Collectives completed, over every group slot in use."""
        total = 0
        for i in range(MAX_GROUPS):
            slot = PAGE_GROUPS + i * GROUP_SLOT_BYTES
            if struct.unpack_from("<I", self.memory, slot)[0]:
                total += struct.unpack_from("<Q", self.memory, slot + SLOT_COMPLETED)[0]
        return total

    def close(self):
        self.memory.close()
        os.close(self.fd)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(REPO, "build"),
                   help="the build folder whose lib/ddprun/python holds ddp_torch")
    p.add_argument("--python", default=os.environ.get("PYTHON_EXEC", "/usr/bin/python3"),
                   help="a Python with torch 1.13 (default: PYTHON_EXEC, else /usr/bin/python3)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every run")
    p.add_argument("--layers", default="784,1536,1536,10", help="the MLP's widths")
    p.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    p.add_argument("--steps", type=int, default=30, help="timed training steps per run")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps or ops first")
    p.add_argument("--sizes", default="4096,1048576,268435456", help="all-reduce bytes")
    p.add_argument("--seconds", type=float, default=0.5, help="timed seconds per size")
    p.add_argument("--run-timeout", type=float, default=300, help="seconds one run may take")
    return p.parse_args()


def worker_env(a):
    """The driver's environment, with the build's module folder on PYTHONPATH after the
    user's (as ddprun puts it) and no progress page of the driver's own."""
    env = dict(os.environ)
    env.pop("DDP_PROGRESS_FD", None)
    module_dir = os.path.join(a.build, "lib", "ddprun", "python")
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if os.path.isdir(module_dir):
        paths.append(module_dir)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def ddp_torch_missing(a, env):
    """Why `import ddp_torch` fails with this environment, or None when it works."""
    probe = subprocess.run(
        [a.python, "-c", "import torch.distributed as d, ddp_torch; d.Backend('ddp'); "
         "print(ddp_torch.__file__)"],
        env=env, capture_output=True, text=True, timeout=120)
    if probe.returncode == 0:
        log(f"torch_backend_bench: ddp_torch from {probe.stdout.strip()}")
        return None
    lines = probe.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {probe.returncode}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_rank(a, env, rank, port, page, worker_args):
    env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
               LOCAL_RANK=str(rank), WORLD_SIZE=str(RANKS), LOCAL_WORLD_SIZE=str(RANKS))
    fds = ()
    if page is not None:
        env["DDP_PROGRESS_FD"] = str(page.fd)
        fds = (page.fd,)
    return subprocess.Popen([a.python, "-u", WORKER] + worker_args, env=env, pass_fds=fds,
                            stdout=sys.stderr, start_new_session=True)


def wait_ranks(a, procs):
    """The ranks' exit statuses; on --run-timeout, every rank still there is killed."""
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=a.run_timeout))
        except subprocess.TimeoutExpired:
            for other in procs:
                if other.poll() is None:
                    os.killpg(other.pid, signal.SIGKILL)
                    other.wait()
            raise RuntimeError(f"a run took over {a.run_timeout:g} s; its ranks were killed")
    return codes


class RunFailed(Exception):
    pass


def run(a, env, tmp, mode, backend, recorded):
    """One run of 2 ranks; rank 0's result, with what the pages held when `recorded`."""
    out = os.path.join(tmp, "result.json")
    if os.path.exists(out):
        os.remove(out)
    args = ["--backend", backend, "--mode", mode, "--out", out, "--layers", a.layers,
            "--batch", str(a.batch), "--steps", str(a.steps), "--warmup", str(a.warmup),
            "--sizes", a.sizes, "--seconds", str(a.seconds)]
    pages = [ProgressPage() for _ in range(RANKS)] if recorded else [None] * RANKS
    try:
        port = free_port()
        procs = [start_rank(a, env, r, port, pages[r], args) for r in range(RANKS)]
        codes = wait_ranks(a, procs)
        if any(codes) or not os.path.exists(out):
            raise RunFailed(f"{mode} on {backend}: ranks exited {codes} (their output is above)")
        with open(out) as f:
            result = json.load(f)
        if recorded:
            result["page_pids"] = [p.attached_pid() for p in pages]
            result["page_steps"] = [p.steps() for p in pages]
            result["page_collectives"] = [p.collectives() for p in pages]
        return result
    finally:
        for page in pages:
            if page is not None:
                page.close()


def describe(label, result):
    if result["mode"] == "train":
        text = (f"{label}: samples_per_s={result['samples_per_s']:.1f} "
                f"step_ms={result['step_ms']:.3f} loss={result['loss']:.6f}")
    else:
        text = label + ":" + "".join(
            f" {s['bytes']}B={four_digits(s['busbw_gbps'])}GB/s({s['iters']}x{s['time_us']:.1f}us)"
            for s in result["sizes"])
    if "page_steps" in result:
        text += (f" pages: pid={result['page_pids']} steps={result['page_steps']} "
                 f"collectives={result['page_collectives']}")
    return text


TRAIN_GLOO = ("train", "gloo", False)
TRAIN_RECORDED = ("train", "ddp", True)
TRAIN_UNRECORDED = ("train", "ddp", False)
ALLREDUCE_GLOO = ("allreduce", "gloo", False)
ALLREDUCE_DDP = ("allreduce", "ddp", True)
CONFIGS = [TRAIN_GLOO, TRAIN_RECORDED, TRAIN_UNRECORDED, ALLREDUCE_GLOO, ALLREDUCE_DDP]


def round_order(k):
    """The runs of round k. The blocks rotate, one further on each round, so that no run
    always follows the same one; the training runs with and without pages stay side by
    side (each pair is compared on its own) and swap places every round."""
    pair = [TRAIN_RECORDED, TRAIN_UNRECORDED] if k % 2 == 0 else [TRAIN_UNRECORDED, TRAIN_RECORDED]
    blocks = [[TRAIN_GLOO], pair, [ALLREDUCE_GLOO], [ALLREDUCE_DDP]]
    blocks = blocks[k % len(blocks):] + blocks[:k % len(blocks)]
    return [config for block in blocks for config in block]


def label(config):
    mode, backend, recorded = config
    if backend == "gloo":
        return f"{mode} gloo"
    return f"{mode} ddp ({'progress pages' if recorded else 'DDP_PROGRESS_FD unset'})"


def run_rounds(a, env):
    results = {config: [] for config in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="torch_backend_bench_") as tmp:
        for k in range(a.rounds):
            for config in round_order(k):
                result = run(a, env, tmp, *config)
                log(f"round {k}, {describe(label(config), result)}")
                results[config].append(result)
    return results


def ratio(y, x):
    return f"{y / x:.2f}" if x > 0 else "inf"


def four_digits(x):
    """x with 4 significant digits, never in exponent notation (a 4 KiB all-reduce's busbw
    is a few thousandths of a GB/s)."""
    if x <= 0:
        return "0"
    return f"{x:.{max(0, 3 - math.floor(math.log10(x)))}f}"


def print_training(results):
    gloo = results[TRAIN_GLOO]
    ddp = results[TRAIN_RECORDED]
    params = {r["params"] for r in gloo + ddp}
    if len(params) != 1:
        raise RunFailed(f"the runs trained models of different sizes: {sorted(params)}")
    x = max(r["samples_per_s"] for r in gloo)
    y = max(r["samples_per_s"] for r in ddp)
    print(f"torch_backend model=mlp params={params.pop()} ranks={RANKS} "
          f"gloo_samples_per_s={x:.1f} ddp_samples_per_s={y:.1f} ratio={ratio(y, x)}")


def print_allreduce(results):
    gloo = results[ALLREDUCE_GLOO]
    ddp = results[ALLREDUCE_DDP]
    for i, size in enumerate(s["bytes"] for s in gloo[0]["sizes"]):
        x = max(r["sizes"][i]["busbw_gbps"] for r in gloo)
        y = max(r["sizes"][i]["busbw_gbps"] for r in ddp)
        print(f"torch_allreduce bytes={size} ranks={RANKS} gloo_busbw_gbps={four_digits(x)} "
              f"ddp_busbw_gbps={four_digits(y)} ratio={ratio(y, x)}")


def print_progress(results):
    on = results[TRAIN_RECORDED]
    off = results[TRAIN_UNRECORDED]
    on_ms = statistics.median(r["step_ms"] for r in on)
    off_ms = statistics.median(r["step_ms"] for r in off)
    # Each round's pair ran side by side: the median of the pairs' ratios is steadier than
    # the ratio of the medians while other work on the machine comes and goes.
    overhead = statistics.median(r["step_ms"] / u["step_ms"] - 1 for r, u in zip(on, off))
    steps = min(on[-1]["page_steps"])
    collectives = min(on[-1]["page_collectives"])
    line = (f"torch_backend_progress ranks={RANKS} step_ms_unrecorded={off_ms:.3f} "
            f"step_ms_recorded={on_ms:.3f} overhead_pct={overhead * 100:.2f} "
            f"runs={len(on)} recorded_steps={steps} recorded_collectives={collectives}")
    if steps == 0 or collectives == 0:
        line += " (INVALID: a rank's page recorded no DDP step or no collective)"
    print(line)
    log("step ms unrecorded: " + " ".join(f"{r['step_ms']:.2f}" for r in off) +
        "; recorded: " + " ".join(f"{r['step_ms']:.2f}" for r in on))


def main():
    a = parse_args()
    env = worker_env(a)
    missing = ddp_torch_missing(a, env)
    if missing is not None:
        log(f"torch_backend_bench: cannot import ddp_torch with {a.python} ({missing}). Build it "
            "(scripts/build, with torch present) or put its folder on PYTHONPATH. No figures.")
        return 2
    log(f"torch_backend_bench: {RANKS} ranks, MLP {a.layers}, batch {a.batch}, {a.steps} steps "
        f"after {a.warmup}; all-reduce {a.sizes} bytes, {a.seconds:g} s each; {a.rounds} rounds")
    try:
        results = run_rounds(a, env)
        print_training(results)
        print_allreduce(results)
        print_progress(results)
    except (RunFailed, RuntimeError) as e:
        log(f"torch_backend_bench: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
