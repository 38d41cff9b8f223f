#include "worker_group.h"

#include <csignal>
#include <filesystem>

#include <fmt/format.h>

#include "ddp/common/error.h"
#include "ddp/common/logging.h"
#include "ddp/worker_contract/env_names.h"
#include "ddp/worker_contract/worker_contract.h"
#include "safe_file.h"

namespace ddp::agent {

namespace fs = std::filesystem;
namespace names = ddp::env_names;

bool runs_python(const std::vector<std::string>& argv) {
  return !argv.empty() && fs::path(argv[0]).filename().string().rfind("python", 0) == 0;
}

WorkerGroup::WorkerGroup(const AgentOptions& options, RendezvousHandler& rendezvous,
                         WorkerEventLoop& loop, ProgressWatch& watch, AgentEvents& events)
    : options_(options), rdzv_(rendezvous), loop_(loop), watch_(watch), events_(events),
      logger_(log::get("ddprun")), python_(runs_python(options.spec.argv)) {}

void WorkerGroup::begin_round(const Round& round, int attempt, int restart_count,
                              const JobCounts& job, bool keep) {
  round_ = &round;
  attempt_ = attempt;
  restart_count_ = restart_count;
  job_ = job;
  std::vector<Worker> kept;
  if (keep) {
    for (auto& w : workers_) {
      if (!w.running) continue;
      w.kept = true;
      kept.push_back(std::move(w));
    }
  }
  workers_ = std::move(kept);
  pid_to_worker_.clear();
  for (std::size_t i = 0; i < workers_.size(); ++i) pid_to_worker_[workers_[i].pid] = i;
}

std::string WorkerGroup::attempt_subdir_name() const {
  return "attempt_" + std::to_string(attempt_ - 1);
}

// "attempt_<n>/<local rank>", below run_log_dir.
std::string WorkerGroup::attempt_subdir(int local_rank) const {
  return attempt_subdir_name() + "/" + std::to_string(local_rank);
}

void WorkerGroup::start() {
  for (int local_rank = 0; local_rank < options_.spec.local_world_size; ++local_rank) {
    if (Worker* kept = running_worker(local_rank)) {
      resume_worker(*kept);
    } else {
      start_worker(local_rank);
    }
  }
}

Worker* WorkerGroup::running_worker(int local_rank) {
  for (auto& w : workers_) {
    if (w.local_rank == local_rank && w.running) return &w;
  }
  return nullptr;
}

void WorkerGroup::start_worker(int local_rank) {
  const WorkerSpec& spec = options_.spec;
  Worker worker;
  worker.local_rank = local_rank;
  worker.rank = round_->info().base_rank + local_rank;
  const std::string dir = options_.run_log_dir + "/" + attempt_subdir(local_rank);
  // The run directory is ddprun's own (main.cc resolved and checked it);
  // below it, never through a symbolic link planted in a shared --log_dir.
  std::error_code ec;
  fs::create_directories(options_.run_log_dir, ec);
  if (int err =
          detail::make_directories_no_symlinks(options_.run_log_dir, attempt_subdir(local_rank))) {
    throw InvalidArgument(
        "agent", "cannot create log directory " + dir + ": " + detail::open_error_text(err));
  }
  worker.error_file = dir + "/error.json";
  fs::remove(worker.error_file, ec);  // a stale file from an earlier run

  ProcessSpec process;
  for (const auto& arg : spec.argv) process.argv.push_back(substitute_local_rank(arg, local_rank));
  process.env = worker_env(worker);
  process.local_rank = local_rank;
  process.prefix =
      format_line_prefix(spec.line_prefix_template, spec.role, local_rank, worker.rank);
  const bool on_console = spec.console_ranks.empty() || spec.console_ranks.count(local_rank) > 0;
  const Std redirect = spec.redirects.of(local_rank);
  const Std tee = spec.tee.of(local_rank);
  auto route = [&](Std bit, const char* name, const std::vector<std::string>& filters,
                   const char* duplicate_name) {
    StreamRoute r;
    if (has(redirect, bit) || has(tee, bit)) r.file = dir + "/" + name;
    r.console = on_console && (!has(redirect, bit) || has(tee, bit));
    // torch duplicates the lines of the tee'd streams it shows (its tail).
    if (!filters.empty() && r.console && has(tee, bit)) {
      r.duplicate_file = options_.run_log_dir + "/" + attempt_subdir_name() + "/" + duplicate_name;
      r.duplicate_filters = filters;
    }
    return r;
  };
  process.out =
      route(Std::kOut, "stdout.log", spec.duplicate_stdout_filters, "filtered_stdout.log");
  process.err =
      route(Std::kErr, "stderr.log", spec.duplicate_stderr_filters, "filtered_stderr.log");
  if (static_cast<std::size_t>(local_rank) < spec.cpu_affinity.size()) {
    process.cpus = spec.cpu_affinity[static_cast<std::size_t>(local_rank)];
  }
  if (ProgressPageFile* page = watch_.prepare(local_rank)) {
    process.inherit_fds.push_back(page->fd());
    process.env.push_back(std::string(names::kProgressFd) + "=" + std::to_string(page->fd()));
  }
  const int control_fd = control_.prepare(local_rank);
  process.inherit_fds.push_back(control_fd);
  process.env.push_back(std::string(names::kControlFd) + "=" + std::to_string(control_fd));
  worker.pid = loop_.launch(process);
  control_.started(local_rank);
  watch_.started(local_rank, worker.rank, worker.pid);
  worker.running = true;
  pid_to_worker_[worker.pid] = workers_.size();
  workers_.push_back(std::move(worker));
}

// How long a worker that recovers in place lets a failed collective wait
// for this agent's word that the round ended: a dead node's peers see their
// connections break before the keep-alives are missed, a crashed worker's
// before its agent ends the round.
std::chrono::milliseconds WorkerGroup::change_grace() const {
  const RendezvousParams& params = rdzv_.params();
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      params.keep_alive_interval * (params.keep_alive_max_attempt + 1) + options_.announce_timeout);
}

// What `worker` learns of the round: in its environment when it starts, in
// its `round` message when it is kept (ddp/worker_contract/worker_contract.h).
contract::WorkerRound WorkerGroup::round_of(const Worker& worker) const {
  const RendezvousInfo& info = round_->info();
  contract::WorkerRound round;
  round.round = info.round;
  round.rank = worker.rank;
  round.world_size = info.world_size;
  // --virtual_local_rank: every worker is local rank 0 of its own GPU.
  round.local_rank = options_.spec.virtual_local_rank ? 0 : worker.local_rank;
  round.local_world_size = options_.spec.local_world_size;
  round.group_rank = info.group_rank;
  round.group_world_size = info.group_world_size;
  round.restart_count = restart_count_;
  round.job_restart_count = job_.restarts;
  round.membership_changes = job_.membership_changes;
  round.master_addr = info.master_addr;
  round.master_port = info.master_port;
  round.store_addr = info.store_addr;
  round.store_port = info.store_port;
  round.store_prefix = info.worker_prefix;
  round.change_grace = change_grace();
  return round;
}

// Tells a kept worker the round it is in now (ddp::reform() waits for it).
void WorkerGroup::resume_worker(Worker& worker) {
  worker.rank = round_->info().base_rank + worker.local_rank;
  const contract::WorkerRound round = round_of(worker);
  control_.expect_reform(worker.local_rank, round.round);
  tell(worker, contract::encode(round));
  watch_.kept(worker.local_rank, worker.rank);
}

control::Sent WorkerGroup::tell(Worker& worker, const control::Message& message) {
  const control::Sent sent = control_.send(worker.local_rank, message);
  if (sent == control::Sent::kSent) return sent;
  if (sent == control::Sent::kClosed) {
    logger_->warn("could not send worker rank {} (local rank {}, pid {}) its '{}' message: {}",
                  worker.rank, worker.local_rank, worker.pid, message.type,
                  control::describe(sent));
    return sent;
  }
  worker.ended_by_agent = fmt::format(
      "ended by ddprun: local rank {} (rank {}, pid {}) could not be sent its '{}' message on "
      "its control channel: {}",
      worker.local_rank, worker.rank, worker.pid, message.type, control::describe(sent));
  events_.notice(worker.ended_by_agent);
  loop_.signal_group(worker.pid, SIGKILL);
  return sent;
}

std::vector<std::string> WorkerGroup::worker_env(const Worker& worker) const {
  const WorkerSpec& spec = options_.spec;
  std::map<std::string, std::string> env;
  for (const auto& var : options_.base_env) {
    auto eq = var.find('=');
    if (eq != std::string::npos) env[var.substr(0, eq)] = var.substr(eq + 1);
  }
  const RendezvousParams& params = rdzv_.params();
  for (const auto& [name, value] : contract::environment_of(round_of(worker))) env[name] = value;
  env[names::kRoleName] = spec.role;
  env[names::kMaxRestarts] = std::to_string(spec.max_restarts);
  env[names::kRunId] = params.run_id;
  env[names::kErrorFile] = worker.error_file;
  const RendezvousInfo& info = round_->info();
  TorchWorkerFacts torch;
  torch.local_rank = worker.local_rank;
  torch.virtual_local_rank = spec.virtual_local_rank;
  // torch's env:// must not host a store where the agents' already runs.
  torch.uses_agent_store =
      info.master_addr == info.store_addr && info.master_port == info.store_port;
  torch.set_omp_num_threads = options_.set_omp_num_threads;
  add_torch_variables(env, torch);
  if (timer_) env["TORCHELASTIC_TIMER_FILE"] = timer_->path();
  if (!options_.python_module_dir.empty()) {
    auto& path = env[names::kPythonPath];
    path = path.empty() ? options_.python_module_dir : path + ":" + options_.python_module_dir;
  }
  // A hung Python worker is ended with SIGABRT: faulthandler then prints
  // every thread's traceback into its log.
  if (python_ && (options_.watch.hang_timeout != std::chrono::milliseconds(0)) &&
      env.find("PYTHONFAULTHANDLER") == env.end()) {
    env["PYTHONFAULTHANDLER"] = "1";
  }
  const std::string token = rdzv_.store_token();
  if (!token.empty()) {
    env[names::kStoreToken] = token;
  } else {
    env.erase(names::kStoreToken);
  }
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [name, value] : env) out.push_back(name + "=" + value);
  return out;
}

void WorkerGroup::signal(const Worker& worker, int signo) { loop_.signal_group(worker.pid, signo); }

std::size_t WorkerGroup::running_count() const {
  std::size_t n = 0;
  for (const auto& w : workers_) n += w.running ? 1 : 0;
  return n;
}

Worker* WorkerGroup::find(int pid) {
  auto it = pid_to_worker_.find(pid);
  return it == pid_to_worker_.end() ? nullptr : &workers_[it->second];
}

Worker* WorkerGroup::on_exit(const LoopEvent& event) {
  Worker* worker = find(event.pid);
  if (worker == nullptr) return nullptr;
  worker->running = false;
  watch_.exited(worker->local_rank, event.status);
  events_.worker_exited(exit_of(*worker, event.status));
  if (timer_) timer_->forget_pid(worker->pid);
  return worker;
}

void WorkerGroup::record_failure(const Worker& worker, const LoopEvent& event) {
  failures_.push_back(make_failure(worker.local_rank, worker.rank, worker.pid, event.status,
                                   worker.error_file, event.when));
  if (!worker.ended_by_agent.empty()) failures_.back().message = worker.ended_by_agent;
  events_.worker_failed(exit_of(worker, event.status));
  logger_->warn(
      "worker rank {} (local rank {}, pid {}) failed with {}", worker.rank, worker.local_rank,
      worker.pid,
      event.status < 0 ? signal_name(-event.status) : "exit code " + std::to_string(event.status));
}

ExitReason WorkerGroup::exit_reason(const Worker& worker, int status) const {
  if (status == 0) return ExitReason::kSucceeded;
  if (!worker.ended_by_agent.empty()) return ExitReason::kEndedByAgent;
  if (stopping_) return ExitReason::kStopped;
  if (status < 0) return ExitReason::kSignaled;
  return ExitReason::kFailed;
}

WorkerExit WorkerGroup::exit_of(const Worker& worker, int status) const {
  WorkerExit exit;
  exit.rank = worker.rank;
  exit.local_rank = worker.local_rank;
  exit.node = round_->info().group_rank;
  exit.pid = worker.pid;
  exit.status = status;
  exit.reason = exit_reason(worker, status);
  return exit;
}

void WorkerGroup::stop(int signo) {
  if (running_count() > 0) events_.workers_stopping();
  stopping_ = true;
  for (auto& w : workers_) {
    if (w.running) loop_.signal_group(w.pid, signo);
  }
  Clock::time_point deadline = options_.runtime->now() + options_.stop_grace;
  bool killed = false;
  while (running_count() > 0) {
    LoopEvent event = loop_.next_event(killed ? Clock::time_point::max() : deadline);
    if (event.kind == LoopEvent::Kind::kExited) {
      on_exit(event);
    } else if (event.kind == LoopEvent::Kind::kTimeout || event.kind == LoopEvent::Kind::kSignal) {
      if (!killed) {
        logger_->warn(
            "workers still running {} after {}: sending SIGKILL",
            event.kind == LoopEvent::Kind::kTimeout ? "after the grace" : "and a second signal",
            signal_name(signo));
      }
      for (auto& w : workers_) {
        if (w.running) loop_.signal_group(w.pid, SIGKILL);
      }
      killed = true;
    }
  }
  // Leftovers of the workers' process groups (their own children) need
  // nothing more: the loop kills a worker's group when the worker exits,
  // on every path (see WorkerEventLoop).
  stopping_ = false;
}

}  // namespace ddp::agent
