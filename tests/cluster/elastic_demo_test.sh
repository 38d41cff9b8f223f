#!/usr/bin/env bash
# The Fashion-MNIST demo (train_fashion_mnist, a few seconds of training on a few
# thousand samples, a checkpoint in a shared temp dir) as an elastic ddprun job on 3
# network-namespace nodes, --nnodes 2:3, keep-alives 0.5 s x 2. One scenario per run:
#
#   lost_node  node 2's agent is SIGKILLed mid-training: nodes 0 and 1 say it was
#              lost, re-form as 2 nodes (WORLD_SIZE=2), resume from the checkpoint
#              and finish (exit 0).
#   rejoin     the same, then a new ddprun on node 2: the group scales up to 3 nodes
#              (WORLD_SIZE=3) and all three finish (exit 0).
#   partition  node 2's link is cut mid-training: nodes 0 and 1 handle it like its
#              death (re-form as 2, resume, go on); then the link is healed: node 2
#              either exits or rejoins, and never runs a worker outside the group's
#              rounds (no round with two world sizes, no WORLD_SIZE=1 or lone group on
#              node 2, its old worker has ended when the job ends); nodes 0 and 1 finish.
#
# Workers use TCP between nodes (GLOO_SOCKET_IFNAME=eth0, DDP_SHM_DISABLE=1: the nodes
# share this machine's /dev/shm, real nodes would not). Agents run with
# --max_restarts=0: docs/using.md ("Elastic runs") says a membership change does not consume restarts;
# DDP_ELASTIC_MAX_RESTARTS=N runs them with N instead, to see past a failure that
# spent one. DDP_ELASTIC_KEEP=1 keeps the logs and worker records.
#
# Needs root (exits 77 otherwise) and the dataset (/usr/share/datasets/fashion-mnist;
# 77 without it). DDP_BUILD_BIN names the folder with ddprun and train_fashion_mnist.
set -euo pipefail

scenario=${1:-}
case $scenario in
  lost_node | rejoin | partition) ;;
  *) echo "usage: $0 lost_node|rejoin|partition" >&2; exit 2 ;;
esac
data=/usr/share/datasets/fashion-mnist
if [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
  echo "skipped: the Fashion-MNIST dataset is not installed ($data)" >&2
  exit 77
fi

source "$(dirname "$0")/elastic_lib.sh"
in_cluster 3 "$0" "$@"
setup_cluster

setup_demo
# Restarts, not in-place recovery: this test checks the restart path (new workers, checkpoint resume).
demo+=(--no-recover-in-place)

step "starting 3 nodes (node 0 hosts the store)"
start_node node0 0
retry 30 store_listens || fail "node 0's store does not listen on ${a[0]}:$port"
start_node node1 1
start_node node2 2
await 60 "node0 node1 node2" at_least 'n*_ws3_*' 3 || fail "the 3 nodes did not start 3 workers with WORLD_SIZE=3"
await 60 "node0 node1 node2" trained_steps_at_3 8 || fail "the demo did not reach step 8 with 3 nodes"
[[ -f $ckpt ]] || fail "no checkpoint after 8 steps"
round3=$(field "$rec/$(records 'n0_*_ws3_*' | head -n 1)" round)

case $scenario in
  lost_node | rejoin)
    step "SIGKILL node 2's agent"
    "$C" signal "$name" "2:${pid[node2]}" KILL
    killed=$EPOCHREALTIME
    w2=$(records "n2_round${round3}_*" | head -n 1)
    # No worker survives its agent (parent-death signal).
    retry 5 bash -c "! kill -0 ${w2##*_} 2>/dev/null || grep -q '^State:.*Z' /proc/${w2##*_}/status" ||
      problem "node 2's worker (pid ${w2##*_}) still runs 5 s after its agent was SIGKILLed"
    step "node 2's worker ended $(awk -v a="$killed" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }') s after its agent's SIGKILL"
    expect_exit node2 2 137 10
    ;;
  partition)
    step "cutting node 2's link"
    "$C" cut "$name" 2
    ;;
esac

if ! await 60 "node0 node1" at_least 'n[01]_*_ws2_*' 2; then
  why=
  grep -q "failed with exit code" "$tmp/node0.log" "$tmp/node1.log" &&
    why="; their workers failed first (a collective with the lost node) and the agents counted it as a worker failure, not a membership change"
  fail "nodes 0 and 1 did not re-form with WORLD_SIZE=2 ($(states node0 node1))$why"
fi
step "nodes 0 and 1 re-formed with WORLD_SIZE=2"
for k in node0 node1; do
  grep -q "ddprun: [0-9:]* node 2 (member [^)]*) was lost" "$tmp/$k.log" ||
    problem "$k.log does not say 'node 2 (member ...) was lost'"
  grep -q "re-formed the group as round [0-9]*: 2 nodes, WORLD_SIZE=2" "$tmp/$k.log" ||
    problem "$k.log does not say 're-formed the group as round R: 2 nodes, WORLD_SIZE=2'"
  ! grep -q "restarting the worker group" "$tmp/$k.log" ||
    problem "$k: the loss of node 2 spent a restart ('restarting the worker group')"
done
# The checkpoint was written with 3 ranks: the 2 ranks go on from its place in the epoch.
await 30 "node0" grep -q "resumed from checkpoint $ckpt" "$tmp/node0.log" ||
  fail "the demo (WORLD_SIZE=2) did not resume from the checkpoint"
await 30 "node0" continued_from_checkpoint "$tmp/node0.log" 48 ||
  problem "node0.log: the demo (WORLD_SIZE=2) did not go on from the checkpoint's step (its global step + 1, of 48 an epoch)"

case $scenario in
  lost_node)
    expect_exit node0 0 0 90
    expect_exit node1 1 0 30
    ;;
  rejoin)
    # Node 2 comes back while the 2-node group trains.
    await 30 "node0 node1" grep -q '^\[default0\]:epoch [12]/2 step [0-9]* .*: 48 steps an epoch)$' "$tmp/node0.log" ||
      fail "the 2-node group did not train"
    step "a new ddprun on node 2"
    start_node node2b 2
    await 60 "node0 node1 node2b" at_least 'n*_ws3_*' 6 || fail "the group did not scale up to 3 nodes (WORLD_SIZE=3)"
    for k in node0 node1; do
      grep -q "a new node (member [^)]*) asked to join" "$tmp/$k.log" ||
        problem "$k.log does not say 'a new node (member ...) asked to join'"
      grep -q "re-formed the group as round [0-9]*: 3 nodes, WORLD_SIZE=3" "$tmp/$k.log" ||
        problem "$k.log does not say 're-formed the group as round R: 3 nodes, WORLD_SIZE=3'"
    done
    step "scaled up to 3 nodes"
    expect_exit node0 0 0 90
    expect_exit node1 1 0 30
    expect_exit node2b 2 0 30
    grep -q '^\[default0\]:epoch 2/2 step [0-9]* .* (3072/3072 samples, 100.0%; world 3: 32 steps an epoch)$' "$tmp/node0.log" ||
      fail "the 3-node group did not train to the last step (epoch 2/2 at 3072/3072 samples with 3 nodes)"
    ;;
  partition)
    # Let the 2-node group train a little, then heal the link.
    await 30 "node0 node1" grep -q '^\[default0\]:epoch [12]/2 step [0-9]* .*: 48 steps an epoch)$' "$tmp/node0.log" ||
      fail "the 2-node group did not train"
    sleep 1
    step "healing node 2's link"
    "$C" heal "$name" 2
    expect_exit node0 0 0 90
    expect_exit node1 1 0 30
    rc2=$(wait_agent node2 2 30)
    ((rc2 != 124)) || fail "node 2's agent still runs 30 s after node 0 and 1 finished"
    step "node 2's agent exited $rc2"
    ;;
esac
grep -q "final test accuracy: " "$tmp/node0.log" || problem "the demo did not print its final accuracy"

check_one_group_per_round
if [[ $scenario == partition ]]; then
  # After the cut node 2 may only run workers of a round nodes 0 and 1 run too.
  while read -r f; do
    r=$(field "$rec/$f" round)
    ((r == round3)) && continue
    ((${ws_of[$r]} == 3)) || fail "$f: node 2 ran a worker in round $r (WORLD_SIZE ${ws_of[$r]}) without nodes 0 and 1"
    if ! at_least "n0_round${r}_*" 1 || ! at_least "n1_round${r}_*" 1; then
      fail "$f: node 2 ran a worker in round $r that nodes 0 and 1 did not run"
    fi
  done < <(records 'n2_*')
  # Node 2's worker of the 3-node round ended soon after the heal (it cannot be
  # training anyway: its peers left).
  w2=$(records "n2_round${round3}_*" | head -n 1)
  p2=${w2##*_}
  s=$(cat "/proc/$p2/stat" 2>/dev/null || true)
  s=${s##*) }
  [[ -z $s || ${s%% *} == Z || ${s%% *} == X ]] || fail "node 2's worker of round $round3 (pid $p2) still runs"
fi
done_test "($scenario)"
