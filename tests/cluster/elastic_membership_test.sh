#!/usr/bin/env bash
# Elastic ddprun (c10d rendezvous, keep-alives 0.5 s x 2) across network-namespace
# nodes, with ddprun_test_worker's `elastic` workers (each runs until a shared file
# `finish` exists). Node 0 hosts the store. One scenario per run:
#
#   too_few     --nnodes 2:3 on 2 nodes; node 1's agent is SIGKILLed: node 0 waits up to
#               join_timeout (4 s) for a second node, then exits 1 with "1 of at least 2
#               nodes joined within the join timeout of 4 s" and lists the membership
#               changes ("node 1 ... was lost").
#   spare       --nnodes 2:3 on 4 nodes: the fourth waits as a spare without disturbing
#               the group; when node 1's agent is SIGKILLed the spare takes over (3
#               workers, WORLD_SIZE=3, node 3 among them); a new agent on node 1 is then
#               a spare, and exits 0 when the job ends; everybody else exits 0 too.
#   store_host  --nnodes 2:3 on 3 nodes; node 0 (the store host) crashes (SIGKILL to every
#               process in it): nodes 1 and 2 exit 1 within 10 s, saying "lost the
#               rendezvous store: the store at <node 0>:29400 failed", and their workers end.
#   ranks       --nnodes 2:4, --node_rank given per node in the reverse of the start order:
#               group ranks follow --node_rank (RANK too, MASTER_ADDR is group rank 0's
#               node) in the first round, after a fourth node joined, after it left, and
#               in a second run of the same job started in yet another order.
#
# Needs root (exits 77 otherwise). DDP_BUILD_BIN names the folder with ddprun and
# ddprun_test_worker.
set -euo pipefail

scenario=${1:-}
case $scenario in
  too_few) nodes=2 ;;
  spare) nodes=4 ;;
  store_host) nodes=3 ;;
  ranks) nodes=4 ;;
  *) echo "usage: $0 too_few|spare|store_host|ranks" >&2; exit 2 ;;
esac

source "$(dirname "$0")/elastic_lib.sh"
in_cluster "$nodes" "$0" "$@"
setup_cluster

work=$tmp/w
# start KEY NODE NNODES [CONF_EXTRA] [DDPRUN FLAGS...]
start() {
  local key=$1 node=$2 nnodes=$3 extra=${4:-join_timeout=60}
  shift 4 2>/dev/null || shift $#
  start_agent "$key" "$node" "$nnodes" "$conf_fast,$extra" "$@" -- \
    "$bin/ddprun_test_worker" elastic "$work"
}
finish() { echo "done" >"$work/finish"; }

# The workers of NODE (records) that still run.
running_workers() {
  local f n=0
  for f in $(records "n$1_*"); do alive "${f##*_}" && n=$((n + 1)); done
  echo "$n"
}

case $scenario in
  too_few)
    step "2 nodes, --nnodes 2:3, join_timeout=4"
    start node0 0 2:3 join_timeout=4
    retry 30 store_listens || fail "node 0's store does not listen on ${a[0]}:$port"
    start node1 1 2:3 join_timeout=4
    await 30 "node0 node1" at_least 'n*_ws2_*' 2 || fail "the 2 nodes did not start 2 workers with WORLD_SIZE=2"
    step "SIGKILL node 1's agent"
    "$C" signal "$name" "1:${pid[node1]}" KILL
    killed=$SECONDS
    expect_exit node1 1 137 10
    expect_exit node0 0 1 40
    took=$((SECONDS - killed))
    step "node 0 exited 1 after $took s"
    # Keep-alives (1 s), then the join timeout (4 s) of the round that re-forms.
    ((took >= 4)) || problem "node 0 gave up after $took s, before the join timeout of 4 s"
    ((took <= 20)) || problem "node 0 gave up after $took s (the join timeout is 4 s)"
    # T as written or as a decimal ("4" or "4.000000").
    grep -Eq "round [0-9]+ of run 'elastic-[0-9]+': 1 of at least 2 nodes joined within the join timeout of 4(\.0*)? s" \
      "$tmp/node0.log" ||
      problem "node0.log does not say \"round R of run 'ID': 1 of at least 2 nodes joined within the join timeout of 4 s\""
    grep -q "node 1 (member [^)]*) was lost" "$tmp/node0.log" ||
      problem "node0.log does not say 'node 1 (member ...) was lost'"
    grep -A3 "^ddprun: membership changes during this run:" "$tmp/node0.log" | grep -q "was lost" ||
      problem "node0.log does not list the loss under 'ddprun: membership changes during this run:'"
    (($(running_workers 0) == 0)) || problem "node 0's worker still runs after its agent exited"
    ;;

  spare)
    step "3 nodes, --nnodes 2:3"
    start node0 0 2:3
    retry 30 store_listens || fail "node 0's store does not listen on ${a[0]}:$port"
    start node1 1 2:3
    start node2 2 2:3
    await 60 "node0 node1 node2" at_least 'n*_ws3_*' 3 || fail "the 3 nodes did not start 3 workers with WORLD_SIZE=3"
    # Under load node 2 can join after nodes 0 and 1 formed a round of 2 (it then asks
    # to join and the group re-forms with 3): only what the logs say after the spare
    # started is about the spare.
    declare -A lines_before
    for k in node0 node1 node2; do lines_before[$k]=$(wc -l <"$tmp/$k.log"); done
    workers_before=$(count 'n*')
    step "a fourth node (a spare)"
    start node3 3 2:3
    sleep 3
    running node3 || fail "the spare (node 3) exited $(wait_agent node3 3 1) while the group ran"
    (($(count 'n*') == workers_before)) ||
      problem "the spare disturbed the group: $(count 'n*') workers were started, not $workers_before"
    (($(count 'n3_*') == 0)) || problem "the spare (node 3) ran a worker while the group was full"
    for k in node0 node1 node2; do
      ! tail -n "+$((lines_before[$k] + 1))" "$tmp/$k.log" | grep -q "asked to join" ||
        problem "the spare ended a full round ('asked to join' in $k.log after it started)"
    done
    step "SIGKILL node 1's agent"
    "$C" signal "$name" "1:${pid[node1]}" KILL
    expect_exit node1 1 137 10
    await 60 "node0 node2 node3" at_least 'n3_*_ws3_*' 1 || fail "the spare (node 3) did not take over"
    r=$(field "$rec/$(records 'n3_*_ws3_*' | head -n 1)" round)
    await 30 "node0 node2 node3" at_least "n*_round${r}_ws3_*" 3 ||
      fail "round $r (with the spare) does not have 3 workers with WORLD_SIZE=3"
    if ! at_least "n0_round${r}_*" 1 || ! at_least "n2_round${r}_*" 1; then
      fail "round $r (with the spare) does not have nodes 0 and 2"
    fi
    step "the spare took over in round $r"
    for k in node0 node2; do
      grep -q "node [0-9] (member [^)]*) was lost" "$tmp/$k.log" ||
        problem "$k.log does not say 'node G (member ...) was lost'"
      grep -q "re-formed the group as round $r: 3 nodes, WORLD_SIZE=3" "$tmp/$k.log" ||
        problem "$k.log does not say 're-formed the group as round $r: 3 nodes, WORLD_SIZE=3'"
    done
    step "a new agent on node 1: a spare now"
    start node1b 1 2:3
    sleep 2
    running node1b || problem "the new spare (node 1) exited $(wait_agent node1b 1 1) while the group ran"
    (($(count 'n1_*') == 1)) || problem "the new spare (node 1) ran a worker while the group was full"
    finish
    expect_exit node0 0 0 30
    expect_exit node2 2 0 30
    expect_exit node3 3 0 30
    expect_exit node1b 1 0 30
    ;;

  store_host)
    step "3 nodes, --nnodes 2:3"
    start node0 0 2:3
    retry 30 store_listens || fail "node 0's store does not listen on ${a[0]}:$port"
    start node1 1 2:3
    start node2 2 2:3
    await 60 "node0 node1 node2" at_least 'n*_ws3_*' 3 || fail "the 3 nodes did not start 3 workers with WORLD_SIZE=3"
    step "node 0 (the store host) crashes"
    "$C" signal "$name" 0 KILL --node
    killed=$EPOCHREALTIME
    for i in 1 2; do
      expect_exit "node$i" "$i" 1 30
      took=$(awk -v a="$killed" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
      step "node $i exited 1 after $took s"
      awk -v t="$took" 'BEGIN { exit !(t <= 10) }' ||
        problem "node $i took $took s to exit after the store host died (not within 10 s)"
      grep -qF "ddprun: lost the rendezvous store: the store at ${a[0]}:$port failed" "$tmp/node$i.log" ||
        problem "node$i.log does not say 'ddprun: lost the rendezvous store: the store at ${a[0]}:$port failed: ...'"
      (($(running_workers "$i") == 0)) || problem "node $i's worker still runs after its agent exited"
    done
    ;;

  ranks)
    # check_ranks WHAT GLOB: every worker record matching GLOB has GROUP_RANK and RANK
    # equal to its node's --node_rank, and MASTER_ADDR group rank 0's address.
    check_ranks() {
      local what=$1 f node gr rk m
      for f in $(records "$2"); do
        node=$(field "$rec/$f" node)
        gr=$(field "$rec/$f" group_rank)
        rk=$(field "$rec/$f" rank)
        m=$(field "$rec/$f" master)
        [[ $gr == "${want[$node]}" ]] ||
          problem "$what: node $node has group rank $gr, not its --node_rank ${want[$node]}"
        [[ $rk == "${want[$node]}" ]] || problem "$what: node $node has RANK $rk, not ${want[$node]}"
        [[ $m == "$master" ]] || problem "$what: node $node has MASTER_ADDR $m, not $master"
      done
    }
    # Node i has --node_rank want[i]: the reverse of the order the nodes start in.
    want=(2 1 0 3)
    master=${a[2]}
    launch() {  # KEY NODE
      start "$1" "$2" 2:4 join_timeout=60 --node_rank="${want[$2]}"
    }
    step "run 1: nodes 0, 1, 2 with --node_rank 2, 1, 0"
    launch node0 0
    retry 30 store_listens || fail "node 0's store does not listen on ${a[0]}:$port"
    launch node1 1
    launch node2 2
    await 60 "node0 node1 node2" at_least 'n*_ws3_*' 3 || fail "the 3 nodes did not start 3 workers with WORLD_SIZE=3"
    r1=$(field "$rec/$(records 'n0_*_ws3_*' | head -n 1)" round)
    check_ranks "run 1, round $r1 (3 nodes)" "n*_round${r1}_*"
    step "node 3 (--node_rank 3) joins"
    launch node3 3
    await 60 "node0 node1 node2 node3" at_least 'n*_ws4_*' 4 || fail "the group did not scale up to 4 nodes"
    r2=$(field "$rec/$(records 'n3_*_ws4_*' | head -n 1)" round)
    check_ranks "run 1, round $r2 (node 3 joined)" "n*_round${r2}_*"
    step "SIGKILL node 3's agent"
    "$C" signal "$name" "3:${pid[node3]}" KILL
    expect_exit node3 3 137 10
    await 60 "node0 node1 node2" at_least 'n0_*_ws3_*' 2 || fail "nodes 0, 1, 2 did not re-form without node 3"
    r3=$(records 'n0_*_ws3_*' | sed 's/^n0_round\([0-9]*\)_.*/\1/' | sort -n | tail -n 1)
    await 30 "node0 node1 node2" at_least "n*_round${r3}_*" 3 || fail "round $r3 does not have 3 workers"
    check_ranks "run 1, round $r3 (node 3 lost)" "n*_round${r3}_*"
    finish
    for i in 0 1 2; do expect_exit "node$i" "$i" 0 30; done
    step "run 2 (the same job again): nodes started in the order 2, 1, 0"
    rec=$tmp/rec2 work=$tmp/w2
    mkdir "$rec" "$work"
    for i in 2 1; do launch "run2_node$i" "$i"; sleep 0.3; done
    launch run2_node0 0
    await 60 "run2_node0 run2_node1 run2_node2" at_least 'n*_ws3_*' 3 ||
      fail "run 2: the 3 nodes did not start 3 workers with WORLD_SIZE=3"
    check_ranks "run 2" "n*"
    finish
    for i in 0 1 2; do expect_exit "run2_node$i" "$i" 0 30; done
    ;;
esac
done_test "($scenario)"
