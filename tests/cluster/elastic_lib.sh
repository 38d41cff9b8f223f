# shellcheck shell=bash
# Sourced by the elastic cluster tests (elastic_demo_test.sh, elastic_membership_test.sh,
# in_place_demo_test.sh):
# elastic ddprun agents (--rdzv_backend=c10d, short keep-alives), one per network-namespace
# node of scripts/cluster. Node 0 hosts the rendezvous store at its own address.
# (etcd_demo_test.sh sets rdzv_backend=etcd and rdzv_endpoint to an etcd cluster with one
# member per node: start_etcd_cluster.)
#
# Every worker is started through a small wrapper that records it, then execs the
# real program (so the worker keeps the parent-death signal ddprun gives it): one
# file per worker in $rec, named n<node>_round<R>_ws<WORLD_SIZE>_r<RANK>_<pid>, holding
# "node= group_rank= rank= world_size= round= master=<MASTER_ADDR> start=<epoch seconds>
# store=<DDP_STORE_ADDR>:<DDP_STORE_PORT>".
#
# A test calls in_cluster N "$@" first: outside a cluster it re-runs the script inside
# `scripts/cluster with N` (a fresh cluster that is always destroyed, also on a
# signal); inside, it sets up $name, $tmp, $rec, the node addresses a[0..N-1].

src=${DDP_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
C=$src/scripts/cluster
bin=${DDP_BUILD_BIN:-$src/build/bin}
port=29400
# keep_alive 0.5 s x 2: a lost node is noticed within about a second.
# shellcheck disable=SC2034  # used by the tests
conf_fast=keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=1

# in_cluster N SCRIPT ARGS...
in_cluster() {
  local n=$1 script=$2
  shift 2
  if [[ ${DDP_ELASTIC_TEST_INNER:-} != 1 || -z ${DDP_CLUSTER:-} ]]; then
    export DDP_ELASTIC_TEST_INNER=1
    exec "$C" with "$n" -- bash "$script" "$@"
  fi
}

setup_cluster() {
  name=$DDP_CLUSTER
  local i
  for b in ddprun ddprun_test_worker train_fashion_mnist; do
    [[ -x $bin/$b ]] || { echo "FAIL: $bin/$b is missing (build it; DDP_BUILD_BIN names the folder)" >&2; exit 1; }
  done
  a=()
  # shellcheck disable=SC2153  # set by `scripts/cluster with`
  for ((i = 0; i < DDP_CLUSTER_N; i++)); do a[i]=$("$C" addr "$name" "$i"); done
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddp-elastic.XXXXXX")
  chmod 755 "$tmp"
  rec=$tmp/rec
  mkdir "$rec" "$tmp/w"
  # DDP_ELASTIC_KEEP=1 keeps the logs and records (for debugging).
  if [[ ${DDP_ELASTIC_KEEP:-} == 1 ]]; then
    echo "logs and worker records in $tmp"
  else
    trap 'rm -rf "$tmp"' EXIT
  fi
  cat >"$tmp/worker.sh" <<'EOF'
#!/usr/bin/env bash
# A worker: record who it is, then become the program.
rec=$1
shift
round=${DDP_STORE_PREFIX#*round_}
round=${round%%/*}
printf 'node=%s group_rank=%s rank=%s world_size=%s round=%s master=%s start=%s store=%s\n' \
  "${DDP_CLUSTER_NODE:-x}" "${GROUP_RANK:-x}" "${RANK:-x}" "${WORLD_SIZE:-x}" "$round" \
  "${MASTER_ADDR:-x}" "$EPOCHREALTIME" "${DDP_STORE_ADDR:-x}:${DDP_STORE_PORT:-x}" >"$rec/.tmp.$$"
mv "$rec/.tmp.$$" "$rec/n${DDP_CLUSTER_NODE:-x}_round${round}_ws${WORLD_SIZE:-x}_r${RANK:-x}_$$"
exec "$@"
EOF
  chmod 755 "$tmp/worker.sh"
  t0=$SECONDS
  # Every wait is cut to what is left of this budget, so that a hung scenario
  # fails with its message (and `with` cleans up) before ctest's TIMEOUT kills it.
  deadline=$((SECONDS + ${DDP_ELASTIC_BUDGET:-110}))
}

# clamp T: T, or the seconds left of the budget when fewer (at least 1).
clamp() {
  local left=$((deadline - SECONDS))
  ((left >= 1)) || left=1
  echo $(($1 < left ? $1 : left))
}

# Prints a line with the seconds since the start.
step() { echo "[$((SECONDS - t0)) s] $*"; }

# The last N lines of every agent's log, without the demo's progress lines and
# the workers' transport notes.
logs_of() {
  local f
  for f in "$tmp"/*.log; do
    [[ -f $f ]] || continue
    echo "----- $(basename "$f")"
    grep -Ev '^\[default0\]:epoch [0-9]+/[0-9]+ step |no shared-memory all-reduce' "$f" | tail -n "${1:-60}"
  done
}

# A check that fails without stopping the test (so that one run shows every
# deviation): all are reported at the end by done_test, or by a later fail.
problems=()
problem() { echo "[$((SECONDS - t0)) s] PROBLEM: $*" >&2; problems+=("$*"); }

# fail MSG: stops the test, printing every problem, MSG, the worker records and
# the ends of the agents' logs.
fail() {
  {
    local p
    for p in "${problems[@]}"; do echo "FAIL: $p"; done
    [[ -z $* ]] || echo "FAIL: $*"
    echo "----- worker records:"
    (cd "$rec" && for f in n*; do [[ -f $f ]] && cat "$f"; done) | sort -t= -k8,8n
    logs_of "${DDP_ELASTIC_LOG_LINES:-60}"
  } >&2
  exit 1
}

# The end of a test: PASS, or FAIL with every problem.
done_test() {
  ((${#problems[@]} == 0)) || fail ""
  step "PASS $*"
}

# start_agent KEY NODE NNODES CONF [DDPRUN FLAGS...] -- PROGRAM ARGS...
# Starts ddprun on NODE (log $tmp/KEY.log; pid in pid[KEY]). Backend and endpoint:
# $rdzv_backend and $rdzv_endpoint when set, else c10d and node 0's store.
declare -A pid nodeof
start_agent() {
  local key=$1 node=$2 nnodes=$3 conf=$4
  shift 4
  nodeof[$key]=$node
  local flags=()
  while (($#)) && [[ $1 != -- ]]; do flags+=("$1"); shift; done
  [[ ${1:-} == -- ]] && shift
  pid[$key]=$("$C" start "$name" "$node" --log "$tmp/$key.log" -- \
    env GLOO_SOCKET_IFNAME=eth0 DDP_SHM_DISABLE=1 \
    "$bin/ddprun" --nnodes="$nnodes" --nproc_per_node=1 --rdzv_backend="${rdzv_backend:-c10d}" \
    --rdzv_endpoint="${rdzv_endpoint:-${a[0]}:$port}" --rdzv_id="elastic-$$" --rdzv_conf="$conf" \
    --local_addr '{addr}' --no_python "${flags[@]}" "$tmp/worker.sh" "$rec" "$@")
}

# Whether node 0's store listens (from node 1).
store_listens() {
  "$C" exec "$name" 1 -- timeout 1 bash -c "exec 3<>/dev/tcp/${a[0]}/$port" 2>/dev/null
}

# retry T CMD...: runs CMD until it succeeds, for up to T (whole) seconds.
retry() {
  local t
  t=$(clamp "$1")
  shift
  local end=$((${EPOCHREALTIME//[!0-9]/} + t * 1000000))
  until "$@"; do
    ((${EPOCHREALTIME//[!0-9]/} < end)) || return 1
    sleep 0.1
  done
}

# Whether PID runs (a zombie counts as gone: PID 1 may never reap it).
alive() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  [[ ${s%% *} != Z && ${s%% *} != X ]]
}

# Whether every agent named (started as KEY) still runs.
running() {
  local k
  for k in "$@"; do alive "${pid[$k]}" || return 1; done
}

# await T "KEYS" CMD...: retry CMD for up to T s, giving up early when one of the
# agents KEYS has exited (it will not happen any more).
await() {
  local t keys=$2
  t=$(clamp "$1")
  shift 2
  local end=$((${EPOCHREALTIME//[!0-9]/} + t * 1000000))
  until "$@"; do
    # shellcheck disable=SC2086  # KEYS is a list
    running $keys || { "$@"; return; }
    ((${EPOCHREALTIME//[!0-9]/} < end)) || return 1
    sleep 0.1
  done
}

# states KEYS...: "KEY (node N) runs" or "KEY (node N) exited RC", comma-separated.
states() {
  local k out=()
  for k in "$@"; do
    if alive "${pid[$k]}"; then
      out+=("$k (node ${nodeof[$k]}) runs")
    else
      out+=("$k (node ${nodeof[$k]}) exited $(wait_agent "$k" "${nodeof[$k]}" 5)")
    fi
  done
  local line
  line=$(printf '%s, ' "${out[@]}")
  echo "${line%, }"
}

# Worker records matching a glob (in $rec).
records() { (cd "$rec" && { compgen -G "$1" || true; }); }
count() { records "$1" | grep -c . || true; }
at_least() { (($(count "$1") >= $2)); }

# wait_agent KEY NODE TIMEOUT: the exit code of the agent started as KEY.
wait_agent() {
  local rc=0
  "$C" wait "$name" "$2:${pid[$1]}" "$(clamp "$3")" >/dev/null 2>&1 || rc=$?
  echo "$rc"
}

# expect_exit KEY NODE CODE TIMEOUT
expect_exit() {
  local rc t
  t=$(clamp "$4")
  rc=$(wait_agent "$1" "$2" "$t")
  ((rc != 124)) || fail "ddprun $1 (node $2) still runs after $t s"
  ((rc == $3)) || fail "ddprun $1 (node $2) exited $rc, not $3"
}

# field FILE KEY: KEY's value in a worker record.
field() { sed -n "s/.*\\b$2=\\([^ ]*\\).*/\\1/p" "$1"; }

# ---- the demo (elastic_demo_test.sh, etcd_demo_test.sh) -------------------------------------

# setup_demo: the Fashion-MNIST demo as the tests run it, in demo=(...), checkpointing to
# $ckpt. 3072 samples: 32 steps of 32 per rank and epoch with 3 nodes, 48 with 2; 80 ms
# per step: about 2.5 s an epoch with 3 nodes, 4 s with 2. A checkpoint every 4 steps.
setup_demo() {
  ckpt=$tmp/ckpt.bin
  demo=("$bin/train_fashion_mnist" --train-limit 3072 --test-limit 300 --batch-size 32
    --epochs 2 --hidden 32 --checkpoint "$ckpt" --checkpoint-every 4 --log-every 1
    --throttle-ms 80)
}

# start_node KEY NODE: the demo on NODE, --nnodes 2:3. --node_rank: node i is group rank
# i, so node 0 runs rank 0 (the one that prints progress and writes the checkpoint) while
# it lives. --max_restarts=0 (the default): a membership change must not consume
# restarts; DDP_ELASTIC_MAX_RESTARTS overrides it (to look past a failure that spent one).
start_node() {
  start_agent "$1" "$2" 2:3 "$conf_fast,join_timeout=60" --node_rank="$2" \
    --max_restarts="${DDP_ELASTIC_MAX_RESTARTS:-0}" -- "${demo[@]}"
}

# trained_steps_at_3 S: the demo's rank 0 (node 0) printed a step of epoch 1 at or after S
# with 3 nodes ("epoch 1/2 step S ...; world 3: 32 steps an epoch)"; S is the global step,
# the step of epoch 1 in a run that started with 3 nodes).
trained_steps_at_3() {
  local s
  s=$(sed -n 's/^\[default0\]:epoch 1\/2 step \([0-9]*\) .*; world 3: 32 steps an epoch)$/\1/p' "$tmp/node0.log" | tail -n 1)
  [[ -n $s ]] && ((s >= $1))
}

# continued_from_checkpoint LOG S: at its first resume in LOG (rank 0's), the demo went on
# from the checkpoint, written with another world size, where it stood: its next step is
# the checkpoint's global step + 1, in a world with S steps an epoch (the sampler goes on
# from the samples of the epoch already trained, whatever the world size).
continued_from_checkpoint() {
  local g
  g=$(sed -n 's/^\[default0\]:resumed from checkpoint .* (global step \([0-9]*\))$/\1/p' "$1" | head -n 1)
  [[ -n $g ]] && grep -q "^\[default0\]:epoch [0-9]*/[0-9]* step $((g + 1)) .*: $2 steps an epoch)\$" "$1"
}

# check_one_group_per_round: no two groups at once. Every round has one WORLD_SIZE, at
# most that many workers, distinct ranks; no worker ran with WORLD_SIZE=1. Leaves each
# round's WORLD_SIZE in ws_of[round].
declare -A ws_of
check_one_group_per_round() {
  local f r w n dup
  while read -r f; do
    r=$(field "$rec/$f" round)
    w=$(field "$rec/$f" world_size)
    [[ $w != 1 ]] || fail "$f: a worker ran with WORLD_SIZE=1 (a group of its own)"
    [[ -z ${ws_of[$r]:-} || ${ws_of[$r]} == "$w" ]] || fail "round $r ran with WORLD_SIZE ${ws_of[$r]} and $w"
    ws_of[$r]=$w
  done < <(records 'n*')
  for r in "${!ws_of[@]}"; do
    n=$(count "n*_round${r}_*")
    ((n <= ws_of[$r])) || fail "round $r: $n workers for WORLD_SIZE=${ws_of[$r]}"
    dup=$(records "n*_round${r}_*" | sed 's/.*_r\([0-9]*\)_[0-9]*$/\1/' | sort | uniq -d)
    [[ -z $dup ]] || fail "round $r: rank $dup ran twice"
  done
}

# ---- etcd (etcd_demo_test.sh) ----------------------------------------------------------------

etcd_bin=${DDP_ETCD:-/usr/bin/etcd}
etcdctl_bin=${DDP_ETCDCTL:-/usr/bin/etcdctl}

# start_etcd_cluster: one etcd member per node, on the node's address (clients 2379, peers
# 2380), data in $tmp/etcd<i>, log $tmp/etcd<i>.log; pids in etcd_pid[i]. Sets
# etcd_endpoints ("a0:2379,a1:2379,..."). Returns once every member answers (30 s at most).
declare -A etcd_pid
start_etcd_cluster() {
  local i members=() initial token
  token=etcd-$name-$$
  for ((i = 0; i < ${#a[@]}; i++)); do members+=("n$i=http://${a[i]}:2380"); done
  initial=$(IFS=,; echo "${members[*]}")
  etcd_endpoints=
  for ((i = 0; i < ${#a[@]}; i++)); do
    etcd_endpoints+=${etcd_endpoints:+,}${a[i]}:2379
    etcd_pid[$i]=$("$C" start "$name" "$i" --log "$tmp/etcd$i.log" -- \
      "$etcd_bin" --name "n$i" --data-dir "$tmp/etcd$i" --log-level warn --logger zap \
      --listen-client-urls "http://${a[i]}:2379" --advertise-client-urls "http://${a[i]}:2379" \
      --listen-peer-urls "http://${a[i]}:2380" --initial-advertise-peer-urls "http://${a[i]}:2380" \
      --initial-cluster "$initial" --initial-cluster-state new --initial-cluster-token "$token")
  done
  retry 30 etcd_healthy "$etcd_endpoints"
}

# etcd_healthy ENDPOINTS: whether every member listed answers (from this machine, over the bridge).
etcd_healthy() {
  ETCDCTL_API=3 timeout 5 "$etcdctl_bin" --endpoints="$1" --dial-timeout=1s --command-timeout=2s \
    endpoint health >/dev/null 2>&1
}

# stop_etcd_cluster: SIGKILLs every member still running and waits for it (idempotent).
stop_etcd_cluster() {
  local i
  for i in "${!etcd_pid[@]}"; do
    if alive "${etcd_pid[$i]}"; then
      "$C" signal "$name" "$i:${etcd_pid[$i]}" KILL >/dev/null 2>&1 || true
      "$C" wait "$name" "$i:${etcd_pid[$i]}" 10 >/dev/null 2>&1 || true
    fi
  done
}

# etcd_leader ENDPOINTS: the endpoint of the member that leads (empty when none answers).
etcd_leader() {
  ETCDCTL_API=3 timeout 5 "$etcdctl_bin" --endpoints="$1" --dial-timeout=1s --command-timeout=2s \
    endpoint status 2>/dev/null | awk -F', ' '$5 == "true" { print $1 }' | head -n 1
}
