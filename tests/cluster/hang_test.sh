#!/usr/bin/env bash
# Hang detection across network namespaces (scripts/cluster): 2 nodes, 2 workers
# each (ddprun_progress_worker, 4 ranks), node 0 hosts the c10d store. Rank 3, on
# node 1, blocks forever before its 41st step's all-reduce (pytorch: before its
# 20th step, in an unmodified PyTorch DDP script on the backend "ddp").
#   other_node   both nodes name rank 3 within --hang_timeout + 2 s of the stall;
#                node 1 (the culprit's) has its stacks and ends it; both fail
#                (--max_restarts=0) and both wrote an incident file
#   unreachable  node 1 is cut off the network the moment the stall begins: node 0
#                still names rank 3 (from node 1's last summary, which may also put
#                rank 2 behind) and says node 1 is unreachable (--hang_timeout 6:
#                a summary is stale after 4 s)
#   pytorch      as other_node, with stuck_pytorch_rank.py (import ddp_torch, found
#                through the PYTHONPATH ddprun sets): both nodes name rank 3, with
#                the DDP steps each rank took; node 1's log has rank 3's Python
#                traceback (faulthandler on the SIGABRT that ends it)
# Needs DDP_BUILD_BIN (ddprun, ddprun_progress_worker; for pytorch, the ddp_torch
# package beside them in ../lib/ddprun/python). Exits 77 when the machine cannot
# make network namespaces, or (pytorch) when ddp_torch was not built.
set -euo pipefail

scenario=${1:?usage: hang_test.sh other_node|unreachable}
src=${DDP_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
C=$src/scripts/cluster
bin=${DDP_BUILD_BIN:-$src/build/bin}
name=hang-$$
tmp=$(mktemp -d)
cleanup() {
  "$C" destroy "$name" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "FAIL ($scenario): $*" >&2
  for f in "$tmp"/node*.log; do
    [[ -f $f ]] && { echo "--- $f"; grep -v '^    \s*#\|^        ' "$f" | tail -60; } >&2
  done
  exit 1
}

for b in ddprun ddprun_progress_worker; do
  [[ -x $bin/$b ]] || fail "$bin/$b is missing (build it; DDP_BUILD_BIN names the folder)"
done
if [[ $scenario == pytorch && ! -d $bin/../lib/ddprun/python/ddp_torch ]]; then
  echo "SKIP: ddp_torch is not built beside $bin" >&2
  exit 77
fi

rc=0
"$C" create "$name" 2 >/dev/null || rc=$?
((rc != 77)) || exit 77
((rc == 0)) || fail "create exited $rc"
a0=$("$C" addr "$name" 0)

# Node 1 reads as unreachable once its summary is 4 s old: the timeout must outlast that.
timeout_s=3
[[ $scenario == unreachable ]] && timeout_s=6
worker=("$bin/ddprun_progress_worker" sleep_before 3 40 --steps 80 --mark_dir "$tmp")
if [[ $scenario == pytorch ]]; then
  worker=(/usr/bin/python3 "$src/tests/cluster/stuck_pytorch_rank.py" 3 20 80 "$tmp")
fi
for i in 0 1; do
  # Workers reach each other over the bridge (eth0); the two nodes share this
  # machine's /dev/shm, so shared-memory all-reduce is off.
  "$C" start "$name" "$i" --log "$tmp/node$i.log" -- \
    env GLOO_SOCKET_IFNAME=eth0 DDP_SHM_DISABLE=1 \
    "$bin/ddprun" --nnodes=2 --nproc_per_node=2 --node_rank="$i" --rdzv_backend=c10d \
    --rdzv_endpoint="$a0:29400" --rdzv_id="hang-$$" --rdzv_conf=join_timeout=60 \
    --local_addr '{addr}' --max_restarts=0 --hang_timeout=$timeout_s \
    --log_dir "$tmp/logs$i" --no_python \
    "${worker[@]}" >/dev/null
done

# The stall.
for _ in $(seq 1 900); do
  [[ -f $tmp/stall_3 ]] && break
  sleep 0.1
done
[[ -f $tmp/stall_3 ]] || fail "rank 3 never reached its stall within 90 s"
if [[ $scenario == unreachable ]]; then
  "$C" cut "$name" 1
fi

# Node 0's report.
incident0=""
for _ in $(seq 1 300); do
  incident0=$(find "$tmp/logs0" -name 'hang_*_node0.json' 2>/dev/null | head -1)
  [[ -n $incident0 ]] && break
  sleep 0.1
done
[[ -n $incident0 ]] || fail "node 0 wrote no incident file within 30 s"
stall=$(cat "$tmp/stall_3")
written=$(stat -c %.9Y "$incident0")
awk -v s="$stall" -v w="$written" -v t="$timeout_s" 'BEGIN { exit !(w - s <= t + 2) }' ||
  fail "node 0 reported $(awk -v s="$stall" -v w="$written" 'BEGIN { print w - s }') s after the stall (bound: $timeout_s + 2 s)"
# Rank 3 alone; in the unreachable case node 0 judges node 1's ranks from
# node 1's last summary, which may be older than rank 2's last collective, so
# rank 2 may be named with it (its line then says how old the figures are).
culprits=$(tr -d ' \n' <"$incident0" | sed -n 's/.*"culprits":\[\([0-9,]*\)\].*/\1/p')
case $scenario:$culprits in
  other_node:3 | pytorch:3 | unreachable:3 | unreachable:2,3) ;;
  *) fail "node 0's incident names culprits [$culprits], not rank 3: $(head -c 600 "$incident0")" ;;
esac
grep -q 'HANG (behind) detected by node 0' "$tmp/node0.log" || fail "no report on node 0"
grep -qE "culprit rank\(s\): ${culprits//,/, };" "$tmp/node0.log" || fail "node 0's report does not name rank(s) $culprits"
grep -q 'rank 3 (node 1, ' "$tmp/node0.log" || fail "node 0's report does not place rank 3 on node 1"

# Both nodes fail (no restarts), and node 1, the culprit's, names rank 3 and
# says that it ended it.
expect_node1_ended_rank3() {
  for i in 0 1; do
    rc=0
    "$C" wait "$name" "$i" 60 >/dev/null || rc=$?
    ((rc != 0 && rc != 124)) || fail "ddprun on node $i exited $rc (expected a failure: no restarts)"
  done
  grep -q 'culprit rank(s): 3;' "$tmp/node1.log" || fail "node 1's report does not name rank 3"
  grep -q 'ended by ddprun after a hang' "$tmp/node1.log" || fail "node 1's failure report does not say why rank 3 ended"
}

case $scenario in
  pytorch)
    expect_node1_ended_rank3
    # Rank 3 stopped before its 20th step: it took 19, and so could no peer more.
    grep -qE "rank 3 \(node 1, .*; 19 steps" "$tmp/node0.log" || fail "node 0's report does not give rank 3's 19 DDP steps"
    grep -qE "rank 0 \(node 0, .*; 19 steps" "$tmp/node0.log" || fail "node 0's report does not give rank 0's 19 DDP steps"
    grep -q 'in stopped_before_its_step' "$tmp/node1.log" || fail "node 1's log has no Python traceback of rank 3"
    ;;
  other_node)
    expect_node1_ended_rank3
    incident1=$(find "$tmp/logs1" -name 'hang_*_node1.json' | head -1)
    [[ -n $incident1 ]] || fail "node 1 wrote no incident file"
    grep -q 'native stacks of rank 3 (' "$tmp/node1.log" || fail "node 1's report has no stacks of rank 3"
    grep -q 'progress_worker_blocks_forever' "$incident1" || fail "rank 3's stacks do not show where it blocks"
    grep -q 'action: none on this node' "$tmp/node0.log" || fail "node 0 should leave rank 3 to node 1"
    ;;
  unreachable)
    grep -q 'unreachable: node 1 (' "$tmp/node0.log" || fail "node 0's report does not say node 1 is unreachable"
    grep -q '"unreachable": \[\s*"node 1' <(tr -d '\n' <"$incident0") || fail "node 0's incident lists no unreachable node"
    ;;
  *) fail "unknown scenario" ;;
esac
echo "PASS ($scenario)"
