#!/usr/bin/env bash
# A real SLURM cluster on this machine runs scripts/slurm/ddprun.sbatch with
# `sbatch --wait`: munged, slurmctld and slurmd (Debian's munge and slurm-wlm)
# start here with a generated munge key and slurm.conf in a temporary
# directory, on free ports, and are stopped at the end, whatever happens.
#
# The cluster has two nodes when this host has a second name for loopback
# (two slurmd on one machine, each under a name of this host); else one. One
# job runs the example file unchanged, with the build's ddprun (DDPRUN) and
# two workers per node; each worker writes its environment and then trains
# the reduced Fashion-MNIST demo, which must print its final accuracy. RANK,
# WORLD_SIZE, GROUP_RANK, TORCHELASTIC_RUN_ID (= the job id), MASTER_ADDR and
# the store port (20000 + job id mod 10000) are checked against the job.
# Afterwards no process of the jobs (slurmstepd, ddprun, workers) may be left.
#
# Exits 77 (skipped, reason printed) when a tool is missing, the test does not
# run as root, the dataset is missing, or a daemon cannot start.
set -uo pipefail

src=${DDP_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${DDP_BUILD_BIN:-$src/build/bin}
sbatch_file=$src/scripts/slurm/ddprun.sbatch
dataset=/usr/share/datasets/fashion-mnist

skip() {
  echo "SKIP: $*"
  exit 77
}

PATH=$PATH:/usr/sbin
for tool in munged slurmctld slurmd sbatch sinfo scontrol srun scancel python3; do
  command -v "$tool" >/dev/null 2>&1 || skip "$tool is not installed (Debian: apt-get install slurm-wlm munge)"
done
[[ $(id -u) == 0 ]] || skip "slurmd must run as root to start jobs (this test runs as uid $(id -u))"
[[ -f $dataset/train-images-idx3-ubyte.gz ]] || skip "the Fashion-MNIST dataset is missing ($dataset)"
for b in ddprun ddprun_test_worker train_fashion_mnist; do
  [[ -x $bin/$b ]] || { echo "FAIL: $bin/$b is missing (build it; DDP_BUILD_BIN names the folder)"; exit 1; }
done
[[ -f $sbatch_file ]] || { echo "FAIL: $sbatch_file is missing"; exit 1; }

# munged wants every directory above its socket searchable by all.
tmp=$(mktemp -d /tmp/ddp-slurm-XXXXXX)
chmod 755 "$tmp"
conf=$tmp/slurm.conf
pids=()
ctld_pid=

# Processes started for this cluster: every daemon and everything they start
# carries SLURM_CONF=$conf in its environment (the jobs too: sbatch exports it).
cluster_processes() {
  local p state
  for p in /proc/[0-9]*; do
    [[ ${p#/proc/} == "$$" || ${p#/proc/} == "$BASHPID" ]] && continue
    state=$(awk '{print $3}' "$p/stat" 2>/dev/null) || continue
    [[ -z $state || $state == Z || $state == X ]] && continue
    tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -qxF "SLURM_CONF=$conf" || continue
    echo "${p#/proc/} $(tr '\0' ' ' 2>/dev/null <"$p/cmdline" | cut -c1-120)"
  done
}

stop_all() {
  local p deadline
  # Jobs first (their slurmstepd outlive slurmd), then the daemons.
  if [[ -n $ctld_pid ]] && kill -0 "$ctld_pid" 2>/dev/null; then
    SLURM_CONF=$conf timeout 10 scancel --full --quiet --user=root >/dev/null 2>&1 || true
  fi
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  deadline=$((SECONDS + 15))
  for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null && [[ $(awk '{print $3}' /proc/$p/stat 2>/dev/null) != Z ]] &&
      ((SECONDS < deadline)); do
      sleep 0.1
    done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
}

cleanup() {
  local code=$? left
  stop_all
  # Anything of the cluster still alive (a slurmstepd, a ddprun, a worker)?
  local deadline=$((SECONDS + 10))
  while left=$(cluster_processes) && [[ -n $left ]] && ((SECONDS < deadline)); do sleep 0.2; done
  if [[ -n $left ]]; then
    echo "FAIL: processes of the cluster are left after it stopped:"
    echo "$left"
    for p in $(echo "$left" | awk '{print $1}'); do kill -KILL "$p" 2>/dev/null; done
    ((code == 0 || code == 77)) && code=1
  fi
  rm -rf "$tmp"
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
  echo "FAIL: $*"
  for f in "$tmp"/log/*.log "$tmp"/log/*.out "$tmp"/sbatch.out "$tmp"/job-*.out; do
    [[ -f $f ]] && { echo "--- $f"; tail -n 40 "$f"; }
  done
  exit 1
}

daemon_failed() {
  echo "--- $2"
  tail -n 20 "$2" 2>/dev/null
  skip "$1 could not start here (its log is above)"
}

mkdir -p "$tmp/munge" "$tmp/run" "$tmp/log" "$tmp/state" "$tmp/spool" "$tmp/env"
chmod 700 "$tmp/munge"
chmod 755 "$tmp/run"

# ---- munge: its own key, socket, pid, log and seed files.
if command -v mungekey >/dev/null 2>&1; then
  mungekey --create --keyfile="$tmp/munge/munge.key" >/dev/null 2>&1
else
  dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
fi
chmod 400 "$tmp/munge/munge.key"
munged --foreground --socket="$tmp/run/munge.sock" --key-file="$tmp/munge/munge.key" \
  --pid-file="$tmp/run/munged.pid" --log-file="$tmp/log/munged.log" \
  --seed-file="$tmp/munge/seed" >"$tmp/log/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -S $tmp/run/munge.sock ]] && break; sleep 0.05; done
[[ -S $tmp/run/munge.sock ]] || daemon_failed munged "$tmp/log/munged.out"

# ---- nodes: the host name, and another name of this machine that resolves to
# loopback if there is one (ddprun resolves the first host of the job); SLURM
# itself reaches every node at 127.0.0.1. ("localhost" cannot be one: SLURM
# reads it as the host name.)
host=$(hostname -s)
loopback_name() { getent ahosts "$1" 2>/dev/null | awk '{print $1}' | grep -qE '^(127\.|::1$)'; }
nodes=()
getent ahosts "$host" >/dev/null 2>&1 && nodes+=("$host")
for name in $(awk '$1 ~ /^127\./ { for (i = 2; i <= NF; i++) print $i }' /etc/hosts 2>/dev/null); do
  ((${#nodes[@]} < 2)) || break
  [[ $name == localhost* || $name == "$host" || $name == *.* ]] && continue
  loopback_name "$name" && nodes+=("$name")
done
((${#nodes[@]} > 0)) || skip "the host name '$host' does not resolve"
nnodes=${#nodes[@]}

# Free TCP ports: slurmctld's, and one slurmd port per node; then the first
# job id, random, such that ddprun's store port (20000 + id mod 10000) is free.
read -r -a ports <<<"$(python3 - "$((nnodes + 1))" <<'EOF'
import random, socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
ports = [s.getsockname()[1] for s in socks]
for _ in range(100):
    job = random.randrange(10000, 1000000)
    port = 20000 + job % 10000
    if port in ports:
        continue
    try:
        socket.socket().bind(("0.0.0.0", port))
    except OSError:
        continue
    print(" ".join(map(str, ports + [job])))
    break
EOF
)"
((${#ports[@]} == nnodes + 2)) || fail "could not pick free ports"
first_job=${ports[-1]}

cpus=$(nproc)
{
  echo "ClusterName=ddptest"
  echo "FirstJobId=$first_job"
  echo "SlurmctldHost=$host(127.0.0.1)"
  echo "SlurmctldPort=${ports[0]}"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/munge"
  echo "CredType=cred/munge"
  echo "AuthInfo=socket=$tmp/run/munge.sock"
  echo "StateSaveLocation=$tmp/state"
  echo "SlurmdSpoolDir=$tmp/spool/%n"
  echo "SlurmctldPidFile=$tmp/run/slurmctld.pid"
  echo "SlurmdPidFile=$tmp/run/slurmd-%n.pid"
  echo "SlurmctldLogFile=$tmp/log/slurmctld.log"
  echo "SlurmdLogFile=$tmp/log/slurmd-%n.log"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobCompType=jobcomp/none"
  echo "SchedulerType=sched/builtin"
  # Schedule a batch job at once (the default delays it by up to 3 s).
  echo "SchedulerParameters=batch_sched_delay=0"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_CPU"
  echo "MpiDefault=none"
  echo "MailProg=/bin/true"
  echo "ReturnToService=2"
  echo "KillWait=5"
  echo "InactiveLimit=0"
  for i in "${!nodes[@]}"; do
    echo "NodeName=${nodes[$i]} NodeAddr=127.0.0.1 Port=${ports[$((i + 1))]} CPUs=$cpus State=UNKNOWN"
  done
  echo "PartitionName=test Nodes=$(IFS=,; echo "${nodes[*]}") Default=YES MaxTime=10 State=UP"
} >"$conf"
for n in "${nodes[@]}"; do mkdir -p "$tmp/spool/$n"; done

# ---- slurmctld and one slurmd per node, in the foreground (their pids are ours).
SLURM_CONF=$conf slurmctld -D -f "$conf" >"$tmp/log/slurmctld.out" 2>&1 &
ctld_pid=$!
pids+=($!)
for _ in $(seq 100); do
  SLURM_CONF=$conf timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' && break
  kill -0 "${pids[-1]}" 2>/dev/null || break
  sleep 0.1
done
SLURM_CONF=$conf timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' ||
  daemon_failed slurmctld "$tmp/log/slurmctld.log"
for n in "${nodes[@]}"; do
  SLURM_CONF=$conf slurmd -D -N "$n" -f "$conf" >"$tmp/log/slurmd-$n.out" 2>&1 &
  pids+=($!)
done
# Every node idle, within 20 s.
idle=0
for _ in $(seq 200); do
  idle=$(SLURM_CONF=$conf timeout 5 sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle"' | wc -l)
  ((idle == nnodes)) && break
  sleep 0.1
done
if ((idle != nnodes)); then
  SLURM_CONF=$conf timeout 5 sinfo -N -l 2>&1
  daemon_failed slurmd "$tmp/log/slurmd-${nodes[0]}.log"
fi
echo "SLURM cluster up: $nnodes node(s) (${nodes[*]}), slurmctld on port ${ports[0]}"

# ---- the example job: sbatch --wait on the unchanged file. Options given to
# sbatch override its #SBATCH lines (--ntasks-per-node=2: two workers per node,
# which ddprun reads from SLURM_NTASKS_PER_NODE); DDPRUN picks the build's
# ddprun. Each worker writes its environment, then becomes the reduced demo.
started=$SECONDS
# (In the background, so that a signal reaches the trap at once.)
SLURM_CONF=$conf DDPRUN=$bin/ddprun timeout 90 sbatch --wait --parsable --nodes="$nnodes" \
  --ntasks-per-node=2 --job-name=ddprun-demo --time=2 --chdir="$tmp" --output="$tmp/job-%j.out" \
  "$sbatch_file" --no_python /bin/sh -c 'env >"$0/env_$RANK"; exec "$@"' "$tmp/env" \
  "$bin/train_fashion_mnist" --epochs 1 --train-limit 2048 --test-limit 1000 --hidden 32 \
  >"$tmp/sbatch.out" 2>&1 &
wait $!
rc=$?
job=$(head -n 1 "$tmp/sbatch.out")
job=${job%%;*}
echo "job $job exited $rc after $((SECONDS - started)) s"
((rc == 0)) || fail "sbatch --wait exited $rc"
out=$tmp/job-$job.out
[[ -f $out ]] || fail "no output file $out"
grep -q "ddprun.sbatch: job $job on $nnodes node(s)" "$out" || fail "the job's header is missing from $out"
grep -q "final test accuracy" "$out" || fail "the demo printed no final test accuracy"
grep -q "($((2 * nnodes)) ranks x" "$out" || fail "the demo did not train on $((2 * nnodes)) ranks"
cat "$out"

# The workers' environment as ddprun derived it from the job: ranks, sizes,
# the run id (the job id), node 0's address (the first host of the step's
# node list, as scontrol expands it) and the store port (20000 + id mod 10000).
SLURM_CONF=$conf python3 - "$tmp/env" "$job" "$nnodes" <<'EOF' || fail "the workers' environment does not match the job"
import os, subprocess, sys
folder, job, nnodes = sys.argv[1], sys.argv[2], int(sys.argv[3])
envs = {}
for name in os.listdir(folder):
    env = {}
    for line in open(os.path.join(folder, name), errors="replace"):
        key, sep, value = line.rstrip("\n").partition("=")
        if sep and key.isidentifier():
            env[key] = value
    envs[int(env["RANK"])] = env
world = 2 * nnodes
ok = sorted(envs) == list(range(world))
print(f"{len(envs)} workers, expected {world}")
first = subprocess.run(["scontrol", "show", "hostnames", envs[0]["SLURM_STEP_NODELIST"]],
                       capture_output=True, text=True).stdout.split()[0]
node0 = "127.0.0.1" if first in ("localhost", "127.0.0.1", "::1") else first
print("rank 0's SLURM environment: " + " ".join(
    f"{k}={v}" for k, v in sorted(envs[0].items()) if k.startswith("SLURM")))
for rank, env in sorted(envs.items()):
    print(f"rank {rank}: " + " ".join(f"{k}={env.get(k)}" for k in (
        "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "MASTER_ADDR",
        "DDP_STORE_ADDR", "DDP_STORE_PORT", "SLURM_NODEID", "SLURMD_NODENAME")))
    expected = {
        "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": str(nnodes),
        "LOCAL_RANK": str(rank % 2), "GROUP_RANK": str(rank // 2),
        "SLURM_NODEID": str(rank // 2), "TORCHELASTIC_RUN_ID": job,
        "MASTER_ADDR": node0, "DDP_STORE_ADDR": node0 if rank < 2 else first,
        "DDP_STORE_PORT": str(20000 + int(job) % 10000),
    }
    for key, value in expected.items():
        if env.get(key) != value:
            print(f"  rank {rank}: {key}={env.get(key)!r}, expected {value!r}")
            ok = False
sys.exit(0 if ok else 1)
EOF

# Nothing of the jobs may outlive them: slurmstepd, ddprun and the workers
# leave with the job (checked again after the daemons stop).
deadline=$((SECONDS + 10))
while left=$(cluster_processes | grep -E 'slurmstepd|ddprun|train_fashion_mnist|ddprun_test_worker') &&
  [[ -n $left ]] && ((SECONDS < deadline)); do
  sleep 0.2
done
[[ -z $left ]] || fail "processes of the jobs are left after they ended: $left"
echo "PASS"
