#!/usr/bin/env bash
# All-reduce between "nodes" over shaped links: network namespaces from
# scripts/cluster, every node's link shaped both ways with tc's tbf qdisc (this
# kernel has no netem: no added latency). Per topology and link rate, in one run:
# ddp's flat ring (DDP_HIERARCHICAL_ALLREDUCE=0), ddp's default (hierarchical
# where ranks share a node) and torch.distributed's gloo; float32 sum. Prints per size
#   allreduce_nodes nodes=<n> ranks_per_node=<r> link_gbit=<g> bytes=<b> flat_busbw_gbps=<x> hier_busbw_gbps=<y> torch_gloo_busbw_gbps=<z>
# busbw as nccl-tests: algbw x 2(n-1)/n over all ranks, in Gbit/s (comparable to
# link_gbit). Then, when ddp_torch is built (DDP_WITH_TORCH), torch's all_reduce on
# the PyTorch "ddp" backend (ddp::worker's groups, so hierarchical too) as
#   allreduce_nodes_torch_ddp nodes=<n> ranks_per_node=<r> link_gbit=<g> bytes=<b> torch_ddp_busbw_gbps=<w> With one rank per node the hierarchy does not apply and "hier" is
# the default group's flat ring; a "# ... ran" line before the figures names the
# algorithm each ddp run used.
#
#   bench/allreduce/run_nodes_bench.sh [build_dir]
#
# Env: TOPOLOGIES (default "2x2 4x1": nodes x ranks per node), RATES (Gbit/s,
# default "1 10"), MIN/MAX (default 1M/64M), SECONDS_PER_SIZE (default 1),
# PYTHON_EXEC (default /usr/bin/python3, torch 1.13). Needs root, ip, tc; exits
# 77 otherwise. Every namespace, veth, qdisc and process it starts is removed at
# its end, also on failure or Ctrl-C.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../../build}"
bin="$(cd "$build/bin" && pwd)"
cluster="$here/../../scripts/cluster"
python="${PYTHON_EXEC:-/usr/bin/python3}"
topologies="${TOPOLOGIES:-2x2 4x1}"
rates="${RATES:-1 10}"
min="${MIN:-1M}"; max="${MAX:-64M}"; secs="${SECONDS_PER_SIZE:-1}"
[[ $(id -u) == 0 ]] || { echo "run_nodes_bench: skipped: needs root" >&2; exit 77; }
command -v tc >/dev/null || { echo "run_nodes_bench: skipped: needs tc" >&2; exit 77; }
ddp_torch_path="$(cd "$build" && pwd)/lib/ddprun/python"
with_ddp_torch=0
[[ -d $ddp_torch_path/ddp_torch ]] && with_ddp_torch=1
[[ -x $bin/allreduce_bench ]] || { echo "run_nodes_bench: no $bin/allreduce_bench (build it)" >&2; exit 1; }

name="arnodes$$"
out="$(mktemp -d)"
created=0
cleanup() {
  # destroy kills every process in the nodes and deletes the namespaces and
  # veths, and with them their qdiscs.
  ((created)) && "$cluster" destroy "$name" >/dev/null 2>&1 || true
  rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

most=0
for t in $topologies; do
  [[ $t =~ ^([0-9]+)x([0-9]+)$ ]] || { echo "run_nodes_bench: bad topology '$t' (NODESxRANKS)" >&2; exit 2; }
  ((BASH_REMATCH[1] > most)) && most=${BASH_REMATCH[1]}
done
created=1
"$cluster" create "$name" "$most" >/dev/null
addr0=$("$cluster" addr "$name" 0)
k=$(<"${DDP_CLUSTER_STATE:-/run/ddp-cluster}/$name/subnet")

shape() {  # rate_gbit: tbf both ways on every node's link
  local g=$1 i
  for ((i = 0; i < most; i++)); do
    local spec=(root tbf rate "${g}gbit" burst "$((g * 256))kb" latency 100ms)
    ip netns exec "$("$cluster" ns "$name" "$i")" tc qdisc replace dev eth0 "${spec[@]}"
    tc qdisc replace dev "dc${k}v$i" "${spec[@]}"
  done
}

run_job() {  # nodes ranks_per_node json env... -- cmd args...
  local nodes=$1 per=$2 json=$3; shift 3
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  local port=$((20000 + RANDOM % 20000)) world=$((nodes * per)) specs=() i r
  for ((i = 0; i < nodes; i++)); do
    for ((r = 0; r < per; r++)); do
      local pid
      pid=$("$cluster" start "$name" "$i" --log "$out/job.log" -- env "${envs[@]}" \
        MASTER_ADDR="$addr0" MASTER_PORT="$port" RANK=$((i * per + r)) WORLD_SIZE="$world" \
        LOCAL_RANK="$r" LOCAL_WORLD_SIZE="$per" GLOO_SOCKET_IFNAME=eth0 "$@" --json "$json")
      specs+=("$i:$pid")
    done
  done
  local failed=0
  for s in "${specs[@]}"; do
    "$cluster" wait "$name" "$s" 600 >/dev/null || failed=1
  done
  if ((failed)); then
    echo "run_nodes_bench: a rank of '$*' failed; its log:" >&2
    tail -n 30 "$out/job.log" >&2
    exit 1
  fi
}

for g in $rates; do
  shape "$g"
  for t in $topologies; do
    nodes=${t%x*}; per=${t#*x}
    tag="${nodes}x${per}_${g}"
    common=(--min "$min" --max "$max" --seconds "$secs")
    run_job "$nodes" "$per" "$out/flat_$tag.jsonl" DDP_HIERARCHICAL_ALLREDUCE=0 -- \
      "$bin/allreduce_bench" "${common[@]}"
    run_job "$nodes" "$per" "$out/hier_$tag.jsonl" DDP_HIERARCHICAL_ALLREDUCE=1 -- \
      "$bin/allreduce_bench" "${common[@]}"
    run_job "$nodes" "$per" "$out/torch_$tag.jsonl" OMP_NUM_THREADS=1 -- \
      "$python" "$here/allreduce_torch.py" "${common[@]}"
    if ((with_ddp_torch)); then
      run_job "$nodes" "$per" "$out/torchddp_$tag.jsonl" OMP_NUM_THREADS=1 \
        PYTHONPATH="$ddp_torch_path${PYTHONPATH:+:$PYTHONPATH}" -- \
        "$python" "$here/allreduce_torch.py" --backend ddp "${common[@]}"
    fi
    "$python" - "$out" "$tag" "$nodes" "$per" "$g" <<'PY'
import json, sys
out, tag, nodes, per, g = sys.argv[1:]
def load(kind):
    return {r["bytes"]: r for r in map(json.loads, open(f"{out}/{kind}_{tag}.jsonl"))}
flat, hier, torch = load("flat"), load("hier"), load("torch")
ran = lambda runs: ",".join(sorted({r.get("algorithm", "?") for r in runs.values()}))
print(f"# nodes={nodes} ranks_per_node={per} link_gbit={g}: flat ran {ran(flat)}, hier ran {ran(hier)}")
for b in sorted(set(flat) & set(hier) & set(torch)):
    gbps = lambda r: f"{r[b]['busbw'] * 8:.3f}"  # GB/s -> Gbit/s
    print(f"allreduce_nodes nodes={nodes} ranks_per_node={per} link_gbit={g} bytes={b} "
          f"flat_busbw_gbps={gbps(flat)} hier_busbw_gbps={gbps(hier)} torch_gloo_busbw_gbps={gbps(torch)}",
          flush=True)
try:
    ddp = load("torchddp")
except FileNotFoundError:
    ddp = {}
for b in sorted(set(ddp)):
    print(f"allreduce_nodes_torch_ddp nodes={nodes} ranks_per_node={per} link_gbit={g} bytes={b} "
          f"torch_ddp_busbw_gbps={ddp[b]['busbw'] * 8:.3f}", flush=True)
PY
  done
done
