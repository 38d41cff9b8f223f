// ddprun: command line -> LaunchConfig -> rendezvous + agent. The config holds
// what the rendezvous factory and the agent are given; this adds what is
// known only when ddprun runs: the store's token, the environment workers
// inherit and the run's log directory.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "ddp/agent/agent.h"
#include "ddp/common/env.h"
#include "ddp/common/error.h"
#include "ddp/common/logging.h"
#include "ddp/launcher/launch_config.h"
#include "ddp/launcher/numa_binding.h"
#include "ddp/launcher/python_check.h"
#include "ddp/rendezvous/rendezvous_factory.h"
#include "ddp/status_http/server.h"
#include "status_command.h"

extern char** environ;

namespace {

// The file that marks a private temporary log directory as kept: it holds
// what the user needs after the run (see run()), so the sweep below leaves it.
constexpr const char* kKeptMarker = ".kept";

// Removes this user's ddprun-<pid>-* temporary directories in `tmp` whose ddprun
// no longer runs: a SIGKILLed ddprun cannot remove its own. A directory that
// its ddprun kept (kKeptMarker) stays.
void remove_stale_temp_dirs(const std::filesystem::path& tmp) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::directory_iterator it(tmp, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("ddprun-", 0) != 0) continue;
    long pid = 0;
    try {
      pid = std::stol(name.substr(7));
    } catch (const std::exception&) {
      continue;  // the old ddprun-XXXXXX form carries no pid
    }
    struct stat st {};
    if (pid <= 0 || ::lstat(it->path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != ::geteuid()) {
      continue;
    }
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    struct stat marker {};
    if (::lstat((it->path() / kKeptMarker).c_str(), &marker) == 0) continue;
    std::error_code remove_error;
    fs::remove_all(it->path(), remove_error);
  }
}

// Creates a fresh <base>/<run_id>_<random> (as torchrun's mkdtemp of
// "<run_id>_" does), the directory under which the agent creates every
// attempt's log directory, and returns its path with every symbolic link of
// `base` resolved. A run never reuses an earlier run's directory, so a rerun
// with the same --rdzv_id and --log_dir overwrites nothing. mkdtemp creates it
// (mode 0700) or fails: it cannot be a symbolic link somebody planted in a
// shared --log_dir, and inside it only we can create entries (the launcher
// refuses symbolic links in log paths as well). Throws InvalidArgument naming
// the path and what is wrong.
std::string prepare_run_log_dir(const std::string& base, const std::string& run_id) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(base, ec);
  if (ec) throw ddp::InvalidArgument("--log_dir", "cannot create " + base + ": " + ec.message());
  const fs::path resolved = fs::canonical(base, ec);
  if (ec) throw ddp::InvalidArgument("--log_dir", "cannot resolve " + base + ": " + ec.message());
  std::string dir = (resolved / (run_id + "_XXXXXX")).string();
  if (::mkdtemp(dir.data()) == nullptr) {
    throw ddp::InvalidArgument("--log_dir", "cannot create a directory " + dir + " in " +
                                                resolved.string() + ": " + std::strerror(errno));
  }
  return dir;
}

// Whether a regular file lies anywhere below `dir`.
bool holds_a_file(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) return true;
  }
  return false;
}

// Whether -r or -t writes any stream of any local rank to a log file.
bool writes_log_files(const ddp::agent::WorkerSpec& spec) {
  auto any = [](const ddp::agent::StdSetting& setting) {
    if (setting.all != ddp::agent::Std::kNone) return true;
    for (const auto& [rank, streams] : setting.per_rank) {
      if (streams != ddp::agent::Std::kNone) return true;
    }
    return false;
  };
  return any(spec.redirects) || any(spec.tee);
}

// After a failure report of a Python program: when its Python has no torch
// (say, the first python3 on PATH is a virtual environment without it, and
// every worker died of "No module named 'torch'"), a note naming that Python
// and PYTHON_EXEC. Checked only now, on failure: the launch path never pays.
void note_missing_torch(const ddp::launcher::LaunchConfig& config) {
  if (config.python.empty()) return;
  if (config.python_guessed) {
    // The program may not be Python at all (a shell script without +x): say
    // what was guessed rather than what that Python lacks.
    std::fputs(ddp::launcher::python_guess_note(config.program, config.python).c_str(), stderr);
    return;
  }
  const std::optional<bool> has_torch =
      ddp::launcher::python_finds_torch(config.python, std::chrono::seconds(5));
  if (!has_torch.has_value() || *has_torch) return;
  const auto source = ddp::env::get("PYTHON_EXEC").value_or("").empty()
                          ? ddp::launcher::PythonSource::kPath
                          : ddp::launcher::PythonSource::kPythonExec;
  std::fputs(ddp::launcher::missing_torch_note(config.program, config.python, source).c_str(),
             stderr);
}

// One line saying which options this SLURM job filled in, and from what, e.g.
// "from SLURM: --nnodes=2 (SLURM_NNODES), --node_rank=1 (SLURM_NODEID), ...".
void log_slurm_options(const ddp::launcher::LaunchConfig& config) {
  if (config.from_slurm.empty()) return;
  const ddp::RendezvousConfig& rdzv = config.rendezvous;
  auto value = [&](const std::string& option) -> std::string {
    if (option == "nnodes") return std::to_string(rdzv.params.max_nodes);
    if (option == "node_rank") return std::to_string(rdzv.params.node_rank);
    if (option == "rdzv_id") return rdzv.params.run_id;
    if (option == "master_addr") return config.master_addr;
    if (option == "master_port") return std::to_string(config.master_port);
    if (option == "rdzv_endpoint") return rdzv.host + ":" + std::to_string(rdzv.port);
    if (option == "nproc_per_node") return std::to_string(config.agent.spec.local_world_size);
    return "?";
  };
  std::string line;
  for (const auto& [option, source] : config.from_slurm) {
    line +=
        (line.empty() ? "" : ", ") + ("--" + option + "=" + value(option) + " (" + source + ")");
  }
  ddp::log::get("ddprun")->info("from SLURM: {}", line);
}

// With --numa_binding, one line saying where each local rank runs, e.g.
// "--numa_binding=exclusive: local rank 0 on CPUs 0-3,16-19; local rank 1 on ...".
void log_numa_binding(const ddp::launcher::LaunchConfig& config) {
  if (config.numa_binding.empty()) return;
  std::string line;
  const auto& plan = config.agent.spec.cpu_affinity;
  for (std::size_t rank = 0; rank < plan.size(); ++rank) {
    line += (line.empty() ? "" : "; ") +
            ("local rank " + std::to_string(rank) + " on CPUs " +
             ddp::launcher::cpu_list_text({plan[rank].begin(), plan[rank].end()}));
  }
  ddp::log::get("ddprun")->info("--numa_binding={}: {}", config.numa_binding, line);
}

// --status_allow_no_token let the live view listen beyond loopback without a
// token (the parser refuses that otherwise): say so, once, as a warning.
void warn_of_an_open_live_view(const ddp::agent::StatusOptions& status, const std::string& token) {
  if (!status.port || !token.empty() || ddp::status_http::is_loopback(status.host)) return;
  ddp::log::get("ddprun")->warn(
      "the live view listens on {} beyond loopback without a token "
      "(--status_allow_no_token): anyone who can reach its port reads this job's hosts, "
      "addresses, pids and incidents; set DDP_STORE_TOKEN to require a token",
      status.host);
}

int run(const ddp::launcher::LaunchConfig& config) {
  namespace fs = std::filesystem;
  log_slurm_options(config);
  log_numa_binding(config);
  for (const auto& warning : config.warnings) {
    std::fprintf(stderr, "ddprun: warning: %s\n", warning.c_str());
  }
  // First, before any thread exists (the embedded store starts one): block
  // the handled signals so that only the agent's signalfd sees them.
  auto loop = ddp::agent::make_posix_event_loop(config.signals);

  ddp::RendezvousConfig rdzv = config.rendezvous;
  rdzv.token = ddp::env::get_or("DDP_STORE_TOKEN", "");
  warn_of_an_open_live_view(config.agent.status, rdzv.token);
  std::unique_ptr<ddp::RendezvousHandler> handler;
  try {
    handler = ddp::create_rendezvous(rdzv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: error: %s\n", e.what());
    return 1;
  }

  ddp::agent::AgentOptions options = config.agent;
  for (char** var = environ; *var != nullptr; ++var) options.base_env.emplace_back(*var);

  // Where the logs go: a fresh <base>/<run_id>_<random> for every run (see
  // prepare_run_log_dir), said at start when it holds the workers' output.
  //  - --log_dir: base is --log_dir.
  //  - -r/-t without --log_dir: base is a folder of its own,
  //    $TMPDIR/ddprun_logs_XXXXXX (torchrun's is torchelastic_XXXXXX), kept.
  //  - neither: the run's files are error files (and hang incidents), in a
  //    private $TMPDIR/ddprun-<pid>-XXXXXX removed at exit unless a failure
  //    report or an incident named a file in it (then kept, and said so); its
  //    name carries our pid so that the next ddprun removes it if we are
  //    SIGKILLed.
  const bool output_in_files = writes_log_files(config.agent.spec);
  std::string base = config.log_dir;
  std::string temp_dir;  // removed at exit unless kept
  if (base.empty()) {
    const fs::path tmp = fs::temp_directory_path();
    remove_stale_temp_dirs(tmp);
    std::string pattern =
        (tmp / (output_in_files ? std::string("ddprun_logs_XXXXXX")
                                : "ddprun-" + std::to_string(::getpid()) + "-XXXXXX"))
            .string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::fprintf(stderr, "ddprun: error: cannot create a temporary directory in %s: %s\n",
                   tmp.c_str(), std::strerror(errno));
      return 1;
    }
    base = pattern;
    if (!output_in_files) temp_dir = pattern;
  }
  try {
    options.run_log_dir = prepare_run_log_dir(base, rdzv.params.run_id);
    if (!options.health_check.command.empty()) {
      options.health_check.output_file = options.run_log_dir + "/health_check.log";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: error: %s\n", e.what());
    if (!temp_dir.empty()) {
      std::error_code ec;
      fs::remove_all(temp_dir, ec);
    }
    return 1;
  }
  if (!config.log_dir.empty()) {
    std::fprintf(stderr, "ddprun: logs of this run in %s\n", options.run_log_dir.c_str());
  } else if (output_in_files) {
    std::fprintf(stderr,
                 "ddprun: logs of this run in %s (no --log_dir: a folder of its own, kept after "
                 "the run)\n",
                 options.run_log_dir.c_str());
  }
  // The job's record goes where the run's folder is kept (not in the private one).
  if (!config.log_dir.empty() || output_in_files) options.record_dir = options.run_log_dir;
  const std::string run_log_dir = options.run_log_dir;

  // What the agent's events become for the user: lines on stderr (the live
  // view is the agent's own second listener).
  ddp::agent::StderrPrinter printer;
  ddp::agent::Agent agent(std::move(options), *handler, *loop, printer);
  const int code = agent.run();
  if (agent.reported_worker_failure()) note_missing_torch(config);
  if (!temp_dir.empty()) {
    // A path printed during the run (a failure report's error_file, a hang
    // incident) must still be there after it. Without -r/-t the folder holds
    // no other files: a report that found no error file named none.
    if ((agent.reported_worker_failure() || !agent.incident_files().empty()) &&
        holds_a_file(temp_dir)) {
      std::ofstream(fs::path(temp_dir) / kKeptMarker);
      std::fprintf(stderr,
                   "ddprun: kept %s: the files named above are in it (no --log_dir; ddprun does "
                   "not remove it)\n",
                   run_log_dir.c_str());
    } else {
      std::error_code ec;
      fs::remove_all(temp_dir, ec);
    }
  }
  // Leave without destructors: a rendezvous interrupted by a signal leaves a
  // thread blocked in the handler, and the kernel closes sockets and stops the
  // embedded store's thread faster than an orderly shutdown would.
  std::fflush(nullptr);
  ::_exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  // `ddprun status URL...`: the terminal view of a running job (status_command.h). Only
  // the first argument is looked at: a program named "status" runs as ./status.
  if (argc > 1 && std::string(argv[1]) == "status") {
    return ddp::launcher::status::run_status_command(argc - 1, argv + 1);
  }
  auto parsed = ddp::launcher::parse_command_line(argc, argv);
  if (!parsed.config) {
    std::fputs(parsed.output.c_str(), parsed.exit_code == 0 ? stdout : stderr);
    return parsed.exit_code;
  }
  try {
    ddp::log::init("ddprun");
    return run(*parsed.config);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: error: %s\n", e.what());
    return 1;
  }
}
