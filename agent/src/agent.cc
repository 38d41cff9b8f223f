#include "ddp/agent/agent.h"

#include <algorithm>
#include <csignal>
#include <ctime>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "agent_events_fanout.h"
#include "ddp/agent/failure_report.h"
#include "ddp/common/background.h"
#include "ddp/common/error.h"
#include "ddp/common/logging.h"
#include "file_timer_service.h"
#include "hang_response.h"
#include "health_check.h"
#include "in_place_recovery.h"
#include "job_record.h"
#include "live_view_feed.h"
#include "progress_watch.h"
#include "round_monitor.h"
#include "worker_group.h"

namespace ddp::agent {
namespace {

namespace fs = std::filesystem;

}  // namespace

// The round loop: join a round, run the worker group in it, watch it until
// the round ends (here or elsewhere), then restart, re-form or end the job.
// The rooms it drives: WorkerGroup (the workers), HangResponse, InPlaceRecovery,
// FileTimerService, and the events (the printer and the live view).
class Agent::Impl {
 public:
  Impl(AgentOptions options, RendezvousHandler& rendezvous, WorkerEventLoop& loop,
       AgentEvents& printer)
      : options_(std::move(options)), rdzv_(rendezvous), loop_(loop), logger_(log::get("ddprun")),
        watch_(options_.watch, options_.hostname, rendezvous.params().local_addr,
               *options_.runtime),
        live_view_(options_, rendezvous, watch_),
        record_(options_.record_dir, options_.hostname, live_view_.board(),
                [&printer](const std::string& line) { printer.notice(line); }),
        events_({&printer, &live_view_, &record_}),
        group_(options_, rendezvous, loop, watch_, events_),
        hang_(options_, watch_, group_, events_), timer_(options_, group_, events_),
        recovery_(options_, rendezvous.params(), group_, events_) {
    // What a join waits for (more nodes, a spare's place): said once per wait.
    AgentEvents* events = &events_;
    rdzv_.on_wait([events](const std::string& line) { events->notice(line); });
  }

  int run() {
    if (!live_view_.start(events_)) return 1;
    const int code = run_job();
    events_.job_ended(code);
    live_view_.stop();
    return code;
  }

  int restart_count() const { return restart_count_; }
  std::optional<std::uint16_t> status_port() const { return live_view_.port(); }
  bool reported_worker_failure() const { return reported_worker_failure_; }
  const std::vector<std::string>& incident_files() const { return hang_.incident_files(); }

 private:
  Clock::time_point now() const { return options_.runtime->now(); }

  int run_job() {
    hang_.say_what_hangs_are_seen();
    if (!timer_.start()) return 1;
    const int code = run_rounds();
    timer_.stop();
    watch_.end_round();
    if (const std::string scores = watch_.straggler_summary(); !scores.empty()) {
      events_.notice("straggler scores of the last round (1.00 = fastest): " + scores);
    }
    if (code != 0 && !membership_.lines().empty()) {
      // What happened to the group, for the failure report.
      std::string text = "ddprun: membership changes during this run:\n";
      for (const auto& line : membership_.lines()) text += "  " + line + "\n";
      events_.report(text);
    }
    leave_job();
    return code;
  }

  // Leave the job (heartbeat off, the last agent deletes the job's keys)
  // unless a rendezvous thread was left blocked in the handler; after a
  // signal only for what is left of the short deadline.
  void leave_job() {
    if (rendezvous_abandoned_) return;
    auto budget = options_.announce_timeout;
    if (hurry_until_) {
      budget =
          std::max(std::chrono::milliseconds(0),
                   std::chrono::duration_cast<std::chrono::milliseconds>(*hurry_until_ - now()));
    }
    rdzv_.shutdown(budget);
  }

  int run_rounds() {
    for (;;) {
      std::unique_ptr<Round> round;
      if (auto code = join(round)) return *code;
      begin_round(std::move(round));
      const std::optional<RoundOutcome> outcome = run_round();
      if (!outcome) return 1;
      if (auto code = after_round(*outcome)) return *code;
    }
  }

  // Joins the next round; an exit code instead when the job ends first.
  std::optional<int> join(std::unique_ptr<Round>& round) {
    // Cleared as a round ends, not as the next begins: a worker kept for an
    // in-place recovery may fail while the group re-forms.
    group_.clear_failures();
    events_.joining();
    if (auto code = pass_health_check()) {
      group_.stop(*code > 128 ? *code - 128 : SIGTERM);  // workers kept for an in-place recovery
      return code;
    }
    try {
      return next_round(round);
    } catch (const ShutdownError& e) {
      // The job ended while this node waited (a spare at max_nodes).
      events_.notice(std::string(e.what()) + "; nothing left to do");
      group_.stop(SIGTERM);  // workers kept for an in-place recovery
      return 0;
    } catch (const std::exception& e) {
      events_.notice(std::string("rendezvous failed: ") + e.what());
      group_.stop(SIGTERM);
      return 1;
    }
  }

  // --health_check: runs until it passes (nullopt) or the job ends here.
  std::optional<int> pass_health_check() {
    if (!health_.enabled()) return std::nullopt;
    const RendezvousParams& params = rdzv_.params();
    HealthCheckFacts facts;
    facts.local_world_size = options_.spec.local_world_size;
    facts.run_id = params.run_id;
    if (round_) {
      facts.node_rank = round_->info().group_rank;
      facts.last_round = round_->info().round;
    } else if (params.node_rank >= 0) {
      facts.node_rank = params.node_rank;
    }
    try {
      return health_.pass(options_.base_env, facts, params.join_timeout);
    } catch (const std::exception& e) {
      events_.notice(std::string("error: could not run the health check: ") + e.what());
      return 1;
    }
  }

  // The round formed: the workers, the watch and the rooms begin it.
  void begin_round(std::unique_ptr<Round> round) {
    round_ = std::move(round);
    const RendezvousInfo& info = round_->info();
    ++attempt_;
    read_job_counts();
    live_view_.follow(*round_);
    events_.round_formed(RoundFormed{info.round, attempt_ - 1, info.world_size,
                                     info.group_world_size, info.group_rank, info.base_rank,
                                     job_counts_});
    if (reforming_) {
      reforming_ = false;
      membership_.note(events_, "re-formed the group as round " + std::to_string(info.round) +
                                    ": " + std::to_string(info.group_world_size) +
                                    " nodes, WORLD_SIZE=" + std::to_string(info.world_size) +
                                    ", this node's group rank " + std::to_string(info.group_rank));
    }
    logger_->info("round {}: group rank {}/{}, ranks {}..{} of {}, master {}:{}", info.round,
                  info.group_rank, info.group_world_size, info.base_rank,
                  info.base_rank + options_.spec.local_world_size - 1, info.world_size,
                  info.master_addr, info.master_port);
    group_.begin_round(*round_, attempt_, restart_count_, job_counts_,
                       std::exchange(keeping_, false));
    recovery_.round_formed(info);
    hang_.begin_round();
    begin_watch();
  }

  // Runs the workers until the round ends. Nullopt: the round broke (said,
  // the workers stopped, the other agents told).
  std::optional<RoundOutcome> run_round() {
    RoundMonitor monitor(rooms_, *round_, membership_);
    RoundOutcome outcome;
    std::unique_ptr<RoundWatch> watch;
    try {
      WorkerEventLoop* loop = &loop_;
      watch = round_->watch([loop] { loop->wake(); });
      events_.workers_running();
      if (group_.failures().empty()) {
        group_.start();
        outcome = monitor.run(*watch);
      } else {
        // A kept worker failed while the group re-formed: in-place recovery
        // falls back to a restart, as a failure of this round.
        logger_->warn(
            "a worker kept for the in-place recovery failed while the group "
            "re-formed: falling back to a restart");
        outcome = monitor.fail(*watch);
      }
    } catch (const std::exception& e) {
      events_.notice(e.what());
      monitor.abort();
      return std::nullopt;
    }
    if (monitor.hurry_until()) hurry_until_ = monitor.hurry_until();
    if (monitor.reform_cause()) reform_cause_ = *monitor.reform_cause();
    watch.reset();
    // Read before the watch forgets the round's ranks.
    round_progressed_ = watch_.steps_seen().value_or(true);
    watch_.end_round(/*keep_workers=*/outcome.kind == RoundOutcome::Kind::kReformInPlace);
    recovery_.finish_report();
    return outcome;
  }

  // What the round's end means for the job: its exit code, or nullopt for
  // another round.
  std::optional<int> after_round(const RoundOutcome& outcome) {
    switch (outcome.kind) {
      case RoundOutcome::Kind::kDone:
      case RoundOutcome::Kind::kBarrierTimeout:
        return 0;
      case RoundOutcome::Kind::kSignal:
        return 128 + outcome.value;
      case RoundOutcome::Kind::kAbort:
        return stopped_by_other(outcome);
      case RoundOutcome::Kind::kStoreLost:
        return 1;  // said when it was seen (on_remote_end)
      case RoundOutcome::Kind::kRestart:
      case RoundOutcome::Kind::kFail:
        break;
      case RoundOutcome::Kind::kReform:
        reforming_ = true;
        // A membership change does not consume --max_restarts: counted apart.
        count_round_end(RoundEndCount::Kind::kMembershipChange);
        count_restart(reform_cause_);
        return std::nullopt;
      case RoundOutcome::Kind::kReformInPlace:
        reforming_ = true;
        keeping_ = true;
        if (outcome.spends_restart) ++restart_count_;
        count_round_end(outcome.spends_restart ? RoundEndCount::Kind::kRestart
                                               : RoundEndCount::Kind::kMembershipChange);
        count_restart(outcome.spends_restart ? RestartCause::kWorkerFailure : reform_cause_);
        return std::nullopt;
    }
    // Counted first, then judged: every node of the round gets the same
    // counts from the store, so every node decides alike.
    if (outcome.kind == RoundOutcome::Kind::kRestart) {
      count_round_end(RoundEndCount::Kind::kRestart);
    }
    if (outcome.kind == RoundOutcome::Kind::kRestart &&
        job_counts_.restarts <= options_.spec.max_restarts) {
      ++restart_count_;
      note_restart_cause(outcome);
      if (no_progress_limit_reached()) return stop_for_no_progress();
      count_restart(hang_.last_hang().empty() ? RestartCause::kWorkerFailure : RestartCause::kHang);
      logger_->warn("restarting the worker group ({}/{} restarts)", job_counts_.restarts,
                    options_.spec.max_restarts);
      return std::nullopt;
    }
    return report_failure(outcome);
  }

  // The job's counts as the store holds them, read as a round forms (a node
  // that joins late starts from the job's, not from zero).
  void read_job_counts() {
    try {
      if (auto counts = rdzv_.job_counts()) job_counts_ = *counts;
    } catch (const std::exception& e) {
      logger_->warn(
          "could not read the job's restart count from the store ({}); going on with "
          "this node's: {}",
          e.what(), job_counts_.restarts);
    }
  }

  // Counts the end of this round for the job, once across every node.
  void count_round_end(RoundEndCount::Kind kind) {
    const RoundEndCount how{kind, round_progressed_};
    try {
      job_counts_ = rdzv_.count_round_end(job_counts_, round_->info().round, how);
    } catch (const std::exception& e) {
      job_counts_ = counted(job_counts_, round_->info().round, how);
      logger_->warn("could not count the restart in the store ({}); counting it on this node",
                    e.what());
    }
  }

  // One line per restart for the no-progress report (the last few kept).
  void note_restart_cause(const RoundOutcome& outcome) {
    const std::string why = !hang_.last_hang().empty()
                                ? "a hang: " + hang_.last_hang()
                                : fmt::format("node {}'s workers failed (exit code {})",
                                              outcome.node, exit_code_for(outcome.value));
    restart_causes_.push_back(fmt::format(
        "restart {} of the job, after round {}: {}; {}", job_counts_.restarts, round_->info().round,
        why, round_progressed_ ? "steps were completed" : "no rank completed a step"));
    if (restart_causes_.size() > kRestartCausesKept) restart_causes_.erase(restart_causes_.begin());
  }

  bool no_progress_limit_reached() const {
    const int limit = options_.spec.max_no_progress_restarts;
    return limit > 0 && job_counts_.restarts_without_progress >= limit;
  }

  // --max_no_progress_restarts: the restarts in a row made no progress; every
  // node of the round counted the same and stops the same way.
  int stop_for_no_progress() {
    std::string report = fmt::format(
        "ddprun: stopping the job: its last {} restarts each came after a round in which no rank "
        "completed a step (--max_no_progress_restarts={}); exit code {}\n",
        job_counts_.restarts_without_progress, options_.spec.max_no_progress_restarts,
        kNoProgressExitCode);
    for (const auto& line : restart_causes_) report += "  " + line + "\n";
    const auto& failures = group_.failures();
    if (!failures.empty()) {
      report += format_report(program_name(), failures, options_.hostname);
      reported_worker_failure_ = true;
    }
    events_.report(report);
    return kNoProgressExitCode;
  }

  // Another node's agent stopped the job: its exit code here.
  int stopped_by_other(const RoundOutcome& outcome) {
    if (outcome.value > 0) {
      events_.notice(fmt::format("the agent of node {} stopped the job (signal {})", outcome.node,
                                 outcome.value));
      return 128 + outcome.value;
    }
    events_.notice(fmt::format(
        "the agent of node {} stopped the job (its workers failed and may not be restarted)",
        outcome.node));
    return 1;
  }

  // This node's workers failed and may not be restarted: the report, and the
  // job's exit code.
  int report_failure(const RoundOutcome& outcome) {
    const auto& failures = group_.failures();
    if (!failures.empty()) {
      std::string report = format_report(program_name(), failures, options_.hostname);
      if (!hang_.last_hang().empty()) {
        report +=
            "ddprun: these failures came after the hang reported above: " + hang_.last_hang() +
            "\n";
      }
      events_.report(report);
      reported_worker_failure_ = true;
      return exit_code_for(failures[root_cause(failures)].exit_code);
    }
    events_.notice(
        fmt::format("the worker group on node {} failed (exit code {}) and no restarts are left "
                    "(--max_restarts={}, all spent by the job across its nodes)",
                    outcome.node, exit_code_for(outcome.value), options_.spec.max_restarts));
    return exit_code_for(outcome.value);
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
    auto shared = std::make_shared<Joining>();
    RendezvousHandler* rdzv = &rdzv_;
    WorkerEventLoop* loop = &loop_;
    BackgroundCall call(
        [shared, rdzv, loop] {
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
          loop->wake();
        },
        *options_.runtime);
    if (auto code = wait_for_join(*shared)) return code;
    // Its last act is to wake the loop: joined, so that it never touches
    // a loop that is gone.
    call.wait();
    if (shared->error) std::rethrow_exception(shared->error);
    out = std::move(shared->round);
    return std::nullopt;
  }

  // A join on the rendezvous thread, and what it brought.
  struct Joining {
    std::mutex mutex;
    bool done = false;
    std::unique_ptr<Round> round;
    std::exception_ptr error;
  };

  // Handles the events while the rendezvous thread joins, until it is done;
  // an exit code when a signal comes first (the thread is abandoned).
  std::optional<int> wait_for_join(Joining& shared) {
    for (;;) {
      LoopEvent event = loop_.next_event(Clock::time_point::max());
      if (event.kind == LoopEvent::Kind::kSignal) {
        rendezvous_abandoned_ = true;  // the call is abandoned, blocked in the handler
        events_.notice("received " + signal_name(event.signo) +
                       " while waiting for the other nodes; exiting");
        group_.stop(event.signo);  // workers kept for an in-place recovery
        return 128 + event.signo;
      }
      if (event.kind == LoopEvent::Kind::kExited) {
        on_kept_worker_exit(event);
        continue;
      }
      if (event.kind != LoopEvent::Kind::kWake) continue;
      std::lock_guard lock(shared.mutex);
      if (shared.done) return std::nullopt;  // other wakes (an old round's watcher) are spurious
    }
  }

  // A worker kept for an in-place recovery ended while the group re-forms: a
  // failure of the next round (a restart, when one is left).
  void on_kept_worker_exit(const LoopEvent& event) {
    if (Worker* worker = group_.on_exit(event); worker != nullptr && event.status != 0) {
      group_.record_failure(*worker, event);
    }
  }

  std::string program_name() const {
    if (!options_.spec.name.empty()) return options_.spec.name;
    const auto& argv = options_.spec.argv;
    return argv.empty() ? "ddprun" : fs::path(argv[0]).filename().string();
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

  void count_restart(RestartCause cause) {
    events_.restarting(Restart{cause, job_counts_, options_.spec.max_restarts});
  }

  AgentOptions options_;
  RendezvousHandler& rdzv_;
  WorkerEventLoop& loop_;
  std::shared_ptr<spdlog::logger> logger_;
  // Progress, hangs and stragglers of the workers (and the other nodes').
  ProgressWatch watch_;
  // The live view, the record, and every event to the printer and to them.
  LiveViewFeed live_view_;
  JobRecord record_;  // after the live view: it writes the live view's board at the end
  AgentEventsFanout events_;
  // The rooms: the workers, the reaction to a hang, torch's file timer,
  // in-place recovery.
  WorkerGroup group_;
  HangResponse hang_;
  FileTimerService timer_;
  InPlaceRecovery recovery_;
  // The round this node runs in (null before the first).
  std::unique_ptr<Round> round_;
  // This agent's restarts (torchrun's TORCHELASTIC_RESTART_COUNT).
  int restart_count_ = 0;
  // The job's counts (restarts on every node, membership changes): read as
  // a round forms, then with the round's end counted.
  JobCounts job_counts_;
  // Whether a rank completed a step in the round that just ended (true when
  // steps cannot be seen: no progress pages).
  bool round_progressed_ = true;
  // The last restarts and why, for the no-progress report.
  static constexpr std::size_t kRestartCausesKept = 16;
  std::vector<std::string> restart_causes_;
  // Rounds this agent ran workers in (attempt_<n> log directories).
  int attempt_ = 0;
  // The group re-forms after this round; with keeping_, the next round keeps
  // this node's workers (in-place recovery).
  bool reforming_ = false;
  bool keeping_ = false;
  // Why the current round re-forms.
  RestartCause reform_cause_ = RestartCause::kNodeLost;
  MembershipLog membership_;
  // --health_check before each join.
  HealthGate health_{options_.health_check, loop_, *options_.runtime, events_,
                     [this](const LoopEvent& event) { on_kept_worker_exit(event); }};
  // What a round's monitor drives.
  AgentRooms rooms_{options_, loop_, watch_, group_, hang_, timer_, recovery_, live_view_, events_};
  // Set once a signal asked the agent to leave: the end of its short deadline.
  std::optional<Clock::time_point> hurry_until_;
  // A rendezvous thread was left blocked in the handler (a signal came first).
  bool rendezvous_abandoned_ = false;
  // run() printed a failure report of this node's workers.
  bool reported_worker_failure_ = false;
  // The progress summaries' store handle (opened by the first multi-node round).
  std::shared_ptr<Store> progress_store_;
};

Agent::Agent(AgentOptions options, RendezvousHandler& rendezvous, WorkerEventLoop& loop)
    : printer_(std::make_unique<StderrPrinter>()),
      impl_(std::make_unique<Impl>(std::move(options), rendezvous, loop, *printer_)) {}
Agent::Agent(AgentOptions options, RendezvousHandler& rendezvous, WorkerEventLoop& loop,
             AgentEvents& events)
    : impl_(std::make_unique<Impl>(std::move(options), rendezvous, loop, events)) {}
Agent::~Agent() = default;
int Agent::run() { return impl_->run(); }
int Agent::restart_count() const { return impl_->restart_count(); }
std::optional<std::uint16_t> Agent::status_port() const { return impl_->status_port(); }
bool Agent::reported_worker_failure() const { return impl_->reported_worker_failure(); }
const std::vector<std::string>& Agent::incident_files() const { return impl_->incident_files(); }

}  // namespace ddp::agent
