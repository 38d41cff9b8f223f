// What a node's agent tells its live view (--status_port): the job as this
// node sees it, kept on a board the agent's thread writes and the status
// server's thread reads, and the pure functions that render it as /status
// (JSON), /metrics (Prometheus text), /livez and /readyz.
//
// Ownership: the agent owns the board; the status server holds a reference
// (the agent stops the server before the board goes). Blocking: never (one
// mutex, held to copy or change the snapshot). Thread-safety: JobBoard is
// safe from any thread; the renderers are pure. Errors: none thrown but
// std::bad_alloc.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/agent/agent_events.h"
#include "ddp/common/time.h"
#include "ddp/status_http/metrics_text.h"
#include "rank_status.h"

namespace ddp::agent {

// What never changes during a run.
struct JobFacts {
  std::string run_id;
  std::string backend;
  std::string host;
  std::string addr;
  int pid = 0;
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc_per_node = 1;
  int max_restarts = 0;
  Clock::time_point started{};
};

// Where the agent is in the job.
enum class JobState { kRendezvous, kRunning, kStopping, kRestarting, kSucceeded, kFailed };
const char* to_string(JobState state);

// RestartCause (the metric's `cause` label) and ExitReason (its `reason`
// label) are the agent's events' (ddp/agent/agent_events.h).

struct MemberStatus {
  int node = 0;  // group rank
  std::string host;
  std::string addr;
  std::vector<int> ranks;
  // "self", "alive", "unreachable" (its summaries stopped), "silent" (no
  // summary yet), "lost" (declared lost; it stays listed so once the group
  // re-formed without it).
  std::string state;
  std::optional<Millis> last_heard;      // since its summary last changed
  std::optional<Millis> keep_alive_age;  // the node this one judges only
  std::optional<Millis> lost_after;
};

// Every kind of event /status lists (JobEvent::kind), as docs/using.md names
// them.
inline constexpr std::array<std::string_view, 11> kEventKinds = {
    "round_formed", "node_joined",   "node_lost", "restart", "in_place", "recovered",
    "hang",         "worker_failed", "straggler", "done",    "failed"};

struct JobEvent {
  std::time_t wall = 0;
  Clock::time_point at{};
  int round = -1;
  std::string kind;  // one of kEventKinds
  std::string text;
};

using IncidentStatus = HangIncident;

// The round, as formed (RoundFormed: number, attempt, sizes, ranks), and when.
struct RoundStatus : RoundFormed {
  Clock::time_point formed{};
};

struct JobSnapshot {
  JobFacts facts;
  JobState state = JobState::kRendezvous;
  Clock::time_point state_since{};
  std::optional<RoundStatus> round;
  int rounds_formed = 0;
  JobCounts job;  // the job's restarts and membership changes
  std::map<RestartCause, std::uint64_t> restarts;
  std::map<ExitReason, std::uint64_t> exits;
  std::uint64_t hangs = 0;
  std::vector<MemberStatus> members;
  std::vector<RankStatus> ranks;
  std::map<int, double> scores;  // rank -> straggler score
  std::vector<int> stragglers;
  std::deque<JobEvent> events;  // oldest first, at most kMaxEvents
  std::optional<IncidentStatus> incident;
  // When the agent's thread last wrote the board, and whether it is inside a
  // call known to block for long (the rendezvous).
  Clock::time_point last_update{};
  bool in_rendezvous = false;
  // Why the last health check before a join failed; empty when it passed
  // (or none ran).
  std::string health_check_failure;

  static constexpr std::size_t kMaxEvents = 200;
};

// Moves `job` to `state`; state_since is the update's time when it changes
// (call it inside JobBoard::update).
void set_state(JobSnapshot& job, JobState state);

class JobBoard {
 public:
  explicit JobBoard(const Runtime& runtime) : runtime_(runtime) {}

  // Stamps last_update with now, then changes the snapshot, under the lock.
  void update(const std::function<void(JobSnapshot&)>& change);
  // Appends an event stamped now (the oldest go past kMaxEvents). Throws
  // std::logic_error when `kind` is not one of kEventKinds.
  void event(std::string kind, std::string text);
  JobSnapshot snapshot() const;
  const Runtime& runtime() const { return runtime_; }

 private:
  const Runtime& runtime_;
  mutable std::mutex mutex_;
  JobSnapshot snapshot_;
};

// /livez and /readyz: etcd's convention, 200 or 503 with a one-line JSON reason.
struct Health {
  bool ok = false;
  std::string reason;  // empty when ok
  std::string json() const;
};
// Live unless the agent's thread has written nothing for `stuck_after`
// while not waiting in the rendezvous.
Health liveness(const JobSnapshot& job, Clock::time_point now, Millis stuck_after);
// Ready when this node runs its workers in a formed round.
Health readiness(const JobSnapshot& job);

// /status: one JSON document (the schema is in docs/using.md, "Live view").
std::string status_json(const JobSnapshot& job, Clock::time_point now, std::time_t wall_now);

// /metrics: the job's families (ddprun_*) appended to `out`.
void write_job_metrics(const JobSnapshot& job, status_http::MetricsText& out);

}  // namespace ddp::agent
