// One round as the agent watches it: its workers' exits and the handled
// signals (from the event loop), the round's end coming from another node
// (its watch), the looks at the workers' progress, this node's end of the
// round told to the others, and the exit barrier. It decides how the round
// ended (RoundOutcome); the round loop (agent.cc) decides what comes next.
//
// Ownership: borrows everything it is given (the agent's rooms, the round,
// the membership log); they must outlive it. Blocking: run() and fail() block
// until the round ends for this node (announcing this node's end waits for
// the store at most AgentOptions::announce_timeout). Thread-safety: the
// agent's thread only. Errors: what the rooms throw (a worker that cannot be
// started; the event loop's InternalError).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/logger.h>

#include "ddp/agent/agent_events.h"
#include "ddp/agent/worker_event_loop.h"
#include "ddp/agent/worker_spec.h"
#include "ddp/rendezvous/rendezvous.h"
#include "file_timer_service.h"
#include "hang_response.h"
#include "in_place_recovery.h"
#include "live_view_feed.h"
#include "progress_watch.h"
#include "worker_group.h"

namespace ddp::agent {

// How a round ended for this node.
struct RoundOutcome {
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

// The membership changes of the run, each said with its wall-clock time and
// kept for the report of a failed run.
class MembershipLog {
 public:
  void note(AgentEvents& events, const std::string& what);
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  std::vector<std::string> lines_;
};

// The agent's rooms a round's monitor drives.
struct AgentRooms {
  const AgentOptions& options;
  WorkerEventLoop& loop;
  ProgressWatch& watch;
  WorkerGroup& group;
  HangResponse& hang;
  FileTimerService& timer;
  InPlaceRecovery& recovery;
  LiveViewFeed& live_view;
  AgentEvents& events;
};

class RoundMonitor {
 public:
  RoundMonitor(const AgentRooms& rooms, Round& round, MembershipLog& membership);

  // Watches the round's running workers until it ends for this node (their
  // exits, signals, the round's end elsewhere, the exit barrier).
  RoundOutcome run(const RoundWatch& watch);
  // A worker already failed (kept through the re-form): the round fails.
  RoundOutcome fail(const RoundWatch& watch) { return fail_round(watch); }
  // The round broke here: tells the others (kAbort) and stops the workers.
  void abort();

  // Set once a signal asked the agent to leave: the end of its short deadline.
  std::optional<Clock::time_point> hurry_until() const { return hurry_until_; }
  // Why the group re-forms, when a membership change ended the round.
  std::optional<RestartCause> reform_cause() const { return reform_cause_; }

 private:
  RoundEnd end_of(RoundEnd::Kind kind, int value) const;
  RoundEnd end_of_failure(RoundEnd::Kind kind, int value);
  std::unique_ptr<PendingEnd> announce(const RoundEnd& end);
  void finish_announcement(std::unique_ptr<PendingEnd>& note);
  bool ticking() const;
  Clock::time_point next_tick() const;
  Clock::time_point now() const { return options_.runtime->now(); }
  RoundOutcome monitor(const RoundWatch& watch);
  RoundOutcome fail_round(const RoundWatch& watch);
  std::optional<RoundOutcome> membership_change_behind(const RoundWatch& watch);
  bool failure_is_our_hang_action();
  RoundOutcome on_signal(int signo);
  std::optional<RoundOutcome> on_remote_end(const RoundWatch& watch);
  void look_for_their_hang(const RoundEnd& end);
  RoundOutcome on_membership_change(const RoundEnd& end);
  std::optional<RoundOutcome> keep_workers_through(const RoundEnd& end);
  RoundOutcome exit_barrier(const RoundWatch& watch);
  std::optional<RoundOutcome> barrier_ended(const RoundEnd& end, const RoundWatch& watch);
  std::optional<RoundOutcome> barrier_deadline(bool& staying, Clock::time_point& look);
  void look_at_progress();

  const AgentOptions& options_;
  WorkerEventLoop& loop_;
  ProgressWatch& watch_;
  WorkerGroup& group_;
  HangResponse& hang_;
  FileTimerService& timer_;
  InPlaceRecovery& recovery_;
  LiveViewFeed& live_view_;
  AgentEvents& events_;
  Round* round_;
  MembershipLog& membership_;
  std::shared_ptr<spdlog::logger> logger_;
  // When the current announcement is given up.
  Clock::time_point announce_deadline_{};
  std::optional<Clock::time_point> hurry_until_;
  std::optional<RestartCause> reform_cause_;
};

}  // namespace ddp::agent
