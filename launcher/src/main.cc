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
#include <optional>
#include <string>

#include "ddp/agent/agent.h"
#include "ddp/common/env.h"
#include "ddp/common/error.h"
#include "ddp/common/logging.h"
#include "ddp/launcher/launch_config.h"
#include "ddp/launcher/python_check.h"
#include "ddp/rendezvous/rendezvous_factory.h"
#include "ddp/status_http/server.h"

extern char** environ;

namespace {

// Removes this user's ddprun-<pid>-* temporary directories in `tmp` whose ddprun
// no longer runs: a SIGKILLed ddprun cannot remove its own.
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
    std::error_code remove_error;
    fs::remove_all(it->path(), remove_error);
  }
}

// The private temporary log directory goes at exit, but a hang's incident
// report must not: each moves to <tmp>/ddprun-hang-<pid>-<file name>, a name the
// stale-directory sweep above never touches (no pid right after "ddprun-").
void keep_incidents(const std::vector<std::string>& files, const std::filesystem::path& tmp) {
  namespace fs = std::filesystem;
  for (const auto& file : files) {
    const fs::path kept = tmp / ("ddprun-hang-" + std::to_string(::getpid()) + "-" +
                                 fs::path(file).filename().string());
    std::error_code ec;
    fs::rename(file, kept, ec);
    if (ec) fs::copy_file(file, kept, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      std::fprintf(stderr, "ddprun: could not keep the incident report %s: %s\n", file.c_str(),
                   ec.message().c_str());
    } else {
      std::fprintf(stderr,
                   "ddprun: the incident report is kept at %s (the log directory was temporary)\n",
                   kept.c_str());
    }
  }
}

// Creates <base>/<run_id>, the directory under which the agent creates every
// attempt's log directory, and returns its path with every symbolic link of
// `base` resolved. A log directory may be shared with other users, so the run
// directory must be ours: a real directory (not a symbolic link somebody
// planted) that we created or that belongs to us. Inside it only we can
// create entries, and the launcher refuses symbolic links in log paths
// (those the user's own --log_dir contains are resolved here, so they stay
// usable). Throws InvalidArgument naming the path and what is wrong.
std::string prepare_run_log_dir(const std::string& base, const std::string& run_id) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(base, ec);
  if (ec) throw ddp::InvalidArgument("--log_dir", "cannot create " + base + ": " + ec.message());
  const fs::path resolved = fs::canonical(base, ec);
  if (ec) throw ddp::InvalidArgument("--log_dir", "cannot resolve " + base + ": " + ec.message());
  const std::string dir = (resolved / run_id).string();
  const bool created = ::mkdir(dir.c_str(), 0755) == 0;
  if (!created && errno != EEXIST) {
    throw ddp::InvalidArgument("--log_dir", "cannot create " + dir + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    throw ddp::InvalidArgument("--log_dir", "cannot stat " + dir + ": " + std::strerror(errno));
  }
  if (S_ISLNK(st.st_mode)) {
    throw ddp::InvalidArgument("--log_dir",
                               dir + " is a symbolic link (refused: somebody may have planted it)");
  }
  if (!S_ISDIR(st.st_mode))
    throw ddp::InvalidArgument("--log_dir", dir + " exists and is not a directory");
  if (!created && st.st_uid != ::geteuid()) {
    throw ddp::InvalidArgument(
        "--log_dir", dir + " belongs to uid " + std::to_string(st.st_uid) +
                         ", not to this user (refused: use another --log_dir or --rdzv_id)");
  }
  return dir;
}

// After a failure report of a Python program: when its Python has no torch
// (say, the first python3 on PATH is a virtual environment without it, and
// every worker died of "No module named 'torch'"), a note naming that Python
// and PYTHON_EXEC. Checked only now, on failure: the launch path never pays.
void note_missing_torch(const ddp::launcher::LaunchConfig& config) {
  if (config.python.empty()) return;
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
  // First, before any thread exists (the embedded store starts one): block
  // the handled signals so that only the agent's signalfd sees them.
  auto launcher = ddp::agent::make_posix_launcher(config.signals);

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

  // Without --log_dir the per-attempt files (error.json) live in a private
  // temporary directory that is removed at exit; its name carries our pid so
  // that the next ddprun removes it if we are SIGKILLed.
  std::string temp_dir;
  if (config.log_dir.empty()) {
    remove_stale_temp_dirs(fs::temp_directory_path());
    std::string pattern =
        (fs::temp_directory_path() / ("ddprun-" + std::to_string(::getpid()) + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::fprintf(stderr, "ddprun: error: cannot create a temporary directory in %s\n",
                   fs::temp_directory_path().c_str());
      return 1;
    }
    temp_dir = pattern;
  }
  try {
    options.run_log_dir =
        prepare_run_log_dir(temp_dir.empty() ? config.log_dir : temp_dir, rdzv.params.run_id);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: error: %s\n", e.what());
    if (!temp_dir.empty()) {
      std::error_code ec;
      fs::remove_all(temp_dir, ec);
    }
    return 1;
  }

  ddp::agent::Agent agent(std::move(options), *handler, *launcher);
  const int code = agent.run();
  if (agent.reported_worker_failure()) note_missing_torch(config);
  if (!temp_dir.empty()) keep_incidents(agent.incident_files(), fs::temp_directory_path());
  if (!temp_dir.empty()) {
    std::error_code ec;
    fs::remove_all(temp_dir, ec);
  }
  // Leave without destructors: a rendezvous interrupted by a signal leaves a
  // thread blocked in the handler, and the kernel closes sockets and stops the
  // embedded store's thread faster than an orderly shutdown would.
  std::fflush(nullptr);
  ::_exit(code);
}

}  // namespace

int main(int argc, char** argv) {
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
