#!/usr/bin/env bash
# Tests scripts/cluster itself on a 3-node cluster: reachability between nodes,
# start/wait exit codes, placeholders, signals, cut/heal partitions, and that
# destroy and `with` (also when its command fails or it is sent SIGTERM) leave no
# namespace, link, process or state behind. Exits 77 when the machine cannot make
# network namespaces (not root, no ip netns).
set -euo pipefail

src=${DDP_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
C=$src/scripts/cluster
state_root=${DDP_CLUSTER_STATE:-/run/ddp-cluster}
name=harness-$$
tmp=$(mktemp -d)
cleanup() {
  "$C" destroy "$name" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "--- $*"; }

# Whether PID runs (a zombie counts as gone: PID 1 may not reap orphans).
alive() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  [[ ${s%% *} != Z && ${s%% *} != X ]]
}

gone() { ! alive "$1"; }

# Runs CMD... until it succeeds, for up to T seconds.
retry() {
  local end=$((SECONDS + $1))
  shift
  until "$@"; do
    ((SECONDS < end)) || return 1
    sleep 0.25
  done
}

# Fails unless nothing of cluster NAME with subnet index K is left and none of
# PIDS runs.
check_gone() {
  local what=$1 cname=$2 k=$3 p left
  shift 3
  [[ ! -e $state_root/$cname ]] || fail "$what: state dir $state_root/$cname remains"
  left=$(ip netns list | awk -v re="^dc${k}n[0-9]+\$" '$1 ~ re {print $1}')
  [[ -z $left ]] || fail "$what: namespaces remain: $left"
  left=$(ip -o link show | awk -F': ' -v re="^(dcb${k}|dc${k}v[0-9]+)(@.*)?\$" '$2 ~ re {print $2}')
  [[ -z $left ]] || fail "$what: links remain: $left"
  for p in "$@"; do
    ! alive "$p" || fail "$what: process $p remains: $(tr '\0' ' ' <"/proc/$p/cmdline")"
  done
}

step "create"
rc=0
"$C" create "$name" 3 >"$tmp/addrs" || rc=$?
((rc != 77)) || exit 77
((rc == 0)) || fail "create exited $rc"
mapfile -t addrs <"$tmp/addrs"
((${#addrs[@]} == 3)) || fail "create printed ${#addrs[@]} addresses, not 3: ${addrs[*]}"
[[ $(printf '%s\n' "${addrs[@]}" | sort -u | wc -l) == 3 ]] || fail "addresses not distinct: ${addrs[*]}"
for i in 0 1 2; do
  a=$("$C" addr "$name" "$i")
  [[ $a == "${addrs[$i]}" ]] || fail "addr $i is '$a', create printed '${addrs[$i]}'"
  ns=$("$C" ns "$name" "$i")
  got=$(ip -n "$ns" -4 -o addr show dev eth0 | awk '{print $4}')
  [[ $got == "$a/24" ]] || fail "node $i's eth0 has '$got', not $a/24"
  [[ -z $(ip -n "$ns" route show default) ]] || fail "node $i has a default route"
done
k=$(<"$state_root/$name/subnet")
[[ $("$C" size "$name") == 3 ]] || fail "size is not 3"
list=$("$C" list)
[[ $'\n'$list == *$'\n'"$name 3 "* ]] || fail "list does not show $name: $list"

step "nodes reach each other"
for i in 0 1 2; do
  for j in 0 1 2; do
    ((i == j)) && continue
    retry 10 "$C" ping "$name" "$i" "${addrs[$j]}" 3 || fail "node $i does not reach node $j (${addrs[$j]})"
  done
done
# The probe can fail: an address nobody has.
unused=${addrs[0]%.*}.250
! "$C" ping "$name" 0 "$unused" 2 || fail "node 0 reaches $unused, which nobody has"

step "start + wait: exit codes, placeholders, the node's namespace"
# shellcheck disable=SC2016  # expanded in the node
pid=$("$C" start "$name" 1 --log "$tmp/n1.log" -- sh -c \
  'echo "node={node} addr={addr} n={n} env=$DDP_CLUSTER_NODE/$DDP_CLUSTER_ADDR"; ip -4 -o addr show dev eth0; exit 7')
[[ $pid =~ ^[0-9]+$ ]] || fail "start printed '$pid', not a pid"
rc=0
out=$("$C" wait "$name" 1 60) || rc=$?
((rc == 7)) || fail "wait exited $rc, not 7 (log: $(cat "$tmp/n1.log"))"
[[ $out == 7 ]] || fail "wait printed '$out', not 7"
grep -q "^node=1 addr=${addrs[1]} n=3 env=1/${addrs[1]}\$" "$tmp/n1.log" ||
  fail "placeholders/environment wrong: $(cat "$tmp/n1.log")"
grep -q " ${addrs[1]}/24 " "$tmp/n1.log" || fail "the command did not run in node 1: $(cat "$tmp/n1.log")"
"$C" start "$name" 2 -- true >/dev/null
out=$("$C" wait "$name" 2 60) || fail "wait for 'true' exited $?"
[[ $out == 0 ]] || fail "wait printed '$out' for 'true'"

step "signal: STOP, CONT, KILL"
pid=$("$C" start "$name" 0 -- sleep 1000)
rc=0
"$C" wait "$name" 0 1 >/dev/null 2>&1 || rc=$?
((rc == 124)) || fail "wait on a running sleep exited $rc, not 124 (timeout)"
"$C" signal "$name" 0 STOP
retry 10 grep -q '^State:.*T' "/proc/$pid/status" || fail "sleep $pid is not stopped after STOP"
"$C" signal "$name" 0 CONT
retry 10 grep -q '^State:.*S' "/proc/$pid/status" || fail "sleep $pid is not running after CONT"
"$C" signal "$name" 0 KILL
rc=0
out=$("$C" wait "$name" 0 60) || rc=$?
((rc == 137)) || fail "wait after KILL exited $rc, not 137"
[[ $out == 137 ]] || fail "wait after KILL exited $rc, printed '$out', not 137"
retry 10 gone "$pid" || fail "sleep $pid still runs after KILL"
# --node reaches every process of the node, also ones outside the group.
p1=$("$C" start "$name" 0 -- sleep 1001)
p2=$("$C" start "$name" 0 -- sleep 1002)
"$C" signal "$name" 0 KILL --node
out=$("$C" wait "$name" "0:$p1" 60) || true
[[ $out == 137 ]] || fail "wait 0:$p1 after KILL --node printed '$out', not 137"
out=$("$C" wait "$name" 0 60) || true
[[ $out == 137 ]] || fail "wait 0 ($p2) after KILL --node printed '$out', not 137"

step "cut and heal"
"$C" cut "$name" 2
! "$C" ping "$name" 0 2 2 || fail "node 0 reaches node 2 after cut"
! "$C" ping "$name" 2 0 2 || fail "node 2 reaches node 0 after cut"
retry 10 "$C" ping "$name" 0 1 3 || fail "node 0 does not reach node 1 while node 2 is cut"
"$C" heal "$name" 2
retry 20 "$C" ping "$name" 0 2 3 || fail "node 0 does not reach node 2 after heal"
retry 20 "$C" ping "$name" 2 0 3 || fail "node 2 does not reach node 0 after heal"

step "destroy"
# One process leaves its group: destroy must find it in the namespace.
p1=$("$C" start "$name" 1 -- sh -c 'setsid sleep 1003 & sleep 1004')
p2=$("$C" start "$name" 2 -- sleep 1005)
"$C" signal "$name" 2 STOP
sleep 0.3
mapfile -t pids < <(for i in 0 1 2; do ip netns pids "$("$C" ns "$name" "$i")"; done)
((${#pids[@]} >= 5)) || fail "expected at least 5 processes in the nodes, found ${#pids[*]}"
"$C" destroy "$name" || fail "destroy exited $?"
check_gone destroy "$name" "$k" "${pids[@]}" "$p1" "$p2"
"$C" destroy "$name" || fail "a second destroy exited $?"

# `with` runs a script that records what it made in $tmp/<tag>.*.
# shellcheck disable=SC2016  # expanded by the command
with_cmd='
set -e
exec >"$1.out" 2>&1
echo "$DDP_CLUSTER" >"$1.name"
cat "${DDP_CLUSTER_STATE:-/run/ddp-cluster}/$DDP_CLUSTER/subnet" >"$1.k"
[[ $DDP_CLUSTER_N == 2 ]] || exit 90
"$DDP_CLUSTER_SCRIPT" ping "$DDP_CLUSTER" 0 1 5 || exit 91
"$DDP_CLUSTER_SCRIPT" start "$DDP_CLUSTER" 1 -- sleep 1006 >"$1.pids"
sleep 1007 >/dev/null 2>&1 & echo $! >>"$1.pids"
echo $$ >>"$1.pids"
echo ready >"$1.ready"
case $2 in
  ok) exit 0 ;;
  fail) exit 3 ;;
  hang) trap "echo TERM >$1.term; exit 0" TERM; wait ;;
esac
'
with_check() {
  local tag=$1
  [[ -f $tmp/$tag.name && -f $tmp/$tag.k && -f $tmp/$tag.pids ]] || fail "with ($tag): the command did not record its cluster"
  local pids
  mapfile -t pids <"$tmp/$tag.pids"
  check_gone "with ($tag)" "$(<"$tmp/$tag.name")" "$(<"$tmp/$tag.k")" "${pids[@]}"
}

step "with: command succeeds"
rc=0
"$C" with 2 -- bash -c "$with_cmd" _ "$tmp/ok" ok || rc=$?
((rc == 0)) || fail "with exited $rc, not 0"
with_check ok

step "with: command fails"
rc=0
"$C" with 2 -- bash -c "$with_cmd" _ "$tmp/fail" fail || rc=$?
((rc == 3)) || fail "with exited $rc, not the command's 3"
with_check fail

step "with: SIGTERM"
"$C" with 2 -- bash -c "$with_cmd" _ "$tmp/term" hang &
wpid=$!
retry 60 test -f "$tmp/term.ready" || fail "with's command did not start within 60 s"
kill -TERM "$wpid"
rc=0
wait "$wpid" || rc=$?
((rc == 143)) || fail "with exited $rc after SIGTERM, not 143"
[[ -f $tmp/term.term ]] || fail "with did not pass SIGTERM on to its command"
with_check term

echo "PASS"
