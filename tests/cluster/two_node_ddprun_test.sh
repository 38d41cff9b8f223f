#!/usr/bin/env bash
# A real 2-node ddprun job across network namespaces (scripts/cluster): node 0
# hosts the c10d rendezvous store at its own address, node 1 joins over the
# bridge. Both launchers must exit 0; the two workers must see WORLD_SIZE=2,
# distinct RANKs, and MASTER_ADDR = the address of the node that got group rank 0.
# Both must end within 30 s. Needs DDP_BUILD_BIN (ddprun, ddprun_test_worker). Exits 77 when the machine
# cannot make network namespaces.
set -euo pipefail

src=${DDP_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
C=$src/scripts/cluster
bin=${DDP_BUILD_BIN:-$src/build/bin}
name=ddprun2-$$
tmp=$(mktemp -d)
cleanup() {
  "$C" destroy "$name" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in "$tmp"/node*.log; do
    [[ -f $f ]] && { echo "--- $f"; cat "$f"; } >&2
  done
  exit 1
}

for b in ddprun ddprun_test_worker; do
  [[ -x $bin/$b ]] || fail "$bin/$b is missing (build it; DDP_BUILD_BIN names the folder)"
done

rc=0
"$C" create "$name" 2 >/dev/null || rc=$?
((rc != 77)) || exit 77
((rc == 0)) || fail "create exited $rc"
a0=$("$C" addr "$name" 0)
a1=$("$C" addr "$name" 1)

mkdir "$tmp/env"
started=$SECONDS
# Node 1 starts first: its agent must wait for the store that node 0 hosts.
for i in 1 0; do
  "$C" start "$name" "$i" --log "$tmp/node$i.log" -- \
    "$bin/ddprun" --nnodes=2 --nproc_per_node=1 --rdzv_backend=c10d \
    --rdzv_endpoint="$a0:29400" --rdzv_id="cluster-$$" --rdzv_conf=join_timeout=60 \
    --local_addr '{addr}' --max_restarts=0 \
    "$bin/ddprun_test_worker" env "$tmp/env" >/dev/null
  [[ $i == 1 ]] && sleep 0.5
done
for i in 0 1; do
  rc=0
  "$C" wait "$name" "$i" 90 >/dev/null || rc=$?
  ((rc == 0)) || fail "ddprun on node $i exited $rc"
done
# The job itself takes about a second; an agent that lingers after it (e.g. one
# waiting for a store whose host has left) shows here.
took=$((SECONDS - started))
((took <= 30)) || fail "the job took $took s (both launchers should end within seconds)"

# nlohmann's dump(2): one `"KEY": "value",` per line.
field() { sed -n "s/^ *\"$2\": \"\\(.*\\)\",\\{0,1\\}\$/\\1/p" "$1"; }
shopt -s nullglob
files=("$tmp"/env/env_*.json)
((${#files[@]} == 2)) || fail "expected 2 worker env files, found ${#files[@]}: ${files[*]}"
ranks=() masters=()
for f in "${files[@]}"; do
  ws=$(field "$f" WORLD_SIZE)
  [[ $ws == 2 ]] || fail "$f: WORLD_SIZE='$ws', not 2"
  ranks+=("$(field "$f" RANK)")
  node=$(field "$f" DDP_CLUSTER_NODE)
  [[ $node == 0 || $node == 1 ]] || fail "$f: DDP_CLUSTER_NODE='$node'"
  grank=$(field "$f" GROUP_RANK)
  master=$(field "$f" MASTER_ADDR)
  # The group-rank-0 node's --local_addr is every worker's MASTER_ADDR.
  case $grank in
    0) node_of_group_0=$node ;;
    1) node_of_group_1=$node ;;
    *) fail "$f: GROUP_RANK='$grank'" ;;
  esac
  masters+=("$master")
done
sorted=$(printf '%s\n' "${ranks[@]}" | sort | tr '\n' ' ')
[[ $sorted == "0 1 " ]] || fail "RANKs are '${ranks[*]}', not 0 and 1"
[[ -n ${node_of_group_0:-} && -n ${node_of_group_1:-} && $node_of_group_0 != "$node_of_group_1" ]] ||
  fail "the two workers did not run on different nodes with group ranks 0 and 1"
expected=$("$C" addr "$name" "$node_of_group_0")
for m in "${masters[@]}"; do
  [[ $m == "$expected" ]] || fail "MASTER_ADDR='$m', not $expected (node $node_of_group_0, group rank 0)"
done
[[ $a0 != "$a1" ]] || fail "both nodes have address $a0"
echo "PASS (ranks ${ranks[*]}, MASTER_ADDR $expected)"
