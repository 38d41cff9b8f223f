#!/usr/bin/env bash
# The Fashion-MNIST demo (as elastic_demo_test.sh runs it: a few seconds of training on a
# few thousand samples, a checkpoint in a shared temp dir) as an elastic ddprun job on 3
# network-namespace nodes that meet in etcd: --nnodes 2:3 --rdzv_backend=etcd
# --rdzv_endpoint=<a0>:2379,<a1>:2379,<a2>:2379, keep-alives 0.5 s x 2, --node_rank=i.
# A 3-member etcd cluster runs with one member inside each node (the node's address,
# ports 2379/2380, data under the test's temp dir).
#
# Mid-training, node 0 is lost as a whole: every process in it is SIGKILLed (its agent,
# group rank 0, whose built-in store the workers use; its worker; its etcd member: 2 of
# 3 members remain, a quorum). Nodes 1 and 2 must say node 0 was lost, re-form as 2
# nodes (WORLD_SIZE=2) with their workers' store (DDP_STORE_ADDR) moved to node 1, the
# new group rank 0, resume from the checkpoint and finish (exit 0) with the demo's final
# accuracy. The demo's rank 0 prints progress and writes the checkpoint: node 0 before
# the loss, node 1 after it.
#
# Workers use TCP between nodes (GLOO_SOCKET_IFNAME=eth0, DDP_SHM_DISABLE=1). Every
# etcd member is stopped and the temp dir removed at the end, whatever happens (the
# cluster itself is destroyed by `scripts/cluster with`). DDP_ELASTIC_KEEP=1 keeps the
# logs, worker records and etcd data.
#
# Needs root, /usr/bin/etcd (and etcdctl) and the dataset (/usr/share/datasets/fashion-mnist);
# exits 77 (skipped) without one of them. DDP_BUILD_BIN names the folder with ddprun and
# train_fashion_mnist.
set -euo pipefail

if [[ $(id -u) != 0 ]]; then
  echo "skipped: needs root (network namespaces)" >&2
  exit 77
fi
for b in "${DDP_ETCD:-/usr/bin/etcd}" "${DDP_ETCDCTL:-/usr/bin/etcdctl}"; do
  if [[ ! -x $b ]]; then
    echo "skipped: etcd is not installed ($b is missing)" >&2
    exit 77
  fi
done
data=/usr/share/datasets/fashion-mnist
if [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
  echo "skipped: the Fashion-MNIST dataset is not installed ($data)" >&2
  exit 77
fi

source "$(dirname "$0")/elastic_lib.sh"
in_cluster 3 "$0" "$@"
setup_cluster
# The etcd members stop before their data goes (and also when the test fails).
if [[ ${DDP_ELASTIC_KEEP:-} == 1 ]]; then
  trap 'stop_etcd_cluster' EXIT
else
  trap 'stop_etcd_cluster; rm -rf "$tmp"' EXIT
fi

step "starting a 3-member etcd cluster (one member per node)"
start_etcd_cluster || fail "the etcd cluster ($etcd_endpoints) did not become healthy within 30 s"
rdzv_backend=etcd
rdzv_endpoint=$etcd_endpoints

setup_demo
# Restarts, not in-place recovery: this test checks the restart path (new workers, checkpoint resume).
demo+=(--no-recover-in-place)

step "starting 3 nodes on etcd at $etcd_endpoints"
start_node node0 0
start_node node1 1
start_node node2 2
await 60 "node0 node1 node2" at_least 'n*_ws3_*' 3 || fail "the 3 nodes did not start 3 workers with WORLD_SIZE=3"
await 60 "node0 node1 node2" trained_steps_at_3 8 || fail "the demo did not reach step 8 with 3 nodes"
[[ -f $ckpt ]] || fail "no checkpoint after 8 steps"
r3=$(records 'n0_*_ws3_*' | head -n 1)
round3=$(field "$rec/$r3" round)
[[ $(field "$rec/$r3" store) == "${a[0]}:"* ]] ||
  problem "the 3-node round's workers use the store at $(field "$rec/$r3" store), not node 0's (${a[0]})"

leader=$(etcd_leader "$etcd_endpoints")
step "node 0 lost: SIGKILL every process in it (agent, worker, etcd member; the etcd leader is ${leader:-unknown})"
"$C" signal "$name" 0 KILL --node
killed=$EPOCHREALTIME
expect_exit node0 0 137 10

if ! await 60 "node1 node2" at_least 'n[12]_*_ws2_*' 2; then
  why=
  grep -q "failed with exit code" "$tmp/node1.log" "$tmp/node2.log" &&
    why="; their workers failed first (a collective with the lost node) and the agents counted it as a worker failure, not a membership change"
  fail "nodes 1 and 2 did not re-form with WORLD_SIZE=2 ($(states node1 node2))$why"
fi
step "nodes 1 and 2 re-formed with WORLD_SIZE=2, $(awk -v a="$killed" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }') s after the loss"
for k in node1 node2; do
  grep -q "ddprun: [0-9:]* node 0 (member [^)]*) was lost" "$tmp/$k.log" ||
    problem "$k.log does not say 'node 0 (member ...) was lost'"
  grep -q "re-formed the group as round [0-9]*: 2 nodes, WORLD_SIZE=2" "$tmp/$k.log" ||
    problem "$k.log does not say 're-formed the group as round R: 2 nodes, WORLD_SIZE=2'"
  ! grep -q "restarting the worker group" "$tmp/$k.log" ||
    problem "$k: the loss of node 0 spent a restart ('restarting the worker group')"
  ! grep -q "lost the rendezvous store" "$tmp/$k.log" ||
    problem "$k: the agent lost the rendezvous store (etcd should have failed over to a surviving member)"
done
# The re-formed round: node 1 is group rank 0 and serves the workers' store.
for f in $(records 'n[12]_*_ws2_*'); do
  st=$(field "$rec/$f" store)
  [[ $st == "${a[1]}:"* ]] || problem "$f: the re-formed round's worker uses the store at $st, not node 1's (${a[1]})"
  (($(field "$rec/$f" round) > round3)) || problem "$f: a 2-node worker in round $(field "$rec/$f" round), not after round $round3"
done
at_least 'n1_*_ws2_r0_*' 1 || problem "node 1 does not run rank 0 in the re-formed round"
# The checkpoint was written with 3 ranks: the 2 ranks go on from its place in the epoch.
await 30 "node1" grep -q "resumed from checkpoint $ckpt" "$tmp/node1.log" ||
  fail "the demo (WORLD_SIZE=2, rank 0 on node 1) did not resume from the checkpoint"
await 30 "node1" continued_from_checkpoint "$tmp/node1.log" 48 ||
  problem "node1.log: the demo (WORLD_SIZE=2) did not go on from the checkpoint's step (its global step + 1, of 48 an epoch)"

expect_exit node1 1 0 90
expect_exit node2 2 0 30
acc=$(grep -o "final test accuracy: .*" "$tmp/node1.log" | tail -n 1 || true)
[[ -n $acc ]] || problem "the demo did not print its final accuracy (node1.log)"
step "${acc:-no final accuracy}"
grep -q '^\[default0\]:epoch 2/2 step [0-9]* .* (3072/3072 samples, 100.0%; world 2: 48 steps an epoch)$' "$tmp/node1.log" ||
  problem "the 2-node group did not train to the last step (epoch 2/2 at 3072/3072 samples with 2 nodes in node1.log)"

check_one_group_per_round
done_test "(etcd, node 0 lost)"
