// What the agent tells those who watch it: the events of a run, as one small
// interface. The agent itself prints nothing and shows nothing; it calls an
// AgentEvents, and its implementations decide what the events become: ddprun's
// stderr printer (StderrPrinter below: the lines users see), the live view
// (agent/src/live_view_feed.h: the board behind --status_port) and the job's
// record (agent/src/job_record.h: the events and the final /status on disk).
// An agent holds them behind AgentEventsFanout (agent/src/agent_events_fanout.h).
//
// Contract for implementations: every call comes from the agent's thread, in
// the order things happened; a call must not block (no I/O beyond writing a
// line to a stream) and must not throw. Every method has an empty default, so
// an implementation overrides only what it shows.
#pragma once

#include <ctime>
#include <string>
#include <vector>

#include "ddp/rendezvous/job_counts.h"

namespace ddp::agent {

// Why the group was restarted or re-formed (the live view's `cause` label).
enum class RestartCause { kWorkerFailure, kHang, kNodeLost, kNodeJoined };
const char* to_string(RestartCause cause);

// How a worker exited (the live view's `reason` label).
enum class ExitReason { kSucceeded, kFailed, kSignaled, kEndedByAgent, kStopped };
const char* to_string(ExitReason reason);

// A round formed and this node runs in it.
struct RoundFormed {
  int number = 0;
  // The n of this round's attempt_<n> log directory: 0 in the first round
  // this node ran workers in, one more in each round after it.
  int attempt = 0;
  int world_size = 0;
  int group_world_size = 0;
  int group_rank = 0;
  int base_rank = 0;
  // The job's restarts and membership changes when it formed (on every node).
  JobCounts job;
};

// A node was declared lost, or one asked to join (the round ends for it).
struct MembershipChange {
  bool lost = false;  // false: a node joins
  int node = -1;
  // The round's end as the rendezvous describes it.
  std::string what;
};

// A worker of this node exited.
struct WorkerExit {
  int rank = 0;
  int local_rank = 0;
  int node = 0;  // this node's group rank
  int pid = 0;
  // Exit code (>= 0), or minus the signal number.
  int status = 0;
  ExitReason reason = ExitReason::kFailed;
};

// The group restarts (spending a restart) or re-forms (a membership change).
struct Restart {
  RestartCause cause = RestartCause::kWorkerFailure;
  JobCounts job;  // the job's counts, this restart or re-form counted
  int max_restarts = 0;
};

// A hang some node found, as the live view keeps it (its incident).
struct HangIncident {
  std::string hang_kind;  // to_string(Hang::Kind)
  std::string summary;
  std::vector<int> culprits;
  int node = 0;  // the node that found it
  std::time_t wall = 0;
  std::string file;  // the incident file; empty: not written
};

// A hang as this node reported it.
struct HangReport : HangIncident {
  // The report for the user, every line ending in '\n'.
  std::string text;
};

class AgentEvents {
 public:
  virtual ~AgentEvents() = default;

  // A line for the user: what a join waits for, an error, a decision
  // (StderrPrinter: "ddprun: <line>\n").
  virtual void notice(const std::string& /*line*/) {}
  // Text for the user printed whole (a failure report, the membership changes
  // of a failed run), every line ending in '\n'.
  virtual void report(const std::string& /*text*/) {}
  // The agent is about to join a round (and may wait there long).
  virtual void joining() {}
  // The health check before a join (--health_check) ran: "" when it passed,
  // else why it failed (one line; the node does not join until it passes).
  virtual void health_check(const std::string& /*failure*/) {}
  virtual void round_formed(const RoundFormed& /*round*/) {}
  // The round's workers run (started, or kept and resumed).
  virtual void workers_running() {}
  // The agent stops its running workers.
  virtual void workers_stopping() {}
  virtual void membership_changed(const MembershipChange& /*change*/) {}
  virtual void worker_exited(const WorkerExit& /*exit*/) {}
  // A worker's exit is a failure of the round (after worker_exited).
  virtual void worker_failed(const WorkerExit& /*exit*/) {}
  virtual void restarting(const Restart& /*restart*/) {}
  virtual void hang(const HangReport& /*hang*/) {}
  // The workers are kept through the re-form (in-place recovery): why.
  virtual void recovering(const std::string& /*why*/) {}
  // How the in-place recovery went (one line).
  virtual void recovered(const std::string& /*line*/) {}
  // The job ended with this exit code.
  virtual void job_ended(int /*exit_code*/) {}
};

// ddprun's printer: notices, reports, hangs and recoveries to stderr, as the
// lines tests and users read (tests/agent, tests/launcher, tests/chaos grep
// them). Blocking: writes to stderr. Thread-safety: stderr's.
class StderrPrinter final : public AgentEvents {
 public:
  void notice(const std::string& line) override;
  void report(const std::string& text) override;
  void hang(const HangReport& hang) override;
  void recovered(const std::string& line) override;
};

}  // namespace ddp::agent
