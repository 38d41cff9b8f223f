#include "round_monitor.h"

#include <algorithm>
#include <csignal>
#include <ctime>

#include <fmt/format.h>

#include "ddp/agent/failure_report.h"
#include "ddp/common/logging.h"

namespace ddp::agent {
namespace {

// How often a node that stays past its exit barrier for the others (it
// serves their store) looks whether they are still alive.
constexpr std::chrono::seconds kStayLook{1};

}  // namespace

void MembershipLog::note(AgentEvents& events, const std::string& what) {
  const std::time_t now = std::time(nullptr);
  // localtime_r: std::localtime re-reads the time zone (freeing and
  // allocating glibc's copy of TZ) on every call, a data race between the
  // agents of one process (ThreadSanitizer, the 3-agent test).
  std::tm local{};
  char when[32] = "??:??:??";
  if (::localtime_r(&now, &local) != nullptr) std::strftime(when, sizeof(when), "%H:%M:%S", &local);
  std::string line = std::string(when) + " " + what;
  events.notice(line);
  lines_.push_back(std::move(line));
}

RoundMonitor::RoundMonitor(const AgentRooms& rooms, Round& round, MembershipLog& membership)
    : options_(rooms.options), loop_(rooms.loop), watch_(rooms.watch), group_(rooms.group),
      hang_(rooms.hang), timer_(rooms.timer), recovery_(rooms.recovery),
      live_view_(rooms.live_view), events_(rooms.events), round_(&round), membership_(membership),
      logger_(log::get("ddprun")) {}

RoundOutcome RoundMonitor::run(const RoundWatch& watch) { return monitor(watch); }

void RoundMonitor::abort() {
  auto note = announce(end_of(RoundEnd::Kind::kAbort, 0));
  group_.stop(SIGTERM);
  finish_announcement(note);
}

// This node's end of the round: kind, and the exit code or signal.
RoundEnd RoundMonitor::end_of(RoundEnd::Kind kind, int value) const {
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
RoundEnd RoundMonitor::end_of_failure(RoundEnd::Kind kind, int value) {
  RoundEnd end = end_of(kind, value);
  if (!hang_.ended_hung_workers()) return end;
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
std::unique_ptr<PendingEnd> RoundMonitor::announce(const RoundEnd& end) {
  announce_deadline_ = now() + options_.announce_timeout;
  return round_->end(end);
}

// Waits for the announcement up to announce_timeout after it started.
void RoundMonitor::finish_announcement(std::unique_ptr<PendingEnd>& note) {
  if (!note) return;
  const std::string error = note->wait_until(announce_deadline_);
  if (!error.empty()) {
    logger_->warn("could not tell the other agents through the rendezvous store within {} s: {}",
                  options_.announce_timeout.count() / 1000.0, error);
  }
  note.reset();
}

// Whether the agent looks at its workers periodically.
bool RoundMonitor::ticking() const {
  return watch_.active() || timer_.active() || live_view_.port().has_value() || recovery_.pending();
}

// When the next look at the workers' progress is due (never when off). The
// file timer is served at torchrun's pace (100 ms).
Clock::time_point RoundMonitor::next_tick() const {
  if (timer_.active())
    return now() +
           std::min<std::chrono::milliseconds>(options_.watch.tick, std::chrono::milliseconds(100));
  return ticking() ? now() + options_.watch.tick : Clock::time_point::max();
}

RoundOutcome RoundMonitor::monitor(const RoundWatch& watch) {
  while (group_.running_count() > 0) {
    LoopEvent event = loop_.next_event(next_tick());
    switch (event.kind) {
      case LoopEvent::Kind::kExited: {
        Worker* worker = group_.on_exit(event);
        if (worker == nullptr || event.status == 0) break;
        group_.record_failure(*worker, event);
        return fail_round(watch);
      }
      case LoopEvent::Kind::kSignal:
        return on_signal(event.signo);
      case LoopEvent::Kind::kWake: {
        auto outcome = on_remote_end(watch);
        if (outcome) return *outcome;
        break;
      }
      case LoopEvent::Kind::kTimeout:
        look_at_progress();
        break;
    }
  }
  return exit_barrier(watch);
}

// A local worker failed: collect the failures that already happened (several
// workers often die of the same cause at once), tell the other agents, stop
// the rest. Exits after our SIGTERM are reactions to it, not failures.
RoundOutcome RoundMonitor::fail_round(const RoundWatch& watch) {
  std::optional<int> signal;
  for (;;) {
    LoopEvent event = loop_.next_event(now());
    if (event.kind == LoopEvent::Kind::kTimeout) break;
    if (event.kind == LoopEvent::Kind::kSignal && !signal) signal = event.signo;
    if (event.kind != LoopEvent::Kind::kExited) continue;
    Worker* worker = group_.on_exit(event);
    if (worker != nullptr && event.status != 0) group_.record_failure(*worker, event);
  }
  if (signal) return on_signal(*signal);
  if (auto outcome = membership_change_behind(watch)) return *outcome;
  const auto& first = group_.failures()[root_cause(group_.failures())];
  if (hang_.fail_without_restart()) {
    // --on_hang=fail: the job ends; the other agents stop theirs.
    auto note = announce(end_of_failure(RoundEnd::Kind::kAbort, 0));
    group_.stop(SIGTERM);
    finish_announcement(note);
    return RoundOutcome{RoundOutcome::Kind::kFail, round_->info().group_rank, first.exit_code};
  }
  auto note = announce(end_of_failure(RoundEnd::Kind::kRestart, first.exit_code));
  group_.stop(SIGTERM);
  finish_announcement(note);
  return RoundOutcome{RoundOutcome::Kind::kRestart, round_->info().group_rank, first.exit_code};
}

// A local worker failed. When a node of an elastic group dies, its peers'
// collectives fail at once, long before its keep-alives are missed: if the
// handler cannot see every member alive, wait (workers stopped) for the
// round's watch to tell, so that a lost node re-forms the group instead of
// spending a restart. Nullopt: a worker failure after all.
std::optional<RoundOutcome> RoundMonitor::membership_change_behind(const RoundWatch& watch) {
  if (!watch.ended() && !failure_is_our_hang_action()) {
    const auto grace = round_->grace_for_membership_change();
    if (grace.count() <= 0) return std::nullopt;
    logger_->warn(
        "a worker failed and a node of the group is silent: waiting up to {} s for "
        "the group's verdict",
        grace.count() / 1000.0);
    group_.stop(SIGTERM);
    const Clock::time_point until = now() + grace;
    while (!watch.ended()) {
      LoopEvent event = loop_.next_event(until);
      if (event.kind == LoopEvent::Kind::kTimeout) break;
      if (event.kind == LoopEvent::Kind::kSignal) return on_signal(event.signo);
      if (event.kind == LoopEvent::Kind::kExited) group_.on_exit(event);
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
bool RoundMonitor::failure_is_our_hang_action() {
  const auto& failures = group_.failures();
  if (failures.empty() || !hang_.ended_hung_workers() || hang_.saw_unreachable()) return false;
  const Worker* worker = group_.find(failures[root_cause(failures)].pid);
  return worker != nullptr && !worker->ended_by_agent.empty();
}

RoundOutcome RoundMonitor::on_signal(int signo) {
  logger_->warn("received {}: stopping the workers", signal_name(signo));
  auto note = announce(end_of(RoundEnd::Kind::kAbort, signo));
  hurry_until_ = now() + options_.announce_timeout;
  group_.stop(signo);
  finish_announcement(note);
  return RoundOutcome{RoundOutcome::Kind::kSignal, round_->info().group_rank, signo};
}

// The round ended elsewhere: another agent (or we) ended it, or the store was lost.
std::optional<RoundOutcome> RoundMonitor::on_remote_end(const RoundWatch& watch) {
  auto ended = watch.ended();
  if (!ended) return std::nullopt;
  const RoundEnd& end = *ended;
  if (end.kind == RoundEnd::Kind::kRestart || end.kind == RoundEnd::Kind::kAbort) {
    look_for_their_hang(end);
  }
  switch (end.kind) {
    case RoundEnd::Kind::kRestart:
      if (auto kept = keep_workers_through(end)) {
        membership_.note(events_, describe(end) + "; this node's workers recover in place");
        return *kept;
      }
      logger_->warn("node {} asked for a restart: stopping the workers", end.node);
      group_.stop(SIGTERM);
      return RoundOutcome{RoundOutcome::Kind::kRestart, end.node, end.value};
    case RoundEnd::Kind::kAbort:
      group_.stop(SIGTERM);
      return RoundOutcome{RoundOutcome::Kind::kAbort, end.node, end.value};
    case RoundEnd::Kind::kDone:
      return std::nullopt;  // only meaningful at the exit barrier
    case RoundEnd::Kind::kNodeLost:
    case RoundEnd::Kind::kNodeJoined:
      return on_membership_change(end);
    case RoundEnd::Kind::kStoreLost:
      // Nobody can tell this node how the round goes on: it stops its workers.
      events_.notice(describe(end) + "; stopping this node's workers");
      group_.stop(SIGTERM);
      return RoundOutcome{RoundOutcome::Kind::kStoreLost};
  }
  return std::nullopt;
}

// Another node may have ended the round over a hang it found first (a
// membership change never comes from one: no look, no delay there). When
// its end says so, its summary carries the hang: wait for this node's read
// of the store (up to the announce timeout) rather than take what the last
// exchange brought.
void RoundMonitor::look_for_their_hang(const RoundEnd& end) {
  const auto wait = end.hang ? options_.announce_timeout : std::chrono::milliseconds(500);
  if (auto verdict = watch_.last_look(wait)) {
    hang_.respond(*verdict);
  } else if (end.hang && !watch_.reported()) {
    logger_->warn(
        "node {} ended the round over a hang, but no progress summary carrying it could be "
        "read within {} s",
        end.node, wait.count() / 1000.0);
  }
}

// A node was lost or joins: the workers recover in place, or stop to re-form.
RoundOutcome RoundMonitor::on_membership_change(const RoundEnd& end) {
  const bool lost = end.kind == RoundEnd::Kind::kNodeLost;
  reform_cause_ = lost ? RestartCause::kNodeLost : RestartCause::kNodeJoined;
  events_.membership_changed(MembershipChange{lost, end.node, describe(end)});
  if (auto kept = keep_workers_through(end)) {
    membership_.note(events_, describe(end) + "; the workers recover in place");
    return *kept;
  }
  membership_.note(events_, describe(end) + "; stopping the workers to re-form the group");
  group_.stop(SIGTERM);
  return RoundOutcome{RoundOutcome::Kind::kReform, end.node, 0};
}

// In-place recovery (InPlaceRecovery): the workers keep running into the
// next round. Nullopt: they are stopped and started again as usual (also
// after another node's restart when no restarts are left).
std::optional<RoundOutcome> RoundMonitor::keep_workers_through(const RoundEnd& end) {
  if (!recovery_.keep_workers_through(end)) return std::nullopt;
  RoundOutcome outcome{RoundOutcome::Kind::kReformInPlace, end.node, end.value};
  outcome.spends_restart = end.kind == RoundEnd::Kind::kRestart;
  return outcome;
}

RoundOutcome RoundMonitor::exit_barrier(const RoundWatch& watch) {
  if (round_->info().group_world_size <= 1) return RoundOutcome{RoundOutcome::Kind::kDone};
  try {
    round_->arrive_at_exit_barrier(now() + options_.announce_timeout);
  } catch (const std::exception& e) {
    logger_->error("exit barrier: {}", e.what());
    return RoundOutcome{RoundOutcome::Kind::kBarrierTimeout};
  }
  const Deadline deadline(options_.exit_barrier_timeout);
  // Past the deadline, a node that serves the store others still use stays,
  // and looks again every kStayLook whether they still need it.
  bool staying = false;
  Clock::time_point look = deadline.when();
  for (;;) {
    if (auto end = watch.ended()) {
      if (auto outcome = barrier_ended(*end, watch)) return *outcome;
    }
    LoopEvent event = loop_.next_event(std::min(look, next_tick()));
    if (event.kind == LoopEvent::Kind::kTimeout && ticking() && now() < look) {
      // Still waiting for the others: keep this node's summary going out
      // (a rank elsewhere may not exit) and report what is seen.
      look_at_progress();
      continue;
    }
    if (event.kind == LoopEvent::Kind::kTimeout) {
      if (auto outcome = barrier_deadline(staying, look)) return *outcome;
      continue;
    }
    if (event.kind == LoopEvent::Kind::kSignal) {
      hurry_until_ = now() + options_.announce_timeout;
      auto note = announce(end_of(RoundEnd::Kind::kAbort, event.signo));
      finish_announcement(note);
      return RoundOutcome{RoundOutcome::Kind::kSignal, round_->info().group_rank, event.signo};
    }
  }
}

// The round ended while this node waited at the exit barrier.
std::optional<RoundOutcome> RoundMonitor::barrier_ended(const RoundEnd& end,
                                                        const RoundWatch& watch) {
  if (end.kind == RoundEnd::Kind::kDone) return RoundOutcome{RoundOutcome::Kind::kDone};
  if (end.kind == RoundEnd::Kind::kStoreLost) {
    // The store went away after we arrived: its host only leaves once
    // every agent passed the barrier.
    logger_->info("exit barrier: store gone ({}); the job is done", end.detail);
    return RoundOutcome{RoundOutcome::Kind::kDone};
  }
  return on_remote_end(watch);
}

// The exit barrier's deadline (or a later look) passed: stay while this
// node serves a store the others use, else leave.
std::optional<RoundOutcome> RoundMonitor::barrier_deadline(bool& staying, Clock::time_point& look) {
  if (round_->needed_by_others()) {
    if (!staying) {
      events_.notice(
          fmt::format("exit barrier: not every node finished within {:g} s; this node "
                      "serves the rendezvous store that the others still use, so it stays "
                      "until they finish or are gone",
                      options_.exit_barrier_timeout.count() / 1000.0));
      staying = true;
    }
    look = now() + kStayLook;
    return std::nullopt;
  }
  if (staying) {
    events_.notice("exit barrier: the nodes still running show no sign of life; leaving");
  } else {
    logger_->warn("exit barrier: not every agent finished within {} s; exiting anyway",
                  options_.exit_barrier_timeout.count() / 1000.0);
  }
  return RoundOutcome{RoundOutcome::Kind::kBarrierTimeout};
}

// One look at every rank's progress; acts on a hang found.
void RoundMonitor::look_at_progress() {
  recovery_.report(/*final=*/false);
  if (timer_.active()) timer_.serve();
  if (watch_.active()) {
    auto verdict = watch_.check();
    if (verdict) hang_.respond(*verdict);
  }
  live_view_.refresh();
}

}  // namespace ddp::agent
