// Everything ddprun's command line says, parsed and validated once
// (parse_command_line) and then read-only: the launcher turns it into the
// rendezvous config and the agent's options.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ddp/agent/worker_spec.h"

namespace ddp::launcher {

struct LaunchConfig {
  // --nnodes N or MIN:MAX (default 1:1).
  int min_nodes = 1;
  int max_nodes = 1;
  // --nproc_per_node, resolved (cpu/gpu/auto become numbers).
  int nproc_per_node = 1;
  bool standalone = false;
  // --rdzv_backend: "static" (default, like torchrun), "c10d" or "etcd".
  std::string rdzv_backend = "static";
  // The agents' store: --rdzv_endpoint host[:port], or for static without it
  // --master_addr:--master_port. Port 0 (standalone) picks a free one. For
  // etcd, the first endpoint.
  std::string rdzv_host = "127.0.0.1";
  std::uint16_t rdzv_port = 29500;
  // etcd: every endpoint, "host:port,host:port" (ports filled in).
  std::string rdzv_endpoints;
  // etcd: --rdzv_conf protocol=https, cacert, cert, key, username, and the
  // password read from password_file.
  bool etcd_tls = false;
  std::string etcd_ca_file;
  std::string etcd_cert_file;
  std::string etcd_key_file;
  std::string etcd_username;
  std::string etcd_password;
  std::string rdzv_id = "none";
  std::map<std::string, std::string> rdzv_conf;
  std::chrono::milliseconds join_timeout = std::chrono::seconds(600);
  std::chrono::milliseconds last_call_timeout = std::chrono::seconds(30);
  // --rdzv_conf's keep-alive keys (c10d): torchrun's names and defaults.
  // heartbeat_timeout (keep_alive_write_timeout here) bounds one keep-alive
  // write; read_timeout how long one
  // store call retries a lost connection. close_timeout, when given, bounds how
  // long a stopping agent waits for the store to take its word and its leaving
  // (AgentOptions::announce_timeout, 5 s otherwise).
  std::chrono::milliseconds keep_alive_interval = std::chrono::seconds(5);
  int keep_alive_max_attempt = 3;
  std::chrono::milliseconds keep_alive_write_timeout = std::chrono::seconds(5);
  std::optional<std::chrono::milliseconds> close_timeout;
  std::chrono::milliseconds read_timeout = std::chrono::seconds(60);
  // --rdzv_conf is_host: whether this node hosts the c10d store; unset: the
  // node whose address the endpoint is hosts it.
  std::optional<bool> is_host;
  int node_rank = 0;
  // Whether --node_rank was given (c10d sorts group ranks by it then).
  bool node_rank_given = false;
  std::string master_addr = "127.0.0.1";
  std::uint16_t master_port = 29500;
  // --local_addr: how other nodes reach this one (default: the store address
  // for node rank 0 of static, else this host's name).
  std::string local_addr;
  int max_restarts = 0;
  // --monitor_interval: accepted for compatibility; exits are event-driven.
  double monitor_interval = 5.0;
  std::string role = "default";
  bool no_python = false;
  bool module = false;
  // --log_dir; empty: a temporary directory removed at exit.
  std::string log_dir;
  agent::StdSetting redirects;
  agent::StdSetting tee;
  std::set<int> local_ranks_filter;
  // Forwarded to the workers (always SIGINT, SIGTERM, SIGHUP, SIGQUIT, plus
  // SIGUSR1/SIGUSR2 when named in --signals_to_handle).
  std::vector<int> signals;
  std::chrono::milliseconds exit_barrier_timeout = std::chrono::seconds(300);
  // --stop_grace: SIGTERM first, SIGKILL after this long.
  std::chrono::milliseconds stop_grace = std::chrono::seconds(30);
  // The program as typed and its arguments.
  std::string program;
  std::vector<std::string> program_args;
  // The resolved command of every worker (python3 -u ... for Python programs).
  std::vector<std::string> command;
  // For a Python program (a .py file, -m module, or a file that is not
  // executable): the Python that runs it, $PYTHON_EXEC or the first python3 on
  // PATH, resolved (command[0]). Empty for a program executed directly.
  std::string python;
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
// fallbacks and validates every value. Never throws for bad input.
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

}  // namespace ddp::launcher
