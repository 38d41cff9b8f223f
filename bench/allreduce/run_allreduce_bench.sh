#!/usr/bin/env bash
# Runs ddp's allreduce_bench and torch.distributed's gloo all_reduce with the
# same sizes under ddprun (2 ranks by default), then prints them side by side.
#
#   bench/allreduce/run_allreduce_bench.sh [build_dir] [nproc] [extra allreduce_bench args...]
#
# Env: PYTHON_EXEC (default /usr/bin/python3, which has torch 1.13), MIN/MAX sizes
# (default 4K / 256M), SECONDS_PER_SIZE (default 1), ROUNDS (default 1: each
# implementation runs ROUNDS times alternately; the best round per size is kept,
# which filters out noise from other load on a shared machine).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../../build}"
nproc="${2:-2}"
shift $(( $# > 2 ? 2 : $# )) || true
bin="$(cd "$build/bin" && pwd)"
python="${PYTHON_EXEC:-/usr/bin/python3}"
min="${MIN:-4K}"; max="${MAX:-256M}"; secs="${SECONDS_PER_SIZE:-1}"; rounds="${ROUNDS:-1}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

launch() {  # program args...
  if [[ -x "$bin/ddprun" ]]; then
    PYTHON_EXEC="$python" "$bin/ddprun" --standalone --nproc_per_node="$nproc" "$@"
  else  # by hand through env://
    local port=$(( 20000 + RANDOM % 20000 )) pids=()
    for ((r = 0; r < nproc; r++)); do
      if [[ "$1" == *.py ]]; then
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$nproc LOCAL_RANK=$r "$python" "$@" &
      else
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$nproc LOCAL_RANK=$r "$@" &
      fi
      pids+=($!)
    done
    wait "${pids[@]}"
  fi
}

for ((k = 0; k < rounds; k++)); do
  launch "$bin/allreduce_bench" --min "$min" --max "$max" --seconds "$secs" --json "$out/ddp_$k.jsonl" "$@" >&2
  launch "$here/allreduce_torch.py" --min "$min" --max "$max" --seconds "$secs" --json "$out/torch_$k.jsonl" >&2
done

"$python" - "$out" "$nproc" <<'PY'
import glob, json, sys
out, nproc = sys.argv[1], int(sys.argv[2])
# Per implementation and size: the lowest median latency and the highest busbw over the rounds.
best = {"ddp": {}, "torch": {}}
for path in glob.glob(f"{out}/*.jsonl"):
    for line in open(path):
        r = json.loads(line)
        cur = best[r["impl"]].setdefault(r["bytes"], {"median_us": float("inf"), "busbw": 0.0})
        cur["median_us"] = min(cur["median_us"], r["median_us"])
        cur["busbw"] = max(cur["busbw"], r["busbw"])
def human(n):
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"
print(f"\nallreduce float32 sum, {nproc} ranks (ddp gloo backend vs torch.distributed gloo); "
      "time = median per op, busbw = algbw * 2(n-1)/n from the mean time; best of the rounds")
print(f"{'size':>6} | {'ddp us':>9} {'ddp busbw':>10} | {'torch us':>9} {'torch busbw':>11} | "
      f"{'latency x':>9} {'busbw x':>8}")
for size in sorted(best["ddp"]):
    d, t = best["ddp"][size], best["torch"].get(size)
    if not t:
        continue
    print(f"{human(size):>6} | {d['median_us']:>9.1f} {d['busbw']:>10.3f} | {t['median_us']:>9.1f} "
          f"{t['busbw']:>11.3f} | {d['median_us'] / t['median_us']:>9.2f} {d['busbw'] / t['busbw']:>8.2f}")
PY
