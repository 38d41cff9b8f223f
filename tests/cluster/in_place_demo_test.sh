#!/usr/bin/env bash
# The Fashion-MNIST demo (train_fashion_mnist, no checkpoint) recovering in place as an
# elastic ddprun job on 3 network-namespace nodes, --nnodes 2:3, one worker per node,
# keep-alives 0.5 s x 2. Two runs of the same settings, one after the other:
#
#   reference  3 nodes, uninterrupted: its final accuracy is the yardstick.
#   in place   3 nodes; mid-epoch node 2 is lost as a whole (SIGKILL of every process
#              in it: agent and worker). Nodes 0 and 1 keep their worker processes
#              (no new worker record), re-form as 2 ranks in place ("re-formed in
#              place" from the demo, "in-place recovery from round" from ddprun) and
#              train on from the interrupted step. Then node 2 comes back (a new
#              agent): nodes 0 and 1 still keep their processes, node 2's new worker
#              receives the state of a live rank (no checkpoint exists to read): the
#              epoch, sample and global step of rank 0's last step; the three train
#              to the end (exit 0).
#
# Checked from rank 0's progress lines (node 0, --log-every 1: one line per step, with
# the samples of the epoch trained and the global step): global steps 1, 2, 3, ... with
# none repeated or skipped, each step advancing the epoch by one global batch of the
# world size of its line (64 x 3, 64 x 2, 64 x 3 again), epochs trained to their end.
# The final test accuracy (all 10,000 test samples) must be within 0.5 points of the
# reference's; both are printed.
#
# Workers use TCP between nodes (GLOO_SOCKET_IFNAME=eth0, DDP_SHM_DISABLE=1). Agents run
# with --max_restarts=0: neither change may spend a restart. DDP_ELASTIC_KEEP=1 keeps the
# logs and worker records.
#
# Needs root (exits 77 otherwise) and the dataset (/usr/share/datasets/fashion-mnist;
# 77 without it). DDP_BUILD_BIN names the folder with ddprun and train_fashion_mnist.
set -euo pipefail

data=/usr/share/datasets/fashion-mnist
if [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
  echo "skipped: the Fashion-MNIST dataset is not installed ($data)" >&2
  exit 77
fi

source "$(dirname "$0")/elastic_lib.sh"
in_cluster 3 "$0" "$@"
# Two runs of about 15 s each, the cluster's and the agents' start-up, on a loaded machine.
DDP_ELASTIC_BUDGET=${DDP_ELASTIC_BUDGET:-150}
setup_cluster

# 24,576 training samples, 64 per rank and step: 128 steps an epoch with 3 ranks, 192
# with 2; 2 epochs, 30 ms of sleep per step (about 5 s an epoch with 3 nodes). All
# 10,000 test samples: an accuracy to 0.01 points.
train_size=24576
batch=64
demo=("$bin/train_fashion_mnist" --train-limit "$train_size" --test-limit 0 --batch-size "$batch"
  --epochs 2 --hidden 32 --log-every 1 --throttle-ms 30)

# progress LOG: rank 0's progress lines as "EPOCH STEPS_PER_EPOCH SAMPLES GLOBAL_STEP".
progress() {
  sed -n 's/^\[default0\]:epoch \([0-9]*\)\/[0-9]* step \([0-9]*\) .* (\([0-9]*\)\/[0-9]* samples, [0-9.]*%; world [0-9]*: \([0-9]*\) steps an epoch)$/\1 \4 \3 \2/p' "$1"
}

# at_step LOG EPOCH S_PER_EPOCH N: at least N progress lines of EPOCH with S_PER_EPOCH
# steps an epoch (a world size) were printed.
at_step() {
  local n
  n=$(progress "$1" | awk -v e="$2" -v s="$3" '$1 == e && $2 == s' | grep -c . || true)
  ((n >= $4))
}

# accuracy LOG: the demo's final test accuracy (a number), empty when not printed.
accuracy() { sed -n 's/^\[default0\]:final test accuracy: \([0-9.]*\)%.*/\1/p' "$1" | tail -n 1; }

# ---- the reference run ---------------------------------------------------------------------
step "reference: the demo on 3 nodes, uninterrupted"
rec_main=$rec
rec=$tmp/rec_ref
mkdir "$rec"
start_node ref0 0
retry 30 store_listens || fail "node 0's store does not listen on ${a[0]}:$port"
start_node ref1 1
start_node ref2 2
expect_exit ref0 0 0 60
expect_exit ref1 1 0 20
expect_exit ref2 2 0 20
ref_acc=$(accuracy "$tmp/ref0.log")
[[ -n $ref_acc ]] || fail "the reference run did not print its final accuracy (ref0.log)"
ref_steps=$(progress "$tmp/ref0.log" | tail -n 1 | cut -d' ' -f4)
step "reference: final test accuracy $ref_acc% after ${ref_steps:-?} steps"
rec=$rec_main

# ---- the run that recovers in place --------------------------------------------------------
port=29401  # a store of its own (the reference's may linger in TIME_WAIT)
step "in place: starting 3 nodes"
start_node node0 0
retry 30 store_listens || fail "node 0's store does not listen on ${a[0]}:$port"
start_node node1 1
start_node node2 2
await 60 "node0 node1 node2" at_least 'n*_ws3_*' 3 || fail "the 3 nodes did not start 3 workers with WORLD_SIZE=3"
await 60 "node0 node1 node2" at_step "$tmp/node0.log" 1 128 30 ||
  fail "the demo did not reach step 30 of epoch 1 with 3 nodes"
w0=$(records 'n0_*')
w1=$(records 'n1_*')
round3=$(field "$rec/$w0" round)

step "node 2 lost: SIGKILL every process in it (agent and worker), mid-epoch"
"$C" signal "$name" 2 KILL --node
expect_exit node2 2 137 10
await 30 "node0 node1" grep -q "in-place recovery from round $round3 " "$tmp/node0.log" ||
  fail "node 0 did not report an in-place recovery from round $round3 ($(states node0 node1))"
await 30 "node0 node1" at_step "$tmp/node0.log" 1 192 20 ||
  fail "the 2 nodes did not train 20 steps of epoch 1 with WORLD_SIZE=2 ($(states node0 node1))"
step "nodes 0 and 1 re-formed in place with WORLD_SIZE=2 and train: $(grep -o "in-place recovery from round $round3 .*" "$tmp/node0.log" | sed 's/ (node 2 (member [^)]*) was lost: [^)]*)//')"
for k in node0 node1; do
  grep -q "ddprun: [0-9:]* node 2 (member [^)]*) was lost: .*; the workers recover in place" "$tmp/$k.log" ||
    problem "$k.log does not say 'node 2 (member ...) was lost: ...; the workers recover in place'"
  grep -q "re-formed the group as round [0-9]*: 2 nodes, WORLD_SIZE=2" "$tmp/$k.log" ||
    problem "$k.log does not say 're-formed the group as round R: 2 nodes, WORLD_SIZE=2'"
  grep -q "in-place recovery from round $round3 " "$tmp/$k.log" ||
    problem "$k.log does not say 'in-place recovery from round $round3'"
  grep -q "re-formed in place" "$tmp/$k.log" ||
    problem "$k.log: the worker did not say 're-formed in place'"
done
grep -q '^\[default0\]:re-formed in place (.*): round [0-9]*, 2 ranks (was 3)' "$tmp/node0.log" ||
  problem "node0.log: the demo did not say 're-formed in place (...): round R, 2 ranks (was 3)'"
[[ $(records 'n[01]_*' | sort) == "$w0"$'\n'"$w1" ]] ||
  problem "nodes 0 and 1 started other workers after the loss: $(records 'n[01]_*' | tr '\n' ' ')"

step "node 2 comes back: a new ddprun on node 2"
start_node node2b 2
await 60 "node0 node1 node2b" at_least 'n2_*_ws3_*' 2 || fail "node 2 did not start a new worker with WORLD_SIZE=3 ($(states node0 node1 node2b))"
w2=$(records 'n2_*' | grep -v "^n2_round${round3}_")
round_back=$(field "$rec/$w2" round)
await 60 "node0 node1 node2b" grep -q "in-place recovery from round [0-9]* .*asked to join" "$tmp/node0.log" ||
  fail "node 0 did not report an in-place recovery for node 2's return ($(states node0 node1 node2b))"
await 30 "node0 node1 node2b" at_step "$tmp/node0.log" 2 128 5 ||
  fail "the 3 nodes did not train 5 steps of epoch 2 with WORLD_SIZE=3 ($(states node0 node1 node2b))"
got=$(grep -o "rank [0-9]*: received the state of rank [0-9]* .*" "$tmp/node2b.log" | head -n 1 || true)
step "scaled up to 3 nodes in round $round_back; node 2's new worker: ${got:-nothing received}"
[[ $got =~ ^rank\ 2:\ received\ the\ state\ of\ rank\ [01]\ .*:\ epoch\ ([0-9]+),\ sample\ ([0-9]+),\ global\ step\ ([0-9]+)$ ]] ||
  problem "node2b.log: node 2's new worker (rank 2) did not say 'received the state of rank 0 or 1 (...): epoch E, sample P, global step G'"
# What it received is where rank 0 stood: its last step before the re-form (sample 0 of an
# epoch: the last step of the one before).
if [[ -n ${BASH_REMATCH[3]:-} ]]; then
  want="^\[default0\]:epoch ${BASH_REMATCH[1]}/2 step ${BASH_REMATCH[3]} .* (${BASH_REMATCH[2]}/$train_size samples, "
  ((BASH_REMATCH[2] > 0)) || want="^\[default0\]:epoch $((BASH_REMATCH[1] - 1))/2 step ${BASH_REMATCH[3]} "
  grep -q "$want" "$tmp/node0.log" ||
    problem "node 2's new worker received epoch ${BASH_REMATCH[1]}, sample ${BASH_REMATCH[2]}, global step ${BASH_REMATCH[3]}: not a step rank 0 trained"
fi
for k in node0 node1; do
  grep -q "a new node (member [^)]*) asked to join.*; the workers recover in place" "$tmp/$k.log" ||
    problem "$k.log does not say 'a new node (member ...) asked to join ...; the workers recover in place'"
  grep -q "re-formed the group as round $round_back: 3 nodes, WORLD_SIZE=3" "$tmp/$k.log" ||
    problem "$k.log does not say 're-formed the group as round $round_back: 3 nodes, WORLD_SIZE=3'"
  (($(grep -c "in-place recovery from round" "$tmp/$k.log") == 2)) ||
    problem "$k.log does not report 2 in-place recoveries ('in-place recovery from round')"
done
grep -q '^\[default0\]:re-formed in place (.*): round [0-9]*, 3 ranks (was 2)' "$tmp/node0.log" ||
  problem "node0.log: the demo did not say 're-formed in place (...): round R, 3 ranks (was 2)'"

expect_exit node0 0 0 60
expect_exit node1 1 0 20
expect_exit node2b 2 0 20
step "all three finished"

# The survivors' workers ran from the start to the end: one record each, nothing more.
if [[ $(records 'n[01]_*' | sort) == "$w0"$'\n'"$w1" ]]; then
  step "nodes 0 and 1 kept their workers from start to end (pids ${w0##*_} and ${w1##*_})"
else
  problem "nodes 0 and 1 started other workers: $(records 'n[01]_*' | tr '\n' ' ') (expected $w0 $w1)"
fi
(($(count 'n2_*') == 2)) || problem "node 2 started $(count 'n2_*') workers, not 2 (one before its loss, one after)"
for k in node0 node1 node2b; do
  ! grep -q "restarting the worker group" "$tmp/$k.log" ||
    problem "$k: a membership change spent a restart ('restarting the worker group')"
  ! grep -q "stopping the workers to re-form the group" "$tmp/$k.log" ||
    problem "$k: the workers were stopped for a re-form ('stopping the workers to re-form the group')"
  ! grep -q "resumed from checkpoint" "$tmp/$k.log" || problem "$k: the demo read a checkpoint"
done

# Rank 0's steps: global steps 1, 2, 3, ...; each advancing its epoch by one global batch
# of its line's world size (steps per epoch = samples / global batch); epochs trained
# to the end; the world sizes 3, then 2, then 3.
phases=$(progress "$tmp/node0.log" | awk -v size="$train_size" -v b="$batch" '
  function bad(why) { print "line " NR " (epoch " $1 ", " $3 " samples, global step " $4 "): " why; failed = 1; exit }
  {
    if ($4 != g + 1) bad("global step " $4 " after " g)
    if ($1 == e) {
      d = $3 - p
    } else {
      if ($1 != e + 1) bad("epoch " $1 " after " e)
      if (e > 0 && p + d <= size) bad("epoch " e " ended at " p " samples, before its last step")
      d = $3
    }
    if (d <= 0 || d % b != 0) bad("advanced " d " samples (one global batch is a multiple of " b ")")
    if (int(size / d) != $2) bad("advanced " d " samples: a world of " d / b " ranks, whose epoch has " int(size / d) " steps, not " $2)
    w = d / b
    if (w != last) {
      seq = seq (seq == "" ? "" : ",") w
      if (last != "") moves = moves sprintf("; %d -> %d ranks: global step %d at sample %d of epoch %d, then %d at %d of epoch %d", last, w, g, p, e, $4, $3, $1)
      last = w
    }
    n[w]++
    e = $1; p = $3; g = $4
  }
  END {
    if (failed) exit 1
    if (e != 2 || p + d <= size) { print "the run stopped at epoch " e ", " p " samples"; exit 1 }
    printf "world sizes %s; %d steps with 3 ranks, %d with 2; %d global steps%s\n", seq, n[3], n[2], g, moves
  }') || fail "rank 0's progress: $phases"
step "rank 0's progress: $phases"
[[ $phases == "world sizes 3,2,3;"* ]] || problem "the world sizes were not 3, then 2, then 3: $phases"

check_one_group_per_round

acc=$(accuracy "$tmp/node0.log")
[[ -n $acc ]] || fail "the demo did not print its final accuracy (node0.log)"
step "final test accuracy: $acc% in place, $ref_acc% uninterrupted"
awk -v x="$acc" -v y="$ref_acc" 'BEGIN { d = x - y; if (d < 0) d = -d; exit !(d <= 0.5) }' ||
  problem "the final accuracy ($acc%) is not within 0.5 points of the uninterrupted run's ($ref_acc%)"
done_test "(in place: node 2 lost and back)"
