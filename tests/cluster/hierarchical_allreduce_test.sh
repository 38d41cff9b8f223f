#!/usr/bin/env bash
# A real 2-node x 2-rank job across network namespaces (scripts/cluster): each
# node is a host to the Gloo group, so its all-reduce is hierarchical (shared
# memory within a node, the nodes' leaders over TCP). allreduce_bench --verify
# checks on every rank that the hierarchical algorithm ran and that its results
# equal a flat ring group's (int64 bit for bit, float32 within 1e-5). Exits 77
# when the machine cannot make network namespaces (not root, no ip netns).
set -euo pipefail

src=${DDP_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${DDP_BUILD_BIN:-$src/build/bin}
C=$src/scripts/cluster
name=hier-$$
tmp=$(mktemp -d)
cleanup() {
  "$C" destroy "$name" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
[[ -x $bin/allreduce_bench ]] || { echo "skipped: no $bin/allreduce_bench (DDP_BUILD_BENCH)" >&2; exit 77; }

"$C" create "$name" 2 >/dev/null  # exits 77 itself without root or ip netns
addr0=$("$C" addr "$name" 0)
port=$((20000 + RANDOM % 20000))
specs=()
for node in 0 1; do
  for local in 0 1; do
    pid=$("$C" start "$name" "$node" --log "$tmp/rank$((node * 2 + local)).log" -- env \
      MASTER_ADDR="$addr0" MASTER_PORT="$port" RANK=$((node * 2 + local)) WORLD_SIZE=4 \
      LOCAL_RANK="$local" LOCAL_WORLD_SIZE=2 GLOO_SOCKET_IFNAME=eth0 DDP_TIMEOUT=60 \
      "$bin/allreduce_bench" --verify --expect hierarchical)
    specs+=("$node:$pid")
  done
done
rc=0
for s in "${specs[@]}"; do "$C" wait "$name" "$s" 60 >/dev/null || rc=1; done
cat "$tmp"/rank*.log
((rc == 0)) || fail "a rank failed (logs above)"
oks=$(cat "$tmp"/rank*.log | grep -c "ok: algorithm hierarchical, results equal the flat ring's" || true)
((oks == 4)) || fail "$oks of 4 ranks verified"
echo "PASS: 2 nodes x 2 ranks: hierarchical all-reduce, results equal the flat ring's"
