#include "options.h"

#include <algorithm>
#include <cctype>

#include "ddp/agent/worker_spec.h"
#include "ddp/rendezvous/rendezvous_factory.h"
#include "rdzv_conf.h"
#include "values.h"

namespace ddp::launcher {

const char* const kVersion = "ddprun 0.1.0 (torchrun-compatible launcher)";

const char* const kUsage =
    "usage: ddprun [options] program [args...]\n\n"
    "Torch Distributed Elastic Training Launcher, in C++ (torchrun-compatible).\n\n"
    "Runs `program` on this node as --nproc_per_node worker processes with the environment\n"
    "torchrun gives (LOCAL_RANK, RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), restarts\n"
    "the whole job up to --max_restarts times when a worker fails, and reports failures in\n"
    "torchrun's format. A program ending in .py (or -m module) runs as `python3 -u` (the\n"
    "python3 first on PATH, or $PYTHON_EXEC); an executable file is executed directly (a bare\n"
    "name: the file in the current directory, else on PATH); another file runs on Python.\n"
    "Every --under_score option also has a --dash-spelling and falls back to the environment\n"
    "variable PET_<NAME> (e.g. PET_NPROC_PER_NODE).\n\n"
    "In a SLURM job (SLURM_JOB_ID set), without --standalone and --rdzv_endpoint, options that\n"
    "are neither given nor in PET_<NAME> come from the job: --nnodes from SLURM_NNODES,\n"
    "--node_rank from SLURM_NODEID, --rdzv_id from SLURM_JOB_ID, --master_addr from the first\n"
    "host of SLURM_STEP_NODELIST (srun's; else SLURM_JOB_NODELIST), --master_port =\n"
    "20000 + SLURM_JOB_ID mod 10000 (with --rdzv_backend=c10d the endpoint is that address\n"
    "and port), --nproc_per_node from SLURM_GPUS_ON_NODE or else SLURM_NTASKS_PER_NODE.\n"
    "Start one ddprun per node: srun --ntasks=$SLURM_JOB_NUM_NODES ddprun ...\n";

const char* const kFooter =
    "positional arguments:\n"
    "  program                     The program (a .py script, a module with -m, or any "
    "executable\n"
    "                              with --no_python) followed by its arguments; ${local_rank} "
    "in an\n"
    "                              argument becomes each worker's local rank.\n"
    "  args...                     Arguments of the program.\n\n"
    "examples:\n"
    "  ddprun --standalone --nproc_per_node=4 train.py --epochs 3\n"
    "  ddprun --nnodes=2 --node_rank=0 --master_addr=10.0.0.1 --nproc_per_node=8 train.py\n"
    "  ddprun --nnodes=1:4 --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29400 "
    "--rdzv_id=job42 train.py\n"
    "  ddprun --standalone --nproc_per_node=2 --no_python ./my_binary --rank-file "
    "'out_${local_rank}.txt'\n"
    "  (quote ${local_rank} in single quotes, or the shell replaces it before ddprun sees it)";

const std::vector<OptionRow>& option_table() {
  using R = RawOptions;
  const RendezvousConfig rendezvous;
  const RendezvousParams& params = rendezvous.params;
  const agent::AgentOptions agent;
  const std::string no_stream = std::to_string(static_cast<unsigned>(agent.spec.redirects.all));
  static const std::vector<OptionRow> table = {
      {.name = "nnodes",
       .text = &R::nnodes,
       .default_value = std::to_string(params.min_nodes) + ":" + std::to_string(params.max_nodes),
       .help = "Number of nodes, or the range of nodes in form <minimum_nodes>:<maximum_nodes>."},
      {.name = "nproc_per_node",
       .text = &R::nproc_per_node,
       .default_value = std::to_string(agent.spec.local_world_size),
       .help = "Number of workers per node; supported values: [auto, cpu, gpu, int]."},
      {.name = "standalone",
       .flag = &R::standalone,
       .help = "Start a local standalone rendezvous backend (an embedded store on a free port); "
               "useful for single-node, multi-worker jobs. Sets --rdzv_backend and "
               "--rdzv_endpoint, and --rdzv_id to a random id unless it is given (torchrun "
               "ignores a given one)."},
      {.name = "rdzv_backend",
       .text = &R::rdzv_backend,
       .default_value = rendezvous.backend,
       .help = "Rendezvous backend: static (default; fixed nodes, given ranks), c10d (elastic: "
               "--nnodes MIN:MAX) or etcd (elastic, on an etcd v3 cluster: --rdzv_endpoint "
               "lists its client endpoints)."},
      {.name = "rdzv_endpoint",
       .text = &R::rdzv_endpoint,
       .help = "Rendezvous backend endpoint; usually in form <host>:<port> (c10d default port "
               "29400); for etcd <host>[:<port>][,<host>[:<port>]...] (default port 2379)."},
      {.name = "rdzv_id",
       .text = &R::rdzv_id,
       .default_value = params.run_id,
       .help = "User-defined group id (the job's run id)."},
      {.name = "rdzv_conf",
       .text = &R::rdzv_conf,
       .help = "Additional rendezvous configuration (<key1>=<value1>,<key2>=<value2>,...): " +
               rdzv_conf_help_keys() + "."},
      {.name = "node_rank",
       .text = &R::node_rank,
       .default_value = std::to_string(params.node_rank),
       .help = "Rank of the node for multi-node distributed training (static backend; orders the "
               "group ranks with c10d when given)."},
      {.name = "master_addr",
       .text = &R::master_addr,
       .default_value = rendezvous.host,
       .help = "Address of the master node (rank 0) for the static backend: the agents' store "
               "lives there."},
      {.name = "master_port",
       .text = &R::master_port,
       .default_value = std::to_string(rendezvous.port),
       .help = "Port on the master node for the static backend's store."},
      {.name = "local_addr",
       .text = &R::local_addr,
       .help = "Address of the local node, as other nodes reach it. Default: this host's name."},
      {.name = "logs_specs",
       .text = &R::logs_specs,
       .help = "torchrun's LogsSpecs plug-in (a Python entry point): refused, ddprun loads no "
               "Python; its logs are set by --log_dir, -r, -t, --local_ranks_filter and "
               "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE."},
      {.name = "numa_binding",
       .text = &R::numa_binding,
       .help = "Bind each worker to CPUs near its GPU (local rank r: GPU r), or with no GPU "
               "spread the local ranks over the NUMA nodes: node, socket, exclusive or "
               "core-complex (torch's modes, read from sysfs). Default: no binding."},
      {.name = "max_restarts",
       .text = &R::max_restarts,
       .default_value = std::to_string(agent.spec.max_restarts),
       .help = "Maximum number of worker group restarts before failing, for the whole job: "
               "counted once per restart across every node, and read by a node that joins "
               "late."},
      {.name = "max_no_progress_restarts",
       .text = &R::max_no_progress_restarts,
       .default_value = std::to_string(agent.spec.max_no_progress_restarts),
       .help = "Stop the job, with exit code 93, after this many restarts in a row after rounds "
               "in which no rank completed a step (seen on the progress pages of ddp::worker "
               "programs and of PyTorch scripts on the backend \"ddp\"); 0: never."},
      {.name = "monitor_interval",
       .text = &R::monitor_interval,
       .default_value = "0.1",
       .help = "Accepted for torchrun compatibility (torch 2.x's default, 0.1; 1.13's was 5); "
               "ddprun notices worker exits at once (no polling)."},
      {.name = "start_method",
       .text = &R::start_method,
       .default_value = "spawn",
       .help = "Accepted for torchrun compatibility (spawn, fork, forkserver); workers are always "
               "exec'd."},
      {.name = "event_log_handler",
       .text = &R::event_log_handler,
       .default_value = "null",
       .help = "torchrun's event handler: null and dynamic_rendezvous record nothing, as "
               "torchrun's do; console is accepted with a note (ddprun prints its agent's "
               "events on stderr, and serves them with --status_port)."},
      {.name = "role",
       .text = &R::role,
       .default_value = agent.spec.role,
       .help = "User-defined role for the workers (ROLE_NAME)."},
      {.name = "no_python",
       .flag = &R::no_python,
       .help = "Execute the program directly instead of through python3."},
      {.name = "module",
       .short_name = "m",
       .flag = &R::module,
       .help = "Change each process to interpret the launch script as a Python module "
               "(python3 -u -m program)."},
      {.name = "run_path",
       .flag = &R::run_path,
       .help = "Accepted for torchrun compatibility (the program runs as a script either way)."},
      {.name = "log_dir",
       .text = &R::log_dir,
       .help = "Base directory for log files: every run gets a fresh "
               "<log_dir>/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout,stderr}.log and "
               "error.json (printed at start). Default: a temporary directory."},
      {.name = "redirects",
       .short_name = "r",
       .text = &R::redirects,
       .default_value = no_stream,
       .help = "Redirect std streams into a log file in the log directory (0 none, 1 stdout, 2 "
               "stderr, 3 both; or per local rank, e.g. 0:1,1:2)."},
      {.name = "tee",
       .short_name = "t",
       .text = &R::tee,
       .default_value = no_stream,
       .help = "Tee std streams into a log file and also to the console (same values as -r)."},
      {.name = "local_ranks_filter",
       .text = &R::local_ranks_filter,
       .help = "Only show logs from these local ranks on the console (e.g. 0,1,2)."},
      {.name = "duplicate_stdout_filters",
       .text = &R::duplicate_stdout_filters,
       .help = "Copy the stdout lines of tee'd ranks (-t) that contain any of these "
               "comma-separated strings (',,' is a comma) into "
               "attempt_<n>/filtered_stdout.log, prefixed as on the console."},
      {.name = "duplicate_stderr_filters",
       .text = &R::duplicate_stderr_filters,
       .help = "The same for stderr, into attempt_<n>/filtered_stderr.log."},
      {.name = "signals_to_handle",
       .text = &R::signals_to_handle,
       .default_value = "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
       .help = "Signals forwarded to the workers (SIGINT, SIGTERM, SIGHUP, SIGQUIT always; "
               "SIGUSR1/SIGUSR2 when named)."},
      {.name = "exit_barrier_timeout",
       .text = &R::exit_barrier_timeout,
       .default_value = seconds_text(agent.exit_barrier_timeout),
       .help = "Seconds an agent whose workers succeeded waits for the other agents (the "
               "agent that serves their store stays while they still run)."},
      {.name = "stop_grace",
       .text = &R::stop_grace,
       .default_value = seconds_text(agent.stop_grace),
       .help = "Seconds between SIGTERM and SIGKILL when stopping workers."},
      {.name = "shutdown_timeout",
       .text = &R::shutdown_timeout,
       .help = "torch 2.x's name for --stop_grace (give one of the two); without either, "
               "TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30."},
      {.name = "virtual_local_rank",
       .flag = &R::virtual_local_rank,
       .help = "Every worker gets LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES naming only its own "
               "GPU (local rank r: the r-th of CUDA_VISIBLE_DEVICES, else GPU r)."},
      {.name = "hang_timeout",
       .text = &R::hang_timeout,
       .default_value = "auto",
       .help = "Seconds a job may be alive without progress before it is a hang: no rank "
               "completes a collective, some ranks wait in one others never reach, or a rank "
               "still runs after every other exited 0. auto: 15 min until 3 steps, then 10x "
               "the slowest step seen, at least 5 min; a rank that never exits is then only "
               "reported (it may still be working). 0: off."},
      {.name = "on_hang",
       .text = &R::on_hang,
       .default_value = "restart",
       .help = "What a hang does once the culprit's stacks are taken: restart (spends a "
               "restart) or fail (ends the job)."},
      {.name = "health_check",
       .text = &R::health_check,
       .help = "A command (/bin/sh -c) each node runs before every join; a node whose check "
               "fails does not join, says why, and retries (1 s doubling to 30 s) until the "
               "join timeout. Default: none."},
      {.name = "health_check_timeout",
       .text = &R::health_check_timeout,
       .default_value = seconds_text(agent.health_check.timeout),
       .help = "Seconds a --health_check may run before its process group is killed (a "
               "failure)."},
      {.name = "status_port",
       .text = &R::status_port,
       .help = "Serve this node's live view over HTTP on this port: /metrics (Prometheus), "
               "/livez, /readyz, /status (JSON) and / (a page). 0 picks a free port (logged). "
               "Default: off."},
      {.name = "status_host",
       .text = &R::status_host,
       .default_value = agent.status.host,
       .help = "Address the live view listens on. Beyond loopback, requests must carry the "
               "store's token (Authorization: Bearer); without a token (DDP_STORE_TOKEN) an "
               "address beyond loopback is refused unless --status_allow_no_token is given."},
      {.name = "status_allow_no_token",
       .flag = &R::status_allow_no_token,
       .help = "Serve the live view beyond loopback (--status_host) without a token: anyone who "
               "can reach the port reads the job's hosts, addresses, pids and incidents "
               "(logged as a warning)."},
  };
  return table;
}

RawOptions default_options() {
  RawOptions raw;
  for (const auto& row : option_table()) {
    if (row.text != nullptr) raw.*row.text = row.default_value;
  }
  return raw;
}

std::string option_names(const OptionRow& row) {
  std::string dashed = row.name;
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  std::string names = row.short_name.empty() ? "" : "-" + row.short_name + ",";
  return names + "--" + row.name + (dashed == row.name ? "" : ",--" + dashed);
}

std::string option_env_name(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return "PET_" + upper;
}

}  // namespace ddp::launcher
