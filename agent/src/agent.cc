#include "ddp/agent/agent.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/agent/failure_report.h"
#include "ddp/common/background.h"
#include "ddp/common/error.h"
#include "ddp/common/logging.h"
#include "ddp/worker_contract/env_names.h"
#include "ddp/worker_contract/worker_contract.h"
#include "file_timer.h"
#include "incident.h"
#include "job_status.h"
#include "progress_watch.h"
#include "safe_file.h"
#include "stack_dump.h"
#include "status_endpoint.h"
#include "worker_control.h"

namespace ddp::agent {
namespace {

namespace fs = std::filesystem;
namespace names = ddp::env_names;

// How often a node that stays past its exit barrier for the others (it
// serves their store) looks whether they are still alive.
constexpr std::chrono::seconds kStayLook{1};

struct Worker {
  int local_rank = 0;
  int rank = 0;
  int pid = 0;
  bool running = false;
  std::string error_file;
  // Why the agent ended it, when it did (a hang): the failure's message.
  std::string ended_by_agent;
  // Kept through the last in-place recovery (a process of an earlier round).
  bool kept = false;
};

// Whether the workers run under a Python interpreter (ddprun's python3 -u, or
// a command naming one): they get PYTHONFAULTHANDLER and SIGABRT on a hang.
bool runs_python(const std::vector<std::string>& argv) {
  return !argv.empty() && fs::path(argv[0]).filename().string().rfind("python", 0) == 0;
}

}  // namespace

class Agent::Impl {
 public:
  Impl(AgentOptions options, RendezvousHandler& rendezvous, ProcessLauncher& launcher)
      : options_(std::move(options)), rdzv_(rendezvous), launcher_(launcher),
        logger_(log::get("ddprun")), watch_(options_.watch, options_.hostname,
                                            rendezvous.params().local_addr, *options_.runtime),
        python_(runs_python(options_.spec.argv)), board_(*options_.runtime) {
    // What a join waits for (more nodes, a spare's place): said once per wait.
    rdzv_.on_wait(
        [](const std::string& line) { std::fprintf(stderr, "ddprun: %s\n", line.c_str()); });
    // The live view's keep-alive ages (a handler of dynamic membership only).
    rdzv_.observe_keep_alives([this](KeepAliveProbe probe) { keep_alives_ = std::move(probe); });
  }

  int run() {
    if (!start_live_view()) return 1;
    const int code = run_job();
    board_.update([&](JobSnapshot& job) {
      set_state(job, code == 0 ? JobState::kSucceeded : JobState::kFailed);
    });
    board_.event(
        code == 0 ? "done" : "failed",
        code == 0 ? "the job succeeded" : "the job ended with exit code " + std::to_string(code));
    status_.reset();
    return code;
  }

  int run_job() {
    say_what_hangs_are_seen();
    if (!options_.watch.timer_file.empty()) {
      try {
        timer_ = std::make_unique<FileTimerServer>(options_.watch.timer_file);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ddprun: cannot serve the file timer: %s\n", e.what());
        return 1;
      }
      logger_->info("serving torch's file timer on {}", timer_->path());
    }
    const int code = run_rounds();
    timer_.reset();
    watch_.end_round();
    if (const std::string scores = watch_.straggler_summary(); !scores.empty()) {
      std::fprintf(stderr, "ddprun: straggler scores of the last round (1.00 = fastest): %s\n",
                   scores.c_str());
    }
    if (code != 0 && !membership_log_.empty()) {
      // What happened to the group, for the failure report.
      std::string text = "ddprun: membership changes during this run:\n";
      for (const auto& line : membership_log_) text += "  " + line + "\n";
      std::fputs(text.c_str(), stderr);
    }
    // Leave the job (heartbeat off, the last agent deletes the job's keys)
    // unless a rendezvous thread was left blocked in the handler; after a
    // signal only for what is left of the short deadline.
    if (!rendezvous_abandoned_) {
      auto budget = options_.announce_timeout;
      if (hurry_until_) {
        budget =
            std::max(std::chrono::milliseconds(0),
                     std::chrono::duration_cast<std::chrono::milliseconds>(*hurry_until_ - now()));
      }
      rdzv_.shutdown(budget);
    }
    return code;
  }

  // A Python program writes no progress pages (it does not link ddp::worker):
  // with an explicit --hang_timeout, says which hangs can be seen and which
  // cannot. (The default, auto, ends no rank of such a program: see on_hang.)
  void say_what_hangs_are_seen() const {
    const auto& timeout = options_.watch.hang_timeout;
    if (!python_ || !timeout || timeout->count() <= 0) return;
    const double s = timeout->count() / 1000.0;
    std::fprintf(stderr,
                 "ddprun: --hang_timeout=%g: Python workers write no progress pages, so the only "
                 "hang ddprun can see is a rank still running %g s after every other rank "
                 "exited 0 (it is ended); a collective that never completes and a rank stuck in "
                 "its own code are not seen (torch's collective timeouts and "
                 "TORCHELASTIC_ENABLE_FILE_TIMER cover those)\n",
                 s, s);
  }

  int restart_count() const { return restart_count_; }

  std::optional<std::uint16_t> status_port() const {
    if (!status_) return std::nullopt;
    return status_->port();
  }

  Clock::time_point now() const { return options_.runtime->now(); }

  bool reported_worker_failure() const { return reported_worker_failure_; }

  const std::vector<std::string>& incident_files() const { return incident_files_; }

 private:
  struct Outcome {
    // kReform: the group's membership changed (a node lost or admitted): the
    // workers are restarted without consuming --max_restarts.
    // kFail: a local failure that must not be restarted (--on_hang=fail).
    // kReformInPlace: the round ended elsewhere (a membership change, or a
    // restart another node asked for) and this node's workers recover in
    // place: they keep running into the next round.
    enum class Kind {
      kDone,
      kBarrierTimeout,
      kRestart,
      kFail,
      kReform,
      kReformInPlace,
      kAbort,
      kStoreLost,
      kSignal
    } kind = Kind::kDone;
    int node = -1;
    int value = 0;
    // kReformInPlace after another node's restart: it spends a restart here too.
    bool spends_restart = false;
  };

  int run_rounds() {
    for (;;) {
      // Cleared as a round ends, not as the next begins: a worker kept for an
      // in-place recovery may fail while the group re-forms.
      failures_.clear();
      std::unique_ptr<Round> round;
      board_.update([](JobSnapshot& job) {
        set_state(job, JobState::kRendezvous);
        job.in_rendezvous = true;
      });
      try {
        if (auto code = next_round(round)) return *code;
      } catch (const ShutdownError& e) {
        // The job ended while this node waited (a spare at max_nodes).
        std::fprintf(stderr, "ddprun: %s; nothing left to do\n", e.what());
        stop_workers(SIGTERM);  // workers kept for an in-place recovery
        return 0;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ddprun: rendezvous failed: %s\n", e.what());
        stop_workers(SIGTERM);
        return 1;
      }
      round_ = std::move(round);
      const RendezvousInfo& info = round_->info();
      ++attempt_;
      on_round_formed(info);
      if (reforming_) {
        reforming_ = false;
        note_membership("re-formed the group as round " + std::to_string(info.round) + ": " +
                        std::to_string(info.group_world_size) +
                        " nodes, WORLD_SIZE=" + std::to_string(info.world_size) +
                        ", this node's group rank " + std::to_string(info.group_rank));
      }
      logger_->info("round {}: group rank {}/{}, ranks {}..{} of {}, master {}:{}", info.round,
                    info.group_rank, info.group_world_size, info.base_rank,
                    info.base_rank + options_.spec.local_world_size - 1, info.world_size,
                    info.master_addr, info.master_port);
      keep_running_workers(std::exchange(keeping_, false));
      note_recovery_round(info);
      last_hang_.clear();
      ended_hung_workers_ = false;
      hang_saw_unreachable_ = false;
      begin_watch();
      Outcome outcome;
      std::unique_ptr<RoundWatch> watch;
      try {
        ProcessLauncher* launcher = &launcher_;
        watch = round_->watch([launcher] { launcher->wake(); });
        board_.update([](JobSnapshot& job) { set_state(job, JobState::kRunning); });
        if (failures_.empty()) {
          start_workers();
          outcome = monitor(*watch);
        } else {
          // A kept worker failed while the group re-formed: in-place recovery
          // falls back to a restart, as a failure of this round.
          logger_->warn(
              "a worker kept for the in-place recovery failed while the group "
              "re-formed: falling back to a restart");
          outcome = fail_round(*watch);
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ddprun: %s\n", e.what());
        auto note = announce(end_of(RoundEnd::Kind::kAbort, 0));
        stop_workers(SIGTERM);
        finish_announcement(note);
        return 1;
      }
      watch.reset();
      watch_.end_round(/*keep_workers=*/outcome.kind == Outcome::Kind::kReformInPlace);
      finish_recovery_report();

      switch (outcome.kind) {
        case Outcome::Kind::kDone:
        case Outcome::Kind::kBarrierTimeout:
          return 0;
        case Outcome::Kind::kSignal:
          return 128 + outcome.value;
        case Outcome::Kind::kAbort:
          if (outcome.value > 0) {
            std::fprintf(stderr, "ddprun: the agent of node %d stopped the job (signal %d)\n",
                         outcome.node, outcome.value);
            return 128 + outcome.value;
          }
          std::fprintf(stderr,
                       "ddprun: the agent of node %d stopped the job (its workers failed and "
                       "may not be restarted)\n",
                       outcome.node);
          return 1;
        case Outcome::Kind::kStoreLost:
          return 1;  // said when it was seen (on_remote_end)
        case Outcome::Kind::kRestart:
        case Outcome::Kind::kFail:
          break;
        case Outcome::Kind::kReform:
          reforming_ = true;
          count_restart(reform_cause_);
          continue;  // a membership change does not consume --max_restarts
        case Outcome::Kind::kReformInPlace:
          reforming_ = true;
          keeping_ = true;
          if (outcome.spends_restart) {
            ++restart_count_;
            count_restart(RestartCause::kWorkerFailure);
          } else {
            count_restart(reform_cause_);
          }
          continue;
      }
      if (outcome.kind == Outcome::Kind::kRestart && restart_count_ < options_.spec.max_restarts) {
        ++restart_count_;
        count_restart(last_hang_.empty() ? RestartCause::kWorkerFailure : RestartCause::kHang);
        logger_->warn("restarting the worker group ({}/{} restarts)", restart_count_,
                      options_.spec.max_restarts);
        continue;
      }
      if (!failures_.empty()) {
        std::string report = format_report(program_name(), failures_, options_.hostname);
        if (!last_hang_.empty()) {
          report +=
              "ddprun: these failures came after the hang reported above: " + last_hang_ + "\n";
        }
        std::fputs(report.c_str(), stderr);
        std::fflush(stderr);
        reported_worker_failure_ = true;
        return exit_code_for(failures_[root_cause(failures_)].exit_code);
      }
      std::fprintf(stderr,
                   "ddprun: the worker group on node %d failed (exit code %d) and no restarts "
                   "are left (--max_restarts=%d)\n",
                   outcome.node, exit_code_for(outcome.value), options_.spec.max_restarts);
      return exit_code_for(outcome.value);
    }
  }

  // Rendezvous blocks in the store for up to join_timeout: it runs on a thread
  // of its own so that a signal (Ctrl-C while waiting for other nodes) is
  // handled at once. Returns an exit code when a signal came first; the
  // rendezvous thread is then left behind, blocked, and the caller must exit
  // the process without destroying the handler (ddprun's main calls _exit).
  // Rethrows the rendezvous error.
  std::optional<int> next_round(std::unique_ptr<Round>& out) {
    // A single node never waits for anyone: no thread, no extra wake-up on the
    // restart path.
    if (rdzv_.params().max_nodes == 1) {
      out = rdzv_.join();
      return std::nullopt;
    }
    struct Shared {
      std::mutex mutex;
      bool done = false;
      std::unique_ptr<Round> round;
      std::exception_ptr error;
    };
    auto shared = std::make_shared<Shared>();
    RendezvousHandler* rdzv = &rdzv_;
    ProcessLauncher* launcher = &launcher_;
    BackgroundCall call(
        [shared, rdzv, launcher] {
          std::unique_ptr<Round> round;
          std::exception_ptr error;
          try {
            round = rdzv->join();
          } catch (...) {
            error = std::current_exception();
          }
          {
            std::lock_guard lock(shared->mutex);
            shared->round = std::move(round);
            shared->error = error;
            shared->done = true;
          }
          launcher->wake();
        },
        *options_.runtime);
    for (;;) {
      LauncherEvent event = launcher_.next_event(Clock::time_point::max());
      if (event.kind == LauncherEvent::Kind::kSignal) {
        rendezvous_abandoned_ = true;  // `call` is abandoned, blocked in the handler
        std::fprintf(stderr, "ddprun: received %s while waiting for the other nodes; exiting\n",
                     signal_name(event.signo).c_str());
        stop_workers(event.signo);  // workers kept for an in-place recovery
        return 128 + event.signo;
      }
      if (event.kind == LauncherEvent::Kind::kExited) {
        // A worker kept for an in-place recovery ended while the group
        // re-forms: a failure of the next round (a restart, when one is left).
        if (Worker* worker = on_exit(event); worker != nullptr && event.status != 0) {
          record_failure(*worker, event);
        }
        continue;
      }
      if (event.kind != LauncherEvent::Kind::kWake) continue;
      std::lock_guard lock(shared->mutex);
      if (shared->done) break;  // other wakes (an old round's watcher) are spurious here
    }
    // Its last act is to wake the launcher: joined, so that it never touches
    // a launcher that is gone.
    call.wait();
    if (shared->error) std::rethrow_exception(shared->error);
    out = std::move(shared->round);
    return std::nullopt;
  }

  std::string program_name() const {
    if (!options_.spec.name.empty()) return options_.spec.name;
    const auto& argv = options_.spec.argv;
    return argv.empty() ? "ddprun" : fs::path(argv[0]).filename().string();
  }

  // This node's end of the round: kind, and the exit code or signal.
  RoundEnd end_of(RoundEnd::Kind kind, int value) const {
    RoundEnd end;
    end.kind = kind;
    end.node = round_->info().group_rank;
    end.value = value;
    return end;
  }

  // This node's end of the round after its workers failed. When it ended hung
  // workers in this round, the end says so ("... hang") once its progress
  // summary carrying the hang is in the store (waiting for that at most the
  // announce timeout): every other node then reads the hang from there before
  // it stops its workers, and reports it, however late its own exchange runs.
  RoundEnd end_of_failure(RoundEnd::Kind kind, int value) {
    RoundEnd end = end_of(kind, value);
    if (!ended_hung_workers_) return end;
    end.hang = watch_.hang_in_store(options_.announce_timeout);
    if (!end.hang) {
      logger_->warn(
          "the hang's progress summary did not reach the store within {} s: the other nodes "
          "may not report it",
          options_.announce_timeout.count() / 1000.0);
    }
    return end;
  }

  // Starts ending the round for every agent (unless another one ended it
  // first) and returns at once: the caller stops its workers meanwhile, then
  // calls finish_announcement().
  std::unique_ptr<PendingEnd> announce(const RoundEnd& end) {
    announce_deadline_ = now() + options_.announce_timeout;
    return round_->end(end);
  }

  // Waits for the announcement up to announce_timeout after it started.
  void finish_announcement(std::unique_ptr<PendingEnd>& note) {
    if (!note) return;
    const std::string error = note->wait_until(announce_deadline_);
    if (!error.empty()) {
      logger_->warn("could not tell the other agents through the rendezvous store within {} s: {}",
                    options_.announce_timeout.count() / 1000.0, error);
    }
    note.reset();
  }

  // "attempt_<n>" for this round's attempt, below run_log_dir.
  std::string attempt_subdir_name() const { return "attempt_" + std::to_string(attempt_ - 1); }

  // "attempt_<n>/<local rank>", below run_log_dir.
  std::string attempt_subdir(int local_rank) const {
    return attempt_subdir_name() + "/" + std::to_string(local_rank);
  }

  // Starts a worker in every local slot without a running one; a worker kept
  // through an in-place recovery is told the new round instead.
  void start_workers() {
    for (int local_rank = 0; local_rank < options_.spec.local_world_size; ++local_rank) {
      if (Worker* kept = running_worker(local_rank)) {
        resume_worker(*kept);
      } else {
        start_worker(local_rank);
      }
    }
  }

  Worker* running_worker(int local_rank) {
    for (auto& w : workers_) {
      if (w.local_rank == local_rank && w.running) return &w;
    }
    return nullptr;
  }

  // A new round begins: the workers of the last one are forgotten, or, when
  // they recover in place, those still running are kept.
  void keep_running_workers(bool keep) {
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

  void start_worker(int local_rank) {
    const WorkerSpec& spec = options_.spec;
    Worker worker;
    worker.local_rank = local_rank;
    worker.rank = round_->info().base_rank + local_rank;
    const std::string dir = options_.run_log_dir + "/" + attempt_subdir(local_rank);
    // The run directory is ddprun's own (main.cc resolved and checked it);
    // below it, never through a symbolic link planted in a shared --log_dir.
    std::error_code ec;
    fs::create_directories(options_.run_log_dir, ec);
    if (int err = detail::make_directories_no_symlinks(options_.run_log_dir,
                                                       attempt_subdir(local_rank))) {
      throw InvalidArgument(
          "agent", "cannot create log directory " + dir + ": " + detail::open_error_text(err));
    }
    worker.error_file = dir + "/error.json";
    fs::remove(worker.error_file, ec);  // a stale file from an earlier run

    ProcessSpec process;
    for (const auto& arg : spec.argv)
      process.argv.push_back(substitute_local_rank(arg, local_rank));
    process.env = worker_env(worker);
    process.local_rank = local_rank;
    process.prefix =
        format_line_prefix(spec.line_prefix_template, spec.role, local_rank, worker.rank);
    const bool on_console = spec.console_ranks.empty() || spec.console_ranks.count(local_rank) > 0;
    const Std redirect = spec.redirects.of(local_rank);
    const Std tee = spec.tee.of(local_rank);
    auto route = [&](Std bit, const char* name) {
      StreamRoute r;
      if (has(redirect, bit) || has(tee, bit)) r.file = dir + "/" + name;
      r.console = on_console && (!has(redirect, bit) || has(tee, bit));
      return r;
    };
    process.out = route(Std::kOut, "stdout.log");
    process.err = route(Std::kErr, "stderr.log");
    if (ProgressPageFile* page = watch_.prepare(local_rank)) {
      process.inherit_fds.push_back(page->fd());
      process.env.push_back(std::string(names::kProgressFd) + "=" + std::to_string(page->fd()));
    }
    const int control_fd = control_.prepare(local_rank);
    process.inherit_fds.push_back(control_fd);
    process.env.push_back(std::string(names::kControlFd) + "=" + std::to_string(control_fd));
    worker.pid = launcher_.launch(process);
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
  std::chrono::milliseconds change_grace() const {
    const RendezvousParams& params = rdzv_.params();
    return std::chrono::duration_cast<std::chrono::milliseconds>(
        params.keep_alive_interval * (params.keep_alive_max_attempt + 1) +
        options_.announce_timeout);
  }

  // What `worker` learns of the round: in its environment when it starts, in
  // its `round` message when it is kept (ddp/worker_contract/worker_contract.h).
  contract::WorkerRound round_of(const Worker& worker) const {
    const RendezvousInfo& info = round_->info();
    contract::WorkerRound round;
    round.round = info.round;
    round.rank = worker.rank;
    round.world_size = info.world_size;
    round.local_rank = worker.local_rank;
    round.local_world_size = options_.spec.local_world_size;
    round.group_rank = info.group_rank;
    round.group_world_size = info.group_world_size;
    round.restart_count = restart_count_;
    round.master_addr = info.master_addr;
    round.master_port = info.master_port;
    round.store_addr = info.store_addr;
    round.store_port = info.store_port;
    round.store_prefix = info.worker_prefix;
    round.change_grace = change_grace();
    return round;
  }

  // Tells a kept worker the round it is in now (ddp::reform() waits for it).
  void resume_worker(Worker& worker) {
    worker.rank = round_->info().base_rank + worker.local_rank;
    const contract::WorkerRound round = round_of(worker);
    control_.expect_reform(worker.local_rank, round.round);
    tell(worker, contract::encode(round));
    watch_.kept(worker.local_rank, worker.rank);
  }

  // Sends `message` to a running worker on its control channel, never waiting
  // for it to read. A worker whose channel is full (it has not read what it
  // was told before), or that cannot be told (refused), is a failed worker:
  // ended with SIGKILL, its failure saying why. A closed channel is a worker
  // on its way out: its exit says the rest.
  control::Sent tell(Worker& worker, const control::Message& message) {
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
    std::fprintf(stderr, "ddprun: %s\n", worker.ended_by_agent.c_str());
    launcher_.signal_group(worker.pid, SIGKILL);
    return sent;
  }

  std::vector<std::string> worker_env(const Worker& worker) const {
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
    env[names::kUseAgentStore] = "False";
    env[names::kErrorFile] = worker.error_file;
    if (env.find(names::kNcclAsyncErrorHandling) == env.end())
      env[names::kNcclAsyncErrorHandling] = "1";
    if (options_.set_omp_num_threads && env.find(names::kOmpNumThreads) == env.end()) {
      env[names::kOmpNumThreads] = "1";
    }
    if (timer_) env["TORCHELASTIC_TIMER_FILE"] = timer_->path();
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

  std::size_t running_count() const {
    std::size_t n = 0;
    for (const auto& w : workers_) n += w.running ? 1 : 0;
    return n;
  }

  // Marks the exited worker; returns it (or null when the pid is not ours).
  Worker* on_exit(const LauncherEvent& event) {
    auto it = pid_to_worker_.find(event.pid);
    if (it == pid_to_worker_.end()) return nullptr;
    Worker& worker = workers_[it->second];
    worker.running = false;
    watch_.exited(worker.local_rank, event.status);
    count_exit(worker, event.status);
    if (timer_) timer_->forget_pid(worker.pid);
    return &worker;
  }

  void record_failure(const Worker& worker, const LauncherEvent& event) {
    failures_.push_back(make_failure(worker.local_rank, worker.rank, worker.pid, event.status,
                                     worker.error_file, event.when));
    if (!worker.ended_by_agent.empty()) failures_.back().message = worker.ended_by_agent;
    board_.event("worker_failed",
                 fmt::format("rank {} (node {}, pid {}) failed with {}", worker.rank,
                             round_->info().group_rank, worker.pid,
                             event.status < 0 ? signal_name(-event.status)
                                              : "exit code " + std::to_string(event.status)));
    logger_->warn("worker rank {} (local rank {}, pid {}) failed with {}", worker.rank,
                  worker.local_rank, worker.pid,
                  event.status < 0 ? signal_name(-event.status)
                                   : "exit code " + std::to_string(event.status));
  }

  // Whether the agent looks at its workers periodically.
  bool ticking() const {
    return watch_.active() || timer_ != nullptr || status_ != nullptr ||
           (recovery_ && !recovery_->reported);
  }

  // When the next look at the workers' progress is due (never when off). The
  // file timer is served at torchrun's pace (100 ms).
  Clock::time_point next_tick() const {
    if (timer_)
      return now() + std::min<std::chrono::milliseconds>(options_.watch.tick,
                                                         std::chrono::milliseconds(100));
    return ticking() ? now() + options_.watch.tick : Clock::time_point::max();
  }

  Outcome monitor(const RoundWatch& watch) {
    while (running_count() > 0) {
      LauncherEvent event = launcher_.next_event(next_tick());
      switch (event.kind) {
        case LauncherEvent::Kind::kExited: {
          Worker* worker = on_exit(event);
          if (worker == nullptr || event.status == 0) break;
          record_failure(*worker, event);
          return fail_round(watch);
        }
        case LauncherEvent::Kind::kSignal:
          return on_signal(event.signo);
        case LauncherEvent::Kind::kWake: {
          auto outcome = on_remote_end(watch);
          if (outcome) return *outcome;
          break;
        }
        case LauncherEvent::Kind::kTimeout:
          look_at_progress();
          break;
      }
    }
    return exit_barrier(watch);
  }

  // A local worker failed: collect the failures that already happened (several
  // workers often die of the same cause at once), tell the other agents, stop
  // the rest. Exits after our SIGTERM are reactions to it, not failures.
  Outcome fail_round(const RoundWatch& watch) {
    std::optional<int> signal;
    for (;;) {
      LauncherEvent event = launcher_.next_event(now());
      if (event.kind == LauncherEvent::Kind::kTimeout) break;
      if (event.kind == LauncherEvent::Kind::kSignal && !signal) signal = event.signo;
      if (event.kind != LauncherEvent::Kind::kExited) continue;
      Worker* worker = on_exit(event);
      if (worker != nullptr && event.status != 0) record_failure(*worker, event);
    }
    if (signal) return on_signal(*signal);
    if (auto outcome = membership_change_behind(watch)) return *outcome;
    const auto& first = failures_[root_cause(failures_)];
    if (fail_without_restart_) {
      // --on_hang=fail: the job ends; the other agents stop theirs.
      auto note = announce(end_of_failure(RoundEnd::Kind::kAbort, 0));
      stop_workers(SIGTERM);
      finish_announcement(note);
      return Outcome{Outcome::Kind::kFail, round_->info().group_rank, first.exit_code};
    }
    auto note = announce(end_of_failure(RoundEnd::Kind::kRestart, first.exit_code));
    stop_workers(SIGTERM);
    finish_announcement(note);
    return Outcome{Outcome::Kind::kRestart, round_->info().group_rank, first.exit_code};
  }

  // A local worker failed. When a node of an elastic group dies, its peers'
  // collectives fail at once, long before its keep-alives are missed: if the
  // handler cannot see every member alive, wait (workers stopped) for the
  // round's watch to tell, so that a lost node re-forms the group instead of
  // spending a restart. Nullopt: a worker failure after all.
  std::optional<Outcome> membership_change_behind(const RoundWatch& watch) {
    if (!watch.ended() && !failure_is_our_hang_action()) {
      const auto grace = round_->grace_for_membership_change();
      if (grace.count() <= 0) return std::nullopt;
      logger_->warn(
          "a worker failed and a node of the group is silent: waiting up to {} s for "
          "the group's verdict",
          grace.count() / 1000.0);
      stop_workers(SIGTERM);
      const Clock::time_point until = now() + grace;
      while (!watch.ended()) {
        LauncherEvent event = launcher_.next_event(until);
        if (event.kind == LauncherEvent::Kind::kTimeout) break;
        if (event.kind == LauncherEvent::Kind::kSignal) return on_signal(event.signo);
        if (event.kind == LauncherEvent::Kind::kExited) on_exit(event);
      }
    }
    // A lost or joining node re-forms the group; another node's restart or
    // abort is followed as it would be without our failure.
    return on_remote_end(watch);
  }

  // Whether this round's failure is the hang this agent acted on: its root
  // cause is a worker the agent ended over a hang found while every other
  // node's summary was current (none unreachable). No lost node is behind
  // that, and the grace (up to 1.5 keep-alive intervals: several seconds
  // before the other nodes learn of the round's end) would only delay them.
  bool failure_is_our_hang_action() const {
    if (failures_.empty() || !ended_hung_workers_ || hang_saw_unreachable_) return false;
    const ProcessFailure& first = failures_[root_cause(failures_)];
    auto it = pid_to_worker_.find(first.pid);
    return it != pid_to_worker_.end() && !workers_[it->second].ended_by_agent.empty();
  }

  Outcome on_signal(int signo) {
    logger_->warn("received {}: stopping the workers", signal_name(signo));
    auto note = announce(end_of(RoundEnd::Kind::kAbort, signo));
    hurry_until_ = now() + options_.announce_timeout;
    stop_workers(signo);
    finish_announcement(note);
    return Outcome{Outcome::Kind::kSignal, round_->info().group_rank, signo};
  }

  // The round ended elsewhere: another agent (or we) ended it, or the store was lost.
  std::optional<Outcome> on_remote_end(const RoundWatch& watch) {
    auto ended = watch.ended();
    if (!ended) return std::nullopt;
    const RoundEnd& end = *ended;
    if (end.kind == RoundEnd::Kind::kRestart || end.kind == RoundEnd::Kind::kAbort) {
      // Another node may have ended the round over a hang it found first (a
      // membership change never comes from one: no look, no delay there).
      // When its end says so, its summary carries the hang: wait for this
      // node's read of the store (up to the announce timeout) rather than
      // take what the last exchange brought.
      const auto wait = end.hang ? options_.announce_timeout : std::chrono::milliseconds(500);
      if (auto verdict = watch_.last_look(wait)) {
        on_hang(*verdict);
      } else if (end.hang && !watch_.reported()) {
        logger_->warn(
            "node {} ended the round over a hang, but no progress summary carrying it could be "
            "read within {} s",
            end.node, wait.count() / 1000.0);
      }
    }
    switch (end.kind) {
      case RoundEnd::Kind::kRestart:
        if (auto kept = keep_workers_through(end)) {
          note_membership(describe(end) + "; this node's workers recover in place");
          return *kept;
        }
        logger_->warn("node {} asked for a restart: stopping the workers", end.node);
        stop_workers(SIGTERM);
        return Outcome{Outcome::Kind::kRestart, end.node, end.value};
      case RoundEnd::Kind::kAbort:
        stop_workers(SIGTERM);
        return Outcome{Outcome::Kind::kAbort, end.node, end.value};
      case RoundEnd::Kind::kDone:
        return std::nullopt;  // only meaningful at the exit barrier
      case RoundEnd::Kind::kNodeLost:
      case RoundEnd::Kind::kNodeJoined:
        note_membership_change(end);
        if (auto kept = keep_workers_through(end)) {
          note_membership(describe(end) + "; the workers recover in place");
          return *kept;
        }
        note_membership(describe(end) + "; stopping the workers to re-form the group");
        stop_workers(SIGTERM);
        return Outcome{Outcome::Kind::kReform, end.node, 0};
      case RoundEnd::Kind::kStoreLost:
        // Nobody can tell this node how the round goes on: it stops its workers.
        std::fprintf(stderr, "ddprun: %s; stopping this node's workers\n", describe(end).c_str());
        stop_workers(SIGTERM);
        return Outcome{Outcome::Kind::kStoreLost};
    }
    return std::nullopt;
  }

  // In-place recovery: when every local worker runs and said it recovers in
  // place, each is told that its round ended (its collectives fail at once)
  // and keeps running into the next round. Nullopt: the workers are stopped
  // and started again as usual (also after another node's restart when no
  // restarts are left).
  std::optional<Outcome> keep_workers_through(const RoundEnd& end) {
    control_.poll();
    if (workers_.empty()) return std::nullopt;
    for (const auto& w : workers_) {
      if (!w.running || !control_.in_place(w.local_rank)) return std::nullopt;
    }
    const bool restart = end.kind == RoundEnd::Kind::kRestart;
    if (restart && restart_count_ >= options_.spec.max_restarts) return std::nullopt;
    const control::Message abort =
        contract::encode(contract::Abort{round_->info().round, describe(end)});
    bool failed = false;
    for (auto& w : workers_) {
      const control::Sent sent = tell(w, abort);
      failed = failed || sent == control::Sent::kFull || sent == control::Sent::kRefused;
    }
    if (failed) {
      logger_->warn("a worker could not be told that its round ended: stopping the workers");
      return std::nullopt;
    }
    recovery_ = Recovery{};
    recovery_->from_round = round_->info().round;
    recovery_->why = describe(end);
    recovery_->verdict = now();
    recovery_->node_lost = end.kind == RoundEnd::Kind::kNodeLost;
    board_.event("in_place",
                 "keeping the workers through the re-form (in-place recovery): " + recovery_->why);
    Outcome outcome{Outcome::Kind::kReformInPlace, end.node, end.value};
    outcome.spends_restart = restart;
    return outcome;
  }

  // The new round formed with workers kept from the last one.
  void note_recovery_round(const RendezvousInfo& info) {
    if (!recovery_) return;
    recovery_->to_round = info.round;
    recovery_->formed = now();
  }

  // Prints how the in-place recovery went, once every kept worker reported
  // its state transfer (or, with `final`, whatever was reported by the end
  // of the round).
  void report_recovery(bool final) {
    if (!recovery_ || !recovery_->formed || recovery_->reported) return;
    control_.poll();
    double build = 0;
    double state_seconds = 0;
    std::int64_t state_bytes = 0;
    int root = -1;
    std::size_t reformed = 0;
    std::size_t synced = 0;
    std::size_t kept = 0;
    for (const auto& w : workers_) {
      if (!w.kept) continue;
      ++kept;
      if (auto r = control_.reformed(w.local_rank)) {
        ++reformed;
        build = std::max(build, r->build_seconds);
      }
      if (auto st = control_.synced(w.local_rank)) {
        ++synced;
        state_seconds = std::max(state_seconds, st->seconds);
        state_bytes = std::max(state_bytes, st->bytes);
        root = st->root;
      }
    }
    if (!final && synced < kept) return;
    recovery_->reported = true;
    const Recovery& r = *recovery_;
    const double rendezvous = std::chrono::duration<double>(*r.formed - r.verdict).count();
    std::string text = fmt::format("in-place recovery from round {} ({})", r.from_round, r.why);
    if (r.node_lost) {
      const auto& params = rdzv_.params();
      text += fmt::format(": verdict after {:.1f} s without keep-alives",
                          std::chrono::duration<double>(params.keep_alive_interval).count() *
                              params.keep_alive_max_attempt);
    }
    text += fmt::format("; round {} formed {:.2f} s after the verdict", r.to_round, rendezvous);
    if (reformed > 0) text += fmt::format("; groups re-formed in {:.3f} s", build);
    if (synced > 0) {
      text += fmt::format("; state {:.1f} MiB from rank {} in {:.3f} s", state_bytes / 1048576.0,
                          root, state_seconds);
    } else {
      text += "; no state transfer reported";
    }
    text += fmt::format("; {} of {} workers kept", kept, options_.spec.local_world_size);
    std::fprintf(stderr, "ddprun: %s\n", text.c_str());
    board_.event("recovered", text);
  }

  void finish_recovery_report() {
    report_recovery(/*final=*/true);
    if (recovery_ && recovery_->formed) recovery_.reset();
  }

  Outcome exit_barrier(const RoundWatch& watch) {
    if (round_->info().group_world_size <= 1) return Outcome{Outcome::Kind::kDone};
    try {
      round_->arrive_at_exit_barrier(now() + options_.announce_timeout);
    } catch (const std::exception& e) {
      logger_->error("exit barrier: {}", e.what());
      return Outcome{Outcome::Kind::kBarrierTimeout};
    }
    const Deadline deadline(options_.exit_barrier_timeout);
    // Past the deadline, a node that serves the store others still use stays,
    // and looks again every kStayLook whether they still need it.
    bool staying = false;
    Clock::time_point look = deadline.when();
    for (;;) {
      if (auto end = watch.ended()) {
        if (end->kind == RoundEnd::Kind::kDone) return Outcome{Outcome::Kind::kDone};
        if (end->kind == RoundEnd::Kind::kStoreLost) {
          // The store went away after we arrived: its host only leaves once
          // every agent passed the barrier.
          logger_->info("exit barrier: store gone ({}); the job is done", end->detail);
          return Outcome{Outcome::Kind::kDone};
        }
        if (auto outcome = on_remote_end(watch)) return *outcome;
      }
      LauncherEvent event = launcher_.next_event(std::min(look, next_tick()));
      if (event.kind == LauncherEvent::Kind::kTimeout && ticking() && now() < look) {
        // Still waiting for the others: keep this node's summary going out
        // (a rank elsewhere may not exit) and report what is seen.
        look_at_progress();
        continue;
      }
      if (event.kind == LauncherEvent::Kind::kTimeout) {
        if (round_->needed_by_others()) {
          if (!staying) {
            std::fprintf(stderr,
                         "ddprun: exit barrier: not every node finished within %g s; this node "
                         "serves the rendezvous store that the others still use, so it stays "
                         "until they finish or are gone\n",
                         options_.exit_barrier_timeout.count() / 1000.0);
            staying = true;
          }
          look = now() + kStayLook;
          continue;
        }
        if (staying) {
          std::fprintf(stderr,
                       "ddprun: exit barrier: the nodes still running show no sign of life; "
                       "leaving\n");
        } else {
          logger_->warn("exit barrier: not every agent finished within {} s; exiting anyway",
                        options_.exit_barrier_timeout.count() / 1000.0);
        }
        return Outcome{Outcome::Kind::kBarrierTimeout};
      }
      if (event.kind == LauncherEvent::Kind::kSignal) {
        hurry_until_ = now() + options_.announce_timeout;
        auto note = announce(end_of(RoundEnd::Kind::kAbort, event.signo));
        finish_announcement(note);
        return Outcome{Outcome::Kind::kSignal, round_->info().group_rank, event.signo};
      }
    }
  }

  // Sends `signo` to every running worker's process group, SIGKILL after the
  // grace, and waits until all have exited. A second handled signal escalates
  // to SIGKILL at once.
  void stop_workers(int signo) {
    if (running_count() > 0) {
      board_.update([](JobSnapshot& job) { set_state(job, JobState::kStopping); });
    }
    stopping_ = true;
    for (auto& w : workers_) {
      if (w.running) launcher_.signal_group(w.pid, signo);
    }
    Clock::time_point deadline = now() + options_.stop_grace;
    bool killed = false;
    while (running_count() > 0) {
      LauncherEvent event = launcher_.next_event(killed ? Clock::time_point::max() : deadline);
      if (event.kind == LauncherEvent::Kind::kExited) {
        on_exit(event);
      } else if (event.kind == LauncherEvent::Kind::kTimeout ||
                 event.kind == LauncherEvent::Kind::kSignal) {
        if (!killed) {
          logger_->warn("workers still running {} after {}: sending SIGKILL",
                        event.kind == LauncherEvent::Kind::kTimeout ? "after the grace"
                                                                    : "and a second signal",
                        signal_name(signo));
        }
        for (auto& w : workers_) {
          if (w.running) launcher_.signal_group(w.pid, SIGKILL);
        }
        killed = true;
      }
    }
    // Leftovers of the workers' process groups (their own children) need
    // nothing more: the launcher kills a worker's group when the worker exits,
    // on every path (see ProcessLauncher).
    stopping_ = false;
  }

  // A new round's progress watch: its summaries go through a store handle of
  // their own (the exchange blocks in it on its own thread).
  void begin_watch() {
    if (watch_.active() && round_->info().group_world_size > 1 && !progress_store_) {
      try {
        progress_store_ = rdzv_.open_store();  // one for the whole run
      } catch (const std::exception& e) {
        logger_->warn("progress summaries stay on this node (no store handle: {})", e.what());
      }
    }
    watch_.begin_round(round_->info(), options_.spec.local_world_size,
                       round_->info().group_world_size > 1 ? progress_store_ : nullptr);
  }

  // One look at every rank's progress; acts on a hang found.
  void look_at_progress() {
    report_recovery(/*final=*/false);
    if (timer_) serve_file_timer();
    if (watch_.active()) {
      auto verdict = watch_.check();
      if (verdict) on_hang(*verdict);
    }
    refresh_board();
  }

  // torch's file timer: requests from our running workers only; an expired
  // scope gets its worker signalled as torch's FileTimerServer does (the
  // worker's pid, the earliest expired scope's signal; then all its timers go).
  void serve_file_timer() {
    std::set<int> pids;
    for (const auto& w : workers_) {
      if (w.running) pids.insert(w.pid);
    }
    try {
      timer_->drain(pids);
    } catch (const std::exception& e) {
      logger_->warn("file timer: {}", e.what());
    }
    for (const Reap& reap : plan_reaps(timer_->take_expired(options_.runtime->wall_now()))) {
      // torch clears every timer of a reaped pid, expired or not.
      timer_->forget_pid(reap.pid);
      auto it = pid_to_worker_.find(reap.pid);
      if (it == pid_to_worker_.end() || !workers_[it->second].running) continue;
      Worker& worker = workers_[it->second];
      // torch logs this line at its default level: so does ddprun.
      std::fprintf(stderr, "ddprun: Reaping worker_pid=[%d]. Expired timers: [%s]\n", reap.pid,
                   fmt::format("{}", fmt::join(reap.scopes, ", ")).c_str());
      if (!reap.signal_from) {
        logger_->info("No signal specified with worker=[{}]. Do not reap it.", reap.pid);
        continue;
      }
      const ExpiredTimer& first = *reap.signal_from;
      worker.ended_by_agent = "the file timer of scope '" + first.scope_id +
                              "' expired (torch.distributed.elastic.timer.expires): ddprun sent " +
                              signal_name(first.signal);
      std::fprintf(stderr,
                   "ddprun: timer of scope '%s' expired on rank %d (local rank %d, pid %d): "
                   "sending %s\n",
                   first.scope_id.c_str(), worker.rank, worker.local_rank, reap.pid,
                   signal_name(first.signal).c_str());
      ::kill(reap.pid, first.signal);  // our unreaped child: the pid cannot be reused
    }
  }

  // A hang: every node reports it; the culprits' node collects their stacks
  // and ends them (SIGABRT for Python, so that faulthandler prints their
  // tracebacks; SIGKILL otherwise). Their exits are then failures like any
  // other: --on_hang=restart spends a restart, fail ends the job.
  void on_hang(const ProgressWatch::Verdict& verdict) {
    last_hang_ = verdict.hang.summary;
    std::vector<Worker*> culprits;
    for (int local_rank : verdict.report_only ? std::vector<int>{} : verdict.local_culprits) {
      for (auto& w : workers_) {
        if (w.local_rank == local_rank && w.running) culprits.push_back(&w);
      }
    }
    const std::string path = report_incident(incident_of(verdict, culprits));
    note_incident(verdict, path);
    if (culprits.empty()) return;
    ended_hung_workers_ = true;
    hang_saw_unreachable_ = !verdict.unreachable.empty();
    if (options_.watch.on_hang == WatchOptions::OnHang::kFail) fail_without_restart_ = true;
    for (Worker* w : culprits) {
      w->ended_by_agent = "ended by ddprun after a hang: " + verdict.hang.summary +
                          (path.empty() ? std::string() : " (incident: " + path + ")");
      launcher_.signal_group(w->pid, python_ ? SIGABRT : SIGKILL);
    }
  }

  // The incident as this node sees it, with the stacks of its culprits.
  Incident incident_of(const ProgressWatch::Verdict& verdict,
                       const std::vector<Worker*>& culprits) const {
    Incident incident;
    incident.hang = verdict.hang;
    incident.timeout = verdict.timeout;
    incident.node = round_->info().group_rank;
    incident.host = options_.hostname;
    incident.round = round_->info().round;
    incident.attempt = attempt_ - 1;
    incident.ranks = watch_.ranks();
    incident.unreachable = verdict.unreachable;
    for (const auto& line : verdict.disputed) incident.notes.push_back("not ended: " + line);
    if (verdict.report_only) {
      incident.action = fmt::format(
          "none: reported only ({} may still be working, and the default --hang_timeout=auto "
          "ends no such rank; give --hang_timeout=SECONDS to end it)",
          verdict.hang.kind == Hang::Kind::kNotExiting ? "a rank that does not exit"
                                                       : "ranks that are all in their own code");
    } else if (culprits.empty()) {
      incident.action = verdict.hang.culprits.empty() ? "none: no culprit could be named"
                        : !verdict.disputed.empty()
                            ? "none: this node's own records do not confirm the hang"
                            : "none on this node: the culprit's node ends it";
    } else if (options_.watch.on_hang == WatchOptions::OnHang::kFail) {
      incident.action = "fail (--on_hang=fail)";
    } else {
      incident.action = restart_count_ < options_.spec.max_restarts
                            ? "restart (--on_hang=restart)"
                            : "fail (--on_hang=restart, but no restarts are left)";
    }
    for (const Worker* w : culprits) {
      StackDump dump = collect_native_stacks(w->pid, options_.watch.stack_timeout);
      incident.stacks[w->rank] = Incident::Stacks{dump.tool, dump.text, dump.error};
      if (python_) {
        incident.notes.push_back("rank " + std::to_string(w->rank) +
                                 " is a Python worker: ended with SIGABRT, its faulthandler "
                                 "prints every thread's Python traceback into its log");
      }
    }
    return incident;
  }

  // Writes the incident file and prints the report; returns the file's path
  // (empty when it could not be written).
  std::string report_incident(const Incident& incident) {
    const std::string path =
        write_incident(options_.run_log_dir + "/" + attempt_subdir_name(), incident);
    std::string text = format_incident(incident);
    if (!path.empty()) {
      text += "ddprun: incident written to " + path + "\n";
      incident_files_.push_back(path);
    }
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
    return path;
  }

  // ---- the live view (--status_port) ------------------------------------------------------

  // Fills the board's facts and starts the endpoint when asked for; false
  // (after saying why) when it cannot listen.
  bool start_live_view() {
    const RendezvousParams& params = rdzv_.params();
    board_.update([&](JobSnapshot& job) {
      JobFacts& f = job.facts;
      f.run_id = params.run_id;
      f.backend = rdzv_.backend();
      f.host = options_.hostname;
      f.addr = params.local_addr;
      f.pid = static_cast<int>(::getpid());
      f.min_nodes = params.min_nodes;
      f.max_nodes = params.max_nodes;
      f.nproc_per_node = options_.spec.local_world_size;
      f.max_restarts = options_.spec.max_restarts;
      f.started = now();
      set_state(job, JobState::kRendezvous);
    });
    if (!options_.status.port) return true;
    try {
      status_ = std::make_unique<StatusEndpoint>(options_.status, rdzv_.store_token(), board_,
                                                 stuck_after(options_));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ddprun: cannot serve the live view (--status_port): %s\n", e.what());
      return false;
    }
    // Printed whatever the log level: with --status_port=0 it is how one learns the port.
    std::fprintf(stderr, "ddprun: live view at %s (/metrics, /status, /livez, /readyz)%s\n",
                 status_->url().c_str(),
                 status_->token_required() ? "; clients must carry the store's token" : "");
    return true;
  }

  void on_round_formed(const RendezvousInfo& info) {
    RoundStatus r;
    r.number = info.round;
    r.attempt = attempt_ - 1;  // its attempt_<n> log directory
    r.world_size = info.world_size;
    r.group_world_size = info.group_world_size;
    r.group_rank = info.group_rank;
    r.base_rank = info.base_rank;
    r.formed = now();
    board_.update([&](JobSnapshot& job) {
      job.round = r;
      ++job.rounds_formed;
      job.in_rendezvous = false;
      job.members.clear();
      job.ranks.clear();
      job.scores.clear();
      job.stragglers.clear();
    });
    board_.event(
        "round_formed",
        fmt::format("round {} formed: {} node{}, world size {}; this node is node {}", info.round,
                    info.group_world_size, info.group_world_size == 1 ? "" : "s", info.world_size,
                    info.group_rank));
    refresh_board();
  }

  // The current round's members as the agent knows them now, by group rank.
  std::vector<MemberStatus> round_members() const {
    const RendezvousInfo& info = round_->info();
    std::vector<MemberStatus> members;
    MemberStatus self;
    self.node = info.group_rank;
    self.host = options_.hostname;
    self.addr = rdzv_.params().local_addr;
    for (int i = 0; i < options_.spec.local_world_size; ++i)
      self.ranks.push_back(info.base_rank + i);
    self.state = "self";
    self.last_heard = Millis(0);
    members.push_back(std::move(self));
    const auto keep_alive = keep_alives_ ? keep_alives_() : std::nullopt;
    for (const auto& seen : watch_.nodes()) {
      MemberStatus m;
      m.node = seen.node;
      m.host = seen.host;
      m.addr = seen.addr;
      for (const auto& r : watch_.ranks()) {
        if (r.node == seen.node) m.ranks.push_back(r.rank);
      }
      m.state = !seen.heard ? "silent" : seen.stale ? "unreachable" : "alive";
      if (seen.heard) m.last_heard = seen.age;
      if (keep_alive && keep_alive->group_rank == seen.node) {
        m.keep_alive_age = keep_alive->age;
        m.lost_after = keep_alive->lost_after;
      }
      if (lost_nodes_.count(seen.node) > 0) m.state = "lost";
      members.push_back(std::move(m));
    }
    std::sort(members.begin(), members.end(),
              [](const auto& a, const auto& b) { return a.node < b.node; });
    return members;
  }

  // What the agent knows now of every member and rank of the round.
  void refresh_board() {
    if (!round_) return;
    std::vector<MemberStatus> members = round_members();
    for (const auto& gone : departed_) members.push_back(gone);
    std::vector<int> stragglers(watch_.stragglers().begin(), watch_.stragglers().end());
    for (int rank : watch_.take_new_stragglers()) {
      board_.event("straggler",
                   fmt::format("rank {} is a straggler (score {:.2f})", rank,
                               watch_.scores().count(rank) > 0 ? watch_.scores().at(rank) : 0.0));
    }
    board_.update([&](JobSnapshot& job) {
      job.members = std::move(members);
      job.ranks = watch_.ranks();
      job.scores = watch_.scores();
      job.stragglers = std::move(stragglers);
    });
  }

  // A node was declared lost or asked to join: the board shows it at once.
  void note_membership_change(const RoundEnd& end) {
    if (end.kind == RoundEnd::Kind::kNodeLost) {
      reform_cause_ = RestartCause::kNodeLost;
      lost_nodes_.insert(end.node);
      // It stays listed as lost once the next round forms without it.
      std::string host;
      for (const auto& m : round_members()) {
        if (m.node != end.node) continue;
        lost_members_.push_back(m);
        lost_members_.back().state = "lost";
        if (!m.host.empty()) host = " (" + m.host + ")";
      }
      refresh_board();
      board_.event("node_lost",
                   fmt::format("node {}{} was declared lost: {}", end.node, host, describe(end)));
    } else {
      reform_cause_ = RestartCause::kNodeJoined;
      board_.event("node_joined", describe(end));
    }
  }

  void count_restart(RestartCause cause) {
    board_.update([&](JobSnapshot& job) {
      ++job.restarts[cause];
      job.restarts_spent = restart_count_;
      set_state(job, JobState::kRestarting);
    });
    if (cause == RestartCause::kWorkerFailure || cause == RestartCause::kHang) {
      board_.event("restart", fmt::format("restarting the worker group ({}/{} restarts{})",
                                          restart_count_, options_.spec.max_restarts,
                                          cause == RestartCause::kHang ? ", after a hang" : ""));
    } else {
      board_.event("restart", std::string("re-forming the group after a node ") +
                                  (cause == RestartCause::kNodeLost ? "was lost" : "joined"));
    }
    // The round is over: its lost members are now listed after the next round's.
    for (auto& m : lost_members_) departed_.push_back(std::move(m));
    while (departed_.size() > 16) departed_.erase(departed_.begin());
    lost_members_.clear();
    lost_nodes_.clear();
  }

  void count_exit(const Worker& worker, int status) {
    ExitReason reason = ExitReason::kFailed;
    if (status == 0) {
      reason = ExitReason::kSucceeded;
    } else if (!worker.ended_by_agent.empty()) {
      reason = ExitReason::kEndedByAgent;
    } else if (stopping_) {
      reason = ExitReason::kStopped;
    } else if (status < 0) {
      reason = ExitReason::kSignaled;
    }
    board_.update([&](JobSnapshot& job) { ++job.exits[reason]; });
  }

  void note_incident(const ProgressWatch::Verdict& verdict, const std::string& path) {
    IncidentStatus incident;
    incident.hang_kind = to_string(verdict.hang.kind);
    incident.summary = verdict.hang.summary;
    incident.culprits = verdict.hang.culprits;
    incident.node = verdict.hang.found_by;
    incident.wall = std::chrono::system_clock::to_time_t(options_.runtime->wall_now());
    incident.file = path;
    board_.update([&](JobSnapshot& job) {
      ++job.hangs;
      job.incident = incident;
    });
    board_.event("hang", "hang (" + incident.hang_kind + "): " + incident.summary);
  }

  // Logs a membership change with its wall-clock time and keeps it for the report.
  void note_membership(const std::string& what) {
    const std::time_t now = std::time(nullptr);
    char when[32];
    std::strftime(when, sizeof(when), "%H:%M:%S", std::localtime(&now));
    std::string line = std::string(when) + " " + what;
    std::fprintf(stderr, "ddprun: %s\n", line.c_str());
    membership_log_.push_back(std::move(line));
  }

  AgentOptions options_;
  RendezvousHandler& rdzv_;
  ProcessLauncher& launcher_;
  std::shared_ptr<spdlog::logger> logger_;
  // The round this node runs in (null before the first).
  std::unique_ptr<Round> round_;
  KeepAliveProbe keep_alives_;  // null: the handler shows none
  int restart_count_ = 0;
  // Rounds this agent ran workers in (attempt_<n> log directories).
  int attempt_ = 0;
  bool reforming_ = false;
  std::vector<std::string> membership_log_;
  std::vector<Worker> workers_;
  std::map<int, std::size_t> pid_to_worker_;
  std::vector<ProcessFailure> failures_;
  // When the current announcement is given up.
  Clock::time_point announce_deadline_{};
  // Set once a signal asked the agent to leave: the end of its short deadline.
  std::optional<Clock::time_point> hurry_until_;
  // A rendezvous thread was left blocked in the handler (a signal came first).
  bool rendezvous_abandoned_ = false;
  // run() printed a failure report of this node's workers.
  bool reported_worker_failure_ = false;
  // Progress, hangs and stragglers of the workers (and the other nodes').
  ProgressWatch watch_;
  // The workers run under Python.
  const bool python_;
  // A hang under --on_hang=fail: the next failure ends the job.
  bool fail_without_restart_ = false;
  // The progress summaries' store handle (opened by the first multi-node round).
  std::shared_ptr<Store> progress_store_;
  // Every incident file written.
  std::vector<std::string> incident_files_;
  // The summary of the hang found in this round, if any.
  std::string last_hang_;
  // This node ended hung workers in this round (its end of the round says so),
  // and whether some node was unreachable when it found the hang.
  bool ended_hung_workers_ = false;
  bool hang_saw_unreachable_ = false;
  // torch's file timer, when TORCHELASTIC_ENABLE_FILE_TIMER=1.
  std::unique_ptr<FileTimerServer> timer_;
  // The live view: what the agent knows, and its endpoint (--status_port).
  JobBoard board_;
  std::unique_ptr<StatusEndpoint> status_;
  // Workers are being stopped (their exits are not failures of their own).
  bool stopping_ = false;
  // Why the current round re-forms; nodes declared lost in it; members of
  // earlier rounds that were lost (listed until the job ends, at most 16).
  RestartCause reform_cause_ = RestartCause::kNodeLost;
  std::set<int> lost_nodes_;
  std::vector<MemberStatus> lost_members_;  // of the current round, as last seen
  std::vector<MemberStatus> departed_;
  // The workers' control channels (in-place recovery).
  WorkerControl control_;
  // The round ended with this node's workers recovering in place: the next
  // round keeps them.
  bool keeping_ = false;
  // The in-place recovery in progress, for its report.
  struct Recovery {
    int from_round = 0;
    int to_round = 0;
    std::string why;
    bool node_lost = false;
    Clock::time_point verdict{};
    std::optional<Clock::time_point> formed;
    bool reported = false;
  };
  std::optional<Recovery> recovery_;
};

Agent::Agent(AgentOptions options, RendezvousHandler& rendezvous, ProcessLauncher& launcher)
    : impl_(std::make_unique<Impl>(std::move(options), rendezvous, launcher)) {}
Agent::~Agent() = default;
int Agent::run() { return impl_->run(); }
int Agent::restart_count() const { return impl_->restart_count(); }
std::optional<std::uint16_t> Agent::status_port() const { return impl_->status_port(); }
bool Agent::reported_worker_failure() const { return impl_->reported_worker_failure(); }
const std::vector<std::string>& Agent::incident_files() const { return impl_->incident_files(); }

}  // namespace ddp::agent
