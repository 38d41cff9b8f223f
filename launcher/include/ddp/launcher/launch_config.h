// Everything ddprun's command line says, parsed and validated once
// (parse_command_line) and then read-only. It is made of the structs it feeds,
// the rendezvous factory's config and the agent's options, with their own
// defaults; ddprun passes them on, adding only what it learns when it runs.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/agent/worker_spec.h"
#include "ddp/launcher/host_facts.h"
#include "ddp/rendezvous/rendezvous_factory.h"

namespace ddp::launcher {

struct LaunchConfig {
  // What the rendezvous factory is given, all but the store's token (ddprun
  // reads DDP_STORE_TOKEN when it runs): --rdzv_backend; the agents' store
  // (host, port: --rdzv_endpoint host[:port], or for static without it
  // --master_addr:--master_port; port 0 for --standalone picks a free one;
  // for etcd the first endpoint, etcd.endpoints all of them with their
  // ports); whether this node hosts it (static: node rank 0; c10d: decided
  // by the factory unless --rdzv_conf is_host says); the etcd keys of
  // --rdzv_conf (protocol, cacert, cert, key, username, the password read
  // from password_file); heartbeat_timeout (keep_alive_write_timeout),
  // read_timeout; connect_timeout = join_timeout. params: --rdzv_id,
  // --nnodes, --node_rank (-1 for c10d and etcd when not given: group ranks
  // follow arrival), --nproc_per_node, --local_addr (default: the store
  // address for node rank 0 of static, loopback for a loopback store, else
  // this host's name), join_timeout, last_call_timeout, keep_alive_interval,
  // keep_alive_max_attempt and the job's signature.
  RendezvousConfig rendezvous;
  // What the agent is given, all but run_log_dir and base_env (ddprun fills
  // them when it runs): spec.role, spec.local_world_size (--nproc_per_node,
  // cpu/gpu/auto resolved), spec.argv (the resolved command: python3 -u ...
  // for a Python program), spec.name (the program as typed),
  // spec.max_restarts, spec.redirects (-r), spec.tee (-t),
  // spec.console_ranks (--local_ranks_filter), spec.line_prefix_template
  // (TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE), spec.duplicate_stdout_filters
  // and spec.duplicate_stderr_filters, spec.virtual_local_rank,
  // spec.cpu_affinity (--numa_binding), set_omp_num_threads,
  // stop_grace (--stop_grace, --shutdown_timeout or
  // TORCH_ELASTIC_SHUTDOWN_TIMEOUT), exit_barrier_timeout, announce_timeout (--rdzv_conf
  // close_timeout) and hostname.
  agent::AgentOptions agent;

  // The launcher's own.
  bool standalone = false;
  // --rdzv_conf as given, key -> value.
  std::map<std::string, std::string> rdzv_conf;
  // --master_addr, --master_port: where static's node 0 hosts the store.
  std::string master_addr;
  std::uint16_t master_port = 0;
  // --monitor_interval: accepted for compatibility; exits are event-driven.
  double monitor_interval = 0;
  // --event_log_handler: torchrun's event handler name (null, console,
  // dynamic_rendezvous); ddprun records no torch event either way.
  std::string event_log_handler = "null";
  // --numa_binding's mode as given ("" when off); the CPUs are in
  // agent.spec.cpu_affinity.
  std::string numa_binding;
  bool no_python = false;
  bool module = false;
  // --log_dir; empty: a temporary directory removed at exit.
  std::string log_dir;
  // Forwarded to the workers (always SIGINT, SIGTERM, SIGHUP, SIGQUIT, plus
  // SIGUSR1/SIGUSR2 when named in --signals_to_handle).
  std::vector<int> signals;
  // The program as typed and its arguments.
  std::string program;
  std::vector<std::string> program_args;
  // For a Python program (a .py file, -m module, or a file that is not
  // executable): the Python that runs it, $PYTHON_EXEC or the first python3 on
  // PATH, resolved (agent.spec.argv[0]). Empty for a program executed directly.
  std::string python;
  // Whether the program runs on `python` only because it is a file that is
  // neither executable nor named *.py (torchrun runs any script so): the
  // failure report is then followed by a note saying so.
  bool python_guessed = false;
  // What ddprun warns about at start, one line each without "ddprun:
  // warning: " (e.g. a torchrun --rdzv_conf key it ignores, and why).
  std::vector<std::string> warnings;
  // The options whose values came from SLURM (see parse_command_line), each
  // with its source, e.g. "node_rank" -> "SLURM_NODEID". Empty outside SLURM.
  std::map<std::string, std::string> from_slurm;
};

// Outcome of parsing: a config to run, or a message to print and an exit code
// (help and version: stdout, 0; errors: one line on stderr, 2).
struct ParseResult {
  std::optional<LaunchConfig> config;
  std::string output;
  int exit_code = 0;
};

// Parses argv (argv[0] is the program name) with PET_<NAME> environment
// fallbacks (a variable set to "" counts as unset) and validates every value.
// Never throws for bad input.
//
// In a SLURM job (SLURM_JOB_ID set), unless --standalone or --rdzv_endpoint is
// given, the job's shape fills in every option that is given neither on the
// command line nor as PET_<NAME> (flags always win; see slurm.h for how each
// variable is read):
//   --nnodes          SLURM_NNODES (a fixed count)
//   --node_rank       SLURM_NODEID (with c10d it also orders the group ranks)
//   --rdzv_id         SLURM_JOB_ID
//   --master_addr     the first host of SLURM_STEP_NODELIST in an srun step,
//                     else of SLURM_JOB_NODELIST
//   --master_port     20000 + SLURM_JOB_ID mod 10000
//   --rdzv_endpoint   for c10d: --master_addr:--master_port as above
//   --nproc_per_node  SLURM_GPUS_ON_NODE when positive, else
//                     SLURM_NTASKS_PER_NODE (this node's entry); 1 without both
// A malformed variable that is used is an error naming it and its value. A
// job of several nodes whose --nnodes and --node_rank would both come from
// SLURM outside an srun step (SLURM_STEP_ID unset: the batch script itself) is
// an error: only one node would join.
ParseResult parse_command_line(int argc, const char* const* argv);

// The same, reading the environment, the CPUs and GPUs, the host name and
// files through `host` (parse_command_line(argc, argv) uses
// real_host_facts()).
ParseResult parse_command_line(int argc, const char* const* argv, const HostFacts& host);

}  // namespace ddp::launcher
