// ddprun's options, one table: each row names an option (its --under_score
// and --dash-spelling, PET_<NAME>, help metavar), its default and its help
// text, and says where CLI11 puts its value (as text, or a flag) for
// validation. Parsing, the help and the PET_<NAME> fallbacks are all driven
// by it (cli.cc).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ddp::launcher {

class SlurmEnvironment;

// Every option's value as given (or its default), before validation.
struct RawOptions {
  std::string nnodes;
  std::string nproc_per_node;
  bool standalone = false;
  std::string rdzv_backend;
  std::string rdzv_endpoint;
  std::string rdzv_id;
  std::string rdzv_conf;
  std::string node_rank;
  std::string master_addr;
  std::string master_port;
  std::string local_addr;
  std::string max_restarts;
  std::string max_no_progress_restarts;
  std::string monitor_interval;
  std::string start_method;
  std::string event_log_handler;
  std::string role;
  bool no_python = false;
  bool module = false;
  bool run_path = false;
  std::string log_dir;
  std::string redirects;
  std::string tee;
  std::string local_ranks_filter;
  std::string duplicate_stdout_filters;
  std::string duplicate_stderr_filters;
  std::string logs_specs;
  std::string numa_binding;
  std::string signals_to_handle;
  std::string exit_barrier_timeout;
  std::string stop_grace;
  std::string shutdown_timeout;
  bool virtual_local_rank = false;
  std::string hang_timeout;
  std::string on_hang;
  std::string status_port;
  std::string health_check;
  std::string health_check_timeout;
  std::string status_host;
  bool status_allow_no_token = false;
};

struct OptionRow {
  // "nproc_per_node": --nproc_per_node, --nproc-per-node, PET_NPROC_PER_NODE.
  std::string name = "";
  // A one-letter spelling ("r" for -r), or empty.
  std::string short_name = "";
  // Where the value goes: text (an option that takes a value), or a flag.
  std::string RawOptions::*text = nullptr;
  bool RawOptions::*flag = nullptr;
  // The value when the option is neither given nor in PET_<NAME>, as the help
  // shows it; empty: none (flags: off). Read from the defaults of the struct
  // the value ends up in where it has one.
  std::string default_value = "";
  std::string help = "";
};

// Every option, in the order of the help.
const std::vector<OptionRow>& option_table();

// RawOptions holding every default.
RawOptions default_options();

// "--nproc_per_node,--nproc-per-node" (CLI11's names; "-r,--redirects").
std::string option_names(const OptionRow& row);

// "PET_NPROC_PER_NODE".
std::string option_env_name(const std::string& name);

// The help's text: before the options (usage and description), after them
// (the program, examples), and --version's line.
extern const char* const kUsage;
extern const char* const kFooter;
extern const char* const kVersion;

// Under SLURM (SLURM_JOB_ID set), without --standalone and --rdzv_endpoint:
// every option of the job's shape that was not `given` (on the command line or
// as PET_<NAME>) comes from the job's environment (see launch_config.h and
// slurm.h for the variables); `from_slurm` records each option filled in and
// its source. Only the variables that are used are read, so a flag always
// wins, even over a malformed variable. Throws UsageError. (slurm.cc)
void fill_from_slurm(const SlurmEnvironment& slurm,
                     const std::function<bool(const std::string& name)>& given, RawOptions& raw,
                     std::map<std::string, std::string>& from_slurm);

}  // namespace ddp::launcher
