#!/usr/bin/env bash
# The PyTorch example (examples/torch_fashion_mnist_elastic/train.py: DDP on the backend
# "ddp", ddp_torch.init_process_group(recover_in_place=True)) as an elastic ddprun job on 3
# network-namespace nodes, --nnodes 2:3, one worker per node, keep-alives 0.5 s x 2.
# The MLP 784-64-10; 12,288 training samples, 64 per rank and step (64 steps an epoch with
# 3 ranks, 96 with 2; the learning rate scales with the global batch), 2 epochs (3 in
# lost_and_back), 30 ms of
# sleep per step; every step of rank 0 printed ("step=G world=W rank=0 epoch=E position=P
# loss=L"). One scenario per run:
#
#   lost_and_back  Two runs, one after the other. reference: 3 nodes, uninterrupted; its
#                  final accuracy is the yardstick. in place: mid-epoch node 2 is lost as
#                  a whole (SIGKILL of its agent and worker); nodes 0 and 1 keep their
#                  worker processes and re-form as 2 ranks; node 2 comes back (a new
#                  agent) and its new worker says it received the state of a live rank;
#                  no checkpoint exists (none read). Rank 0's global steps go 1, 2, 3, ...
#                  (none repeated or skipped), each advancing the epoch by one global batch
#                  of its world (64 x 3, 64 x 2, 64 x 3), epochs trained to their end; the
#                  final test accuracy (10,000 samples) within 0.5 points of the reference's.
#   crash          1 epoch, 15 ms a step, --checkpoint every 4 steps, --max_restarts=5,
#                  through torch_fail_in_reform.py.
#                  Node 1's worker is SIGKILLed: only node 1 starts a new worker, which
#                  receives the state of a live rank (nodes 0 and 2 keep theirs). Then node
#                  2's worker is SIGKILLed while node 1's kept worker is set to fail during
#                  the re-form that follows: node 1 falls back to a restart (a new worker,
#                  given rank 0's live state: the checkpoint is not read), node 0 keeps its
#                  worker to the end, rank 0's steps go 1, 2, 3, ... through both changes.
#   no_opt_in      as crash, without the wrapper, with --no-recover-in-place: node 2 lost as a
#                  whole; nodes 0 and 1 restart their workers as before (new processes,
#                  resumed from the checkpoint, no in-place recovery) and finish.
#
# Workers use TCP between nodes (GLOO_SOCKET_IFNAME=eth0, DDP_SHM_DISABLE=1). Needs root
# (exits 77 otherwise), the dataset (/usr/share/datasets/fashion-mnist) and ddp_torch built
# beside DDP_BUILD_BIN's ddprun (../lib/ddprun/python; 77 without them). DDP_ELASTIC_KEEP=1
# keeps the logs and worker records.
set -euo pipefail

scenario=${1:-}
case $scenario in
  lost_and_back | crash | no_opt_in) ;;
  *) echo "usage: $0 lost_and_back|crash|no_opt_in" >&2; exit 2 ;;
esac
data=/usr/share/datasets/fashion-mnist
if [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
  echo "skipped: the Fashion-MNIST dataset is not installed ($data)" >&2
  exit 77
fi
bin_dir=${DDP_BUILD_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/build/bin}
if [[ ! -d $bin_dir/../lib/ddprun/python/ddp_torch ]]; then
  echo "skipped: ddp_torch is not built beside $bin_dir" >&2
  exit 77
fi

source "$(dirname "$0")/elastic_lib.sh"
in_cluster 3 "$0" "$@"
# lost_and_back: two runs of 15 to 25 s each (3 Pythons importing torch at once on a
# loaded 2-core machine take several seconds), the cluster's and the agents' start-up.
DDP_ELASTIC_BUDGET=${DDP_ELASTIC_BUDGET:-85}
setup_cluster

train_size=12288
batch=64
epochs=2  # as --epochs of the runs check_progress reads
train=(/usr/bin/python3 "$src/examples/torch_fashion_mnist_elastic/train.py" --train-limit "$train_size"
  --test-limit 0 --batch-size "$batch" --epochs 2 --hidden 64 --log-every 1 --throttle-ms 30)

# progress LOG: rank 0's step lines as "STEP WORLD EPOCH POSITION".
progress() {
  sed -n 's/^\[default0\]:step=\([0-9]*\) world=\([0-9]*\) rank=0 epoch=\([0-9]*\) position=\([0-9]*\) .*/\1 \2 \3 \4/p' "$1"
}

# steps_with LOG WORLD N [AFTER]: rank 0 printed at least N steps with WORLD ranks, past
# global step AFTER (0).
steps_with() {
  local n
  n=$(progress "$1" | awk -v w="$2" -v a="${4:-0}" '$2 == w && $1 > a' | grep -c . || true)
  ((n >= $3))
}

# last_step LOG: rank 0's last global step (0 before the first).
last_step() { progress "$1" | tail -n 1 | awk '{ print $1 + 0 } END { if (NR == 0) print 0 }'; }

# accuracy LOG: the final test accuracy (a number), empty when not printed.
accuracy() { sed -n 's/^\[default0\]:final test accuracy: \([0-9.]*\)%.*/\1/p' "$1" | tail -n 1; }

# received LOG: the first "rank R: received the state of rank X (live): ..." line, or "".
received() { grep -o "rank [0-9]*: received the state of rank [0-9]* (live).*" "$1" | head -n 1 || true; }

# pid_of RECORD: the worker's pid (the record's name ends with it).
pid_of() { echo "${1##*_}"; }

# start_nodes KEY...: node i (0, 1, 2) under KEY i, node 0 first (it hosts the store).
start_nodes() {
  local i=0 k
  for k in "$@"; do
    start_node "$k" "$i"
    if ((i == 0)); then
      retry 30 store_listens || fail "node 0's store does not listen on ${a[0]}:$port"
    fi
    i=$((i + 1))
  done
}

# check_progress LOG: rank 0's steps 1, 2, 3, ... each advancing its epoch by one global
# batch of its world, epochs trained to their end, all $epochs of them. Prints "world sizes
# 3,2,3; N steps with 3 ranks, M with 2; G global steps; ..." or fails.
check_progress() {
  progress "$1" | awk -v size="$train_size" -v b="$batch" -v epochs="$epochs" '
    function bad(why) { print "line " NR " (global step " $1 ", world " $2 ", epoch " $3 ", position " $4 "): " why; failed = 1; exit }
    {
      if ($1 != g + 1) bad("global step " $1 " after " g)
      if ($3 == e) {
        d = $4 - p
      } else {
        if ($3 != e + 1) bad("epoch " $3 " after " e)
        if (e > 0 && size - p >= b * w) bad("epoch " e " ended at position " p ", before its last step")
        d = $4
      }
      if (d != b * $2) bad("advanced " d " samples, not one global batch of " $2 " ranks (" b * $2 ")")
      if ($2 != w) {
        seq = seq (seq == "" ? "" : ",") $2
        if (w != "") moves = moves sprintf("; %d -> %d ranks after global step %d (epoch %d, position %d)", w, $2, g, e, p)
        w = $2
      }
      n[w]++
      g = $1; e = $3; p = $4
    }
    END {
      if (failed) exit 1
      if (e != epochs || size - p >= b * w) { print "the run stopped at epoch " e ", position " p; exit 1 }
      printf "world sizes %s; %d steps with 3 ranks, %d with 2; %d global steps%s\n", seq, n[3], n[2], g, moves
    }'
}

# no_line KEY... -- TEXT WHY: none of the agents' logs holds TEXT (a problem otherwise).
no_line() {
  local keys=() k
  while [[ $1 != -- ]]; do keys+=("$1"); shift; done
  shift
  for k in "${keys[@]}"; do
    ! grep -q "$1" "$tmp/$k.log" || problem "$k: $2 ('$1')"
  done
}

demo=("${train[@]}")

lost_and_back() {
  # 3 epochs here: with 2, the survivors (43 ms a step as 2 ranks) once finished the run
  # about 5 s after the loss, before a loaded CI machine had node 2's new agent asking to
  # join, and the 3 nodes never trained together again.
  epochs=3
  demo=("${train[@]}" --epochs "$epochs")
  step "reference: 3 nodes, uninterrupted"
  local rec_main=$rec
  rec=$tmp/rec_ref
  mkdir "$rec"
  start_nodes ref0 ref1 ref2
  expect_exit ref0 0 0 60
  expect_exit ref1 1 0 20
  expect_exit ref2 2 0 20
  ref_acc=$(accuracy "$tmp/ref0.log")
  [[ -n $ref_acc ]] || fail "the reference run did not print its final accuracy (ref0.log)"
  step "reference: final test accuracy $ref_acc% after $(last_step "$tmp/ref0.log") steps"
  rec=$rec_main

  port=29401  # a store of its own (the reference's may linger in TIME_WAIT)
  step "in place: starting 3 nodes"
  start_nodes node0 node1 node2
  await 60 "node0 node1 node2" steps_with "$tmp/node0.log" 3 20 || fail "the 3 nodes did not train 20 steps together"
  w0=$(records 'n0_*')
  w1=$(records 'n1_*')
  local round3 at_kill killed
  round3=$(field "$rec/$w0" round)
  at_kill=$(last_step "$tmp/node0.log")
  step "node 2 lost: SIGKILL of every process in it (agent and worker), rank 0 at global step $at_kill"
  killed=$EPOCHREALTIME
  "$C" signal "$name" 2 KILL --node
  expect_exit node2 2 137 10
  await 30 "node0 node1" steps_with "$tmp/node0.log" 2 1 || fail "nodes 0 and 1 did not train again with 2 ranks ($(states node0 node1))"
  local again
  again=$(awk -v a="$killed" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  await 30 "node0 node1" steps_with "$tmp/node0.log" 2 15 || fail "nodes 0 and 1 did not train 15 steps with 2 ranks ($(states node0 node1))"
  step "nodes 0 and 1 train as 2 ranks (seen within ${again} s of the kill): $(grep -o '\[default0\]:re-formed in place .*' "$tmp/node0.log" | head -n 1 | cut -c 50- | sed 's/^/.../')"
  for k in node0 node1; do
    grep -q "in-place recovery from round $round3 " "$tmp/$k.log" ||
      problem "$k.log does not say 'in-place recovery from round $round3'"
  done
  grep -q '^\[default0\]:re-formed in place (.*): round [0-9]*, 2 ranks (was 3)' "$tmp/node0.log" ||
    problem "node0.log: train.py did not say 're-formed in place (...): round R, 2 ranks (was 3)'"

  step "node 2 comes back: a new ddprun on node 2"
  local back_at
  back_at=$(last_step "$tmp/node0.log")
  start_node node2b 2
  await 60 "node0 node1 node2b" steps_with "$tmp/node0.log" 3 5 "$back_at" ||
    fail "the 3 nodes did not train 5 steps together again ($(states node0 node1 node2b))"
  w2=$(records 'n2_*' | grep -v "^n2_round${round3}_")
  local got
  got=$(received "$tmp/node2b.log")
  step "3 ranks again after global step $back_at; node 2's new worker (pid $(pid_of "$w2")): ${got:-nothing received}"
  if [[ $got =~ ^rank\ 2:\ received\ the\ state\ of\ rank\ [01]\ \(live\):\ .*global\ step\ ([0-9]+)$ ]]; then
    grep -q "^\[default0\]:step=${BASH_REMATCH[1]} " "$tmp/node0.log" ||
      problem "node 2's new worker received global step ${BASH_REMATCH[1]}: not a step rank 0 trained"
  else
    problem "node2b.log: node 2's new worker did not say 'rank 2: received the state of rank 0 or 1 (live): ... global step G'"
  fi
  grep -q '^\[default0\]:re-formed in place (.*): round [0-9]*, 3 ranks (was 2)' "$tmp/node0.log" ||
    problem "node0.log: train.py did not say 're-formed in place (...): round R, 3 ranks (was 2)'"

  expect_exit node0 0 0 60
  expect_exit node1 1 0 20
  expect_exit node2b 2 0 20
  step "all three finished"
  if [[ $(records 'n[01]_*' | sort) == "$w0"$'\n'"$w1" ]]; then
    step "nodes 0 and 1 kept their workers from start to end (pids $(pid_of "$w0") and $(pid_of "$w1"))"
  else
    problem "nodes 0 and 1 started other workers: $(records 'n[01]_*' | tr '\n' ' ') (expected $w0 $w1)"
  fi
  (($(count 'n2_*') == 2)) || problem "node 2 started $(count 'n2_*') workers, not 2 (one before its loss, one after)"
  no_line node0 node1 node2b -- "restarting the worker group" "a membership change spent a restart"
  no_line node0 node1 node2b -- "resumed from checkpoint" "train.py read a checkpoint"
  local phases
  phases=$(check_progress "$tmp/node0.log") || fail "rank 0's progress: $phases"
  step "rank 0's progress: $phases"
  [[ $phases == "world sizes 3,2,3;"* ]] || problem "the world sizes were not 3, then 2, then 3: $phases"
  check_one_group_per_round
  local acc
  acc=$(accuracy "$tmp/node0.log")
  [[ -n $acc ]] || fail "train.py did not print its final accuracy (node0.log)"
  step "final test accuracy: $acc% in place, $ref_acc% uninterrupted"
  awk -v x="$acc" -v y="$ref_acc" 'BEGIN { d = x - y; if (d < 0) d = -d; exit !(d <= 0.5) }' ||
    problem "the final accuracy ($acc%) is not within 0.5 points of the uninterrupted run's ($ref_acc%)"
}

crash() {
  DDP_ELASTIC_MAX_RESTARTS=5
  demo=(/usr/bin/python3 "$src/tests/cluster/torch_fail_in_reform.py" "$tmp/fail_in_reform"
    "${train[@]:1}" --throttle-ms 15 --checkpoint "$tmp/ckpt.pt" --checkpoint-every 4)
  start_nodes node0 node1 node2
  await 60 "node0 node1 node2" steps_with "$tmp/node0.log" 3 5 || fail "the 3 nodes did not train 5 steps together"
  local w0 w1 w2 w1b at
  w0=$(records 'n0_*')
  w1=$(records 'n1_*')
  w2=$(records 'n2_*')
  at=$(last_step "$tmp/node0.log")
  step "node 1's worker (pid $(pid_of "$w1")) SIGKILLed at global step $at"
  kill -KILL "$(pid_of "$w1")" || fail "node 1's worker (pid $(pid_of "$w1")) has ended"
  await 60 "node0 node1 node2" grep -q "received the state of rank" "$tmp/node1.log" ||
    fail "node 1 did not start a worker that received the state ($(states node0 node1 node2))"
  at=$(last_step "$tmp/node0.log")
  await 30 "node0 node1 node2" steps_with "$tmp/node0.log" 3 3 "$at" ||
    fail "the 3 ranks did not train again after the crash ($(states node0 node1 node2))"
  w1b=$(records 'n1_*' | grep -v "^$w1\$" | head -n 1 || true)
  local got
  got=$(received "$tmp/node1.log")
  step "node 1's new worker (pid $(pid_of "${w1b:-?_?}")): ${got:-nothing received}"
  [[ -n $w1b ]] || problem "node 1 started no new worker"
  [[ $got =~ ^rank\ 1:\ received\ the\ state\ of\ rank\ [02]\ \(live\) ]] ||
    problem "node1.log: node 1's new worker did not say 'rank 1: received the state of rank 0 or 2 (live)'"
  [[ $(records 'n0_*') == "$w0" && $(records 'n2_*') == "$w2" ]] ||
    problem "nodes 0 and 2 started other workers after node 1's crash: $(records 'n[02]_*' | tr '\n' ' ')"

  at=$(last_step "$tmp/node0.log")
  step "node 2's worker (pid $(pid_of "$w2")) SIGKILLed at global step $at; node 1's kept worker fails in the re-form"
  touch "$tmp/fail_in_reform.1"
  kill -KILL "$(pid_of "$w2")" || fail "node 2's worker (pid $(pid_of "$w2")) has ended"
  expect_exit node0 0 0 60
  expect_exit node1 1 0 20
  expect_exit node2 2 0 20
  grep -q "torch_fail_in_reform: rank 1 fails during the re-form" "$tmp/node1.log" ||
    problem "node 1's worker did not fail during the re-form"
  [[ ! -e $tmp/fail_in_reform.1 ]] || problem "node 1's worker did not re-form"
  (($(grep -c "restarting the worker group" "$tmp/node1.log") == 2)) ||
    problem "node 1 did not restart its worker twice (the crash, the failed re-form)"
  local w1c
  w1c=$(records 'n1_*' | grep -v "^$w1\$" | grep -v "^$w1b\$" | head -n 1 || true)
  got=$(grep -o "rank 1: received the state of rank [0-9]* (live).*" "$tmp/node1.log" | sed -n 2p || true)
  step "fell back to a restart on node 1: its third worker (pid $(pid_of "${w1c:-?_?}")): ${got:-nothing received}"
  [[ -n $w1c ]] || problem "node 1 started no worker after the failed re-form"
  [[ $got =~ ^rank\ 1:\ received\ the\ state\ of\ rank\ 0\ \(live\) ]] ||
    problem "node 1's third worker did not say 'rank 1: received the state of rank 0 (live)'"
  [[ $(records 'n0_*') == "$w0" ]] ||
    problem "node 0 started other workers: $(records 'n0_*' | tr '\n' ' ') (expected $w0 alone)"
  no_line node0 node1 node2 -- "resumed from checkpoint" "a restarted worker read the checkpoint, not a live state"
  local phases
  phases=$(check_progress "$tmp/node0.log") || fail "rank 0's progress: $phases"
  step "node 0 kept its worker (pid $(pid_of "$w0")) from start to end; rank 0's progress: $phases"
  [[ -n $(accuracy "$tmp/node0.log") ]] || problem "train.py did not print its final accuracy"
}

no_opt_in() {
  demo=("${train[@]}" --epochs 1 --throttle-ms 15 --no-recover-in-place --checkpoint "$tmp/ckpt.pt"
    --checkpoint-every 4)
  start_nodes node0 node1 node2
  await 60 "node0 node1 node2" steps_with "$tmp/node0.log" 3 5 || fail "the 3 nodes did not train 5 steps together"
  grep -q '^\[default0\]:train.py: 3 ranks, recovering in place: no' "$tmp/node0.log" ||
    problem "node0.log: train.py does not say that it does not recover in place"
  local w0 w1 at
  w0=$(records 'n0_*')
  w1=$(records 'n1_*')
  at=$(last_step "$tmp/node0.log")
  step "node 2 lost at global step $at"
  "$C" signal "$name" 2 KILL --node
  expect_exit node2 2 137 10
  await 60 "node0 node1" steps_with "$tmp/node0.log" 2 5 || fail "nodes 0 and 1 did not train again with 2 ranks ($(states node0 node1))"
  expect_exit node0 0 0 60
  expect_exit node1 1 0 20
  step "nodes 0 and 1 restarted their workers: $(records 'n[01]_*' | tr '\n' ' '); $(grep -o 'resumed from checkpoint .*' "$tmp/node0.log" | head -n 1)"
  [[ $(count 'n0_*') == 2 && $(count 'n1_*') == 2 ]] ||
    problem "nodes 0 and 1 did not each start one new worker (was $w0 $w1)"
  grep -q '^\[default0\]:resumed from checkpoint ' "$tmp/node0.log" ||
    problem "node0.log: the restarted workers did not resume from the checkpoint"
  no_line node0 node1 -- "in-place recovery from round" "the agents recovered in place"
  no_line node0 node1 -- "re-formed in place" "a worker re-formed in place"
}

"$scenario"
done_test "($scenario)"
