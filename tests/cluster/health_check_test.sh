#!/usr/bin/env bash
# --health_check across network-namespace nodes: 3 elastic agents (c10d, --nnodes 2:3,
# ddprun_test_worker's `elastic` workers, which run until a shared file `finish`
# exists). Every node's check is `test -e ok_<node> || { echo "gpu 3 ecc errors"; exit 1; }`;
# nodes 0 and 1 have their marker, node 2 not yet. The job forms with nodes 0 and 1
# (WORLD_SIZE=2); node 2's log names the failed check and its output, and its live view's
# /readyz answers 503 naming the check. Then the marker appears: node 2 passes on a retry,
# joins, the group re-forms to 3 nodes (WORLD_SIZE=3), and every agent exits 0.
#
# Needs root (exits 77 otherwise). DDP_BUILD_BIN names the folder with ddprun and
# ddprun_test_worker.
set -euo pipefail

source "$(dirname "$0")/elastic_lib.sh"
in_cluster 3 "$0" "$@"
DDP_ELASTIC_BUDGET=${DDP_ELASTIC_BUDGET:-60}
setup_cluster

work=$tmp/w
status_port=29501
start() {
  local key=$1 node=$2
  shift 2
  start_agent "$key" "$node" 2:3 "$conf_fast,join_timeout=60" \
    --health_check "test -e $tmp/ok_$node || { echo 'gpu 3 ecc errors'; exit 1; }" \
    --health_check_timeout 10 "$@" -- "$bin/ddprun_test_worker" elastic "$work"
}
# Node 2's /readyz (status line and body), from inside node 2.
readyz() {
  "$C" exec "$name" 2 -- timeout 2 bash -c \
    "exec 3<>/dev/tcp/127.0.0.1/$status_port; printf 'GET /readyz HTTP/1.0\r\n\r\n' >&3; cat <&3" \
    2>/dev/null || true
}
readyz_names_check() { readyz | grep -q 'not joining: health check'; }

touch "$tmp/ok_0" "$tmp/ok_1"
step "3 nodes, --nnodes 2:3; node 2's health check fails"
start node0 0
retry 30 store_listens || fail "node 0's store does not listen on ${a[0]}:$port"
start node1 1
start node2 2 --status_port "$status_port"
await 30 "node0 node1 node2" at_least 'n*_ws2_*' 2 ||
  fail "nodes 0 and 1 did not form a group of 2 (WORLD_SIZE=2): $(states node0 node1 node2)"
(($(count 'n2_*') == 0)) || problem "node 2 started a worker before its check passed"
await 10 "node2" grep -q "health check .* exited with status 1; its output: gpu 3 ecc errors; not joining" \
  "$tmp/node2.log" ||
  problem "node2.log does not name the failed check, its status and its output"
await 10 "node2" readyz_names_check ||
  problem "node 2's /readyz does not say not ready naming the check: $(readyz | tail -n 1)"
readyz | head -n 1 | grep -q ' 503 ' || problem "node 2's /readyz is not 503"

step "the marker appears: node 2's check passes on a retry"
touch "$tmp/ok_2"
await 30 "node0 node1 node2" at_least 'n*_ws3_*' 3 ||
  fail "the group did not re-form to 3 nodes (WORLD_SIZE=3): $(states node0 node1 node2)"
(($(count 'n2_*_ws3_*') == 1)) || problem "node 2 has no worker in the 3-node group"
grep -q "the health check passed on try [2-9]" "$tmp/node2.log" ||
  problem "node2.log does not say the check passed on a retry"
grep -q "health check" "$tmp/node0.log" && problem "node 0's passing check printed a line"

step "finish"
echo done >"$work/finish"
for k in node0 node1 node2; do expect_exit "$k" "${nodeof[$k]}" 0 20; done
done_test "health check: the job formed without node 2, which joined once its check passed"
