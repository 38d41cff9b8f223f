// What the agent runs on its node, and how: the worker group spec and the
// agent's options. Parsed and validated once by the launcher (its LaunchConfig
// holds them).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ddp/common/time.h"

namespace ddp::agent {

// Which of a worker's streams -r/--redirects and -t/--tee apply to
// (torchrun's Std: 0 none, 1 stdout, 2 stderr, 3 both).
enum class Std : unsigned { kNone = 0, kOut = 1, kErr = 2, kAll = 3 };

inline bool has(Std value, Std bit) {
  return (static_cast<unsigned>(value) & static_cast<unsigned>(bit)) != 0;
}

// A value for every local rank: `all` unless `per_rank` names it.
struct StdSetting {
  Std all = Std::kNone;
  std::map<int, Std> per_rank;
  Std of(int local_rank) const {
    auto it = per_rank.find(local_rank);
    return it == per_rank.end() ? all : it->second;
  }
};

struct WorkerSpec {
  // ROLE_NAME of every worker.
  std::string role = "default";
  // Workers on this node (LOCAL_WORLD_SIZE).
  int local_world_size = 1;
  // The command of every worker: argv[0] resolved (python3 -u for .py), the
  // literal "${local_rank}" in any argument replaced per worker.
  std::vector<std::string> argv;
  // The title of failure reports ("<name> FAILED"): the script or program as
  // the user named it. Empty: the file name of argv[0].
  std::string name;
  // The job's restarts (counted once per round across every node).
  int max_restarts = 0;
  // After this many restarts in a row after rounds in which no rank completed
  // a step, the job stops with kNoProgressExitCode instead (0: never).
  int max_no_progress_restarts = 0;
  // -r: the streams written only to <attempt dir>/<local_rank>/{stdout,stderr}.log.
  StdSetting redirects;
  // -t: the streams written to those files and to the console.
  StdSetting tee;
  // Local ranks whose output reaches the console; empty: all.
  std::set<int> console_ranks;
  // Console line prefix; ${role_name}, ${local_rank} and ${rank} are replaced.
  std::string line_prefix_template = "[${role_name}${local_rank}]:";
  // --duplicate_stdout_filters, --duplicate_stderr_filters: the lines of a
  // tee'd stream shown on the console (-t, --local_ranks_filter) that contain
  // any of these strings are also written, behind their console prefix, to
  // <attempt dir>/filtered_stdout.log (filtered_stderr.log), one file for
  // every rank; empty: none.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  // --virtual_local_rank: every worker gets LOCAL_RANK=0 and a
  // CUDA_VISIBLE_DEVICES naming its own GPU only (see add_torch_variables).
  bool virtual_local_rank = false;
  // --numa_binding: the CPUs each local rank's worker is bound to (index:
  // local rank), applied before exec; empty: no binding.
  std::vector<std::vector<int>> cpu_affinity;
};

// How the agent watches workers that are alive but may not progress.
struct WatchOptions {
  enum class OnHang { kRestart, kFail };
  // --hang_timeout: nullopt derives it from the steps seen ("auto", see
  // HangTimeout in agent/src/hang_detector.h); zero turns hang detection off.
  std::optional<std::chrono::milliseconds> hang_timeout = std::chrono::milliseconds(0);
  // --on_hang: spend a restart, or fail the job.
  OnHang on_hang = OnHang::kRestart;
  // Give every worker a progress page (DDP_PROGRESS_FD, see
  // ddp/worker_contract/progress_page.h) that ddp::worker fills.
  bool progress_pages = false;
  // How often the agent reads the pages and checks.
  std::chrono::milliseconds tick = std::chrono::milliseconds(250);
  // How often a node's summary goes to the other nodes through the store.
  std::chrono::milliseconds exchange_period = std::chrono::seconds(1);
  // torch's file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1): the named pipe the
  // agent serves; empty: off.
  std::string timer_file;
  // How long collecting a hung worker's native stacks may take.
  std::chrono::milliseconds stack_timeout = std::chrono::seconds(15);
};

// A command each node runs before it joins a round (agent/src/health_check.h).
struct HealthCheckOptions {
  // Run through /bin/sh -c; empty: no check.
  std::string command;
  // The check's group is killed (SIGKILL) when it runs longer.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  // The waits between failed tries: initial, doubled each time, at most max.
  std::chrono::milliseconds backoff_initial = std::chrono::seconds(1);
  std::chrono::milliseconds backoff_max = std::chrono::seconds(30);
  // Where each run's stdout and stderr go (truncated per run); empty: the
  // output is not kept (the failure line then shows none).
  std::string output_file;
};

// The agent's live view (status_endpoint.h): /metrics, /livez, /readyz,
// /status and the page.
struct StatusOptions {
  // --status_port: nullopt serves none; 0 picks a free port (logged).
  std::optional<std::uint16_t> port;
  // --status_host: the address to listen on. Beyond loopback, clients must
  // carry the store's token when it has one.
  std::string host = "127.0.0.1";
};

struct AgentOptions {
  WorkerSpec spec;
  // <log_dir>/<run_id>: holds attempt_<n>/<local_rank>/{error.json,stdout.log,stderr.log}.
  std::string run_log_dir;
  // Where the job's record goes (events.jsonl, status.json; agent/src/job_record.h);
  // empty: none. ddprun sets it to run_log_dir when that folder is kept.
  std::string record_dir;
  // Set OMP_NUM_THREADS=1 in workers when it is unset (torchrun does this when
  // nproc_per_node > 1).
  bool set_omp_num_threads = false;
  // A folder of ddprun's own Python modules (the torch backend ddp_torch),
  // appended to the workers' PYTHONPATH, after the user's entries; "" adds none.
  std::string python_module_dir;
  // SIGTERM first, SIGKILL after this long when stopping workers.
  std::chrono::milliseconds stop_grace = std::chrono::seconds(30);
  // How long a stopping agent waits for the rendezvous store to take its word
  // to the other agents (the round's end key) and its leaving of the job. The
  // workers are stopped meanwhile, never after it; a store that has not
  // answered by then is given up on.
  std::chrono::milliseconds announce_timeout = std::chrono::seconds(5);
  // How long an agent whose workers succeeded waits for the other agents.
  std::chrono::milliseconds exit_barrier_timeout = std::chrono::seconds(300);
  // This host's name in failure reports.
  std::string hostname;
  // The environment workers inherit ("NAME=value" each); the agent adds its own.
  std::vector<std::string> base_env;
  // Progress, hangs, the file timer, stragglers.
  WatchOptions watch;
  // The live view.
  StatusOptions status;
  // --health_check: run before every join.
  HealthCheckOptions health_check;
  // Where the agent's deadlines are read from; must outlive the agent.
  const Runtime* runtime = &real_runtime();
};

// What decides the variables torch 2.x's agent adds for one worker.
struct TorchWorkerFacts {
  int local_rank = 0;
  bool virtual_local_rank = false;
  // Whether MASTER_ADDR:MASTER_PORT is the agents' store (it then already
  // runs, and torch's env:// must not host one): TORCHELASTIC_USE_AGENT_STORE.
  bool uses_agent_store = false;
  // More than one worker on this node (torchrun then sets OMP_NUM_THREADS=1).
  bool set_omp_num_threads = false;
};

// Adds to `env` (ddprun's environment and the round's variables, LOCAL_RANK
// included) what torch's agent gives a worker besides: TORCHELASTIC_USE_AGENT_STORE
// ("True"/"False"); TORCH_NCCL_ASYNC_ERROR_HANDLING (torch 2.x's name) and
// NCCL_ASYNC_ERROR_HANDLING (1.13's, which torch 2.x still reads), each the
// user's value in either spelling, else "1"; OMP_NUM_THREADS=1 when asked and
// unset; and with virtual_local_rank, LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES =
// the local_rank-th item of the inherited CUDA_VISIBLE_DEVICES (split at ','
// as torch does), else the local rank. Throws InvalidArgument when that list
// has no such item.
void add_torch_variables(std::map<std::string, std::string>& env, const TorchWorkerFacts& facts);

// CUDA_VISIBLE_DEVICES' items as torch splits them: at every ',' ("" is one
// empty item, "0,1," three), without blanks around each.
std::vector<std::string> visible_device_items(const std::string& visible);

// Replaces "${local_rank}" in `arg` (torchrun's macro substitution).
std::string substitute_local_rank(const std::string& arg, int local_rank);

// Fills the prefix template.
std::string format_line_prefix(const std::string& tmpl, const std::string& role, int local_rank,
                               int rank);

}  // namespace ddp::agent
