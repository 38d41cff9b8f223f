#include "job_status.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "hang_detector.h"

namespace ddp::agent {

namespace {

double seconds(Millis d) { return static_cast<double>(d.count()) / 1000.0; }
double seconds(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::duration<double>>(d).count();
}

std::string iso_time(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

nlohmann::json optional_seconds(const std::optional<Millis>& d) {
  return d ? nlohmann::json(seconds(*d)) : nlohmann::json(nullptr);
}

// Since the rank last completed a collective or a step: its last sign of progress.
std::optional<Millis> last_progress(const RankStatus& r) {
  if (!r.has_page) return std::nullopt;
  Millis best = r.since_step;
  for (const auto& g : r.groups) best = std::min(best, g.since_completed);
  return best;
}

const JobState kStates[] = {JobState::kRendezvous, JobState::kRunning,   JobState::kStopping,
                            JobState::kRestarting, JobState::kSucceeded, JobState::kFailed};
const RestartCause kCauses[] = {RestartCause::kWorkerFailure, RestartCause::kHang,
                                RestartCause::kNodeLost, RestartCause::kNodeJoined};
const ExitReason kReasons[] = {ExitReason::kSucceeded, ExitReason::kFailed, ExitReason::kSignaled,
                               ExitReason::kEndedByAgent, ExitReason::kStopped};
const char* const kMemberStates[] = {"self", "alive", "unreachable", "silent", "lost"};

template <typename Key>
std::uint64_t count_of(const std::map<Key, std::uint64_t>& counts, Key key) {
  auto it = counts.find(key);
  return it == counts.end() ? 0 : it->second;
}

}  // namespace

const char* to_string(JobState state) {
  switch (state) {
    case JobState::kRendezvous:
      return "rendezvous";
    case JobState::kRunning:
      return "running";
    case JobState::kStopping:
      return "stopping";
    case JobState::kRestarting:
      return "restarting";
    case JobState::kSucceeded:
      return "succeeded";
    case JobState::kFailed:
      return "failed";
  }
  return "unknown";
}

const char* to_string(RestartCause cause) {
  switch (cause) {
    case RestartCause::kWorkerFailure:
      return "worker_failure";
    case RestartCause::kHang:
      return "hang";
    case RestartCause::kNodeLost:
      return "node_lost";
    case RestartCause::kNodeJoined:
      return "node_joined";
  }
  return "unknown";
}

const char* to_string(ExitReason reason) {
  switch (reason) {
    case ExitReason::kSucceeded:
      return "succeeded";
    case ExitReason::kFailed:
      return "failed";
    case ExitReason::kSignaled:
      return "signaled";
    case ExitReason::kEndedByAgent:
      return "ended_by_agent";
    case ExitReason::kStopped:
      return "stopped";
  }
  return "unknown";
}

// ---- the board ----------------------------------------------------------------------------

void set_state(JobSnapshot& job, JobState state) {
  if (job.state != state) job.state_since = job.last_update;
  job.state = state;
}

void JobBoard::update(const std::function<void(JobSnapshot&)>& change) {
  const auto now = runtime_.now();
  std::lock_guard lock(mutex_);
  snapshot_.last_update = now;  // first: a change may stamp with it (state_since)
  change(snapshot_);
}

void JobBoard::event(std::string kind, std::string text) {
  if (std::find(kEventKinds.begin(), kEventKinds.end(), kind) == kEventKinds.end()) {
    throw std::logic_error("JobBoard::event: '" + kind + "' is not one of kEventKinds");
  }
  JobEvent e;
  e.wall = std::chrono::system_clock::to_time_t(runtime_.wall_now());
  e.at = runtime_.now();
  e.kind = std::move(kind);
  e.text = std::move(text);
  std::lock_guard lock(mutex_);
  e.round = snapshot_.round ? snapshot_.round->number : -1;
  snapshot_.events.push_back(std::move(e));
  while (snapshot_.events.size() > JobSnapshot::kMaxEvents) snapshot_.events.pop_front();
}

JobSnapshot JobBoard::snapshot() const {
  std::lock_guard lock(mutex_);
  return snapshot_;
}

// ---- health -------------------------------------------------------------------------------

std::string Health::json() const {
  return nlohmann::json{{"health", ok ? "true" : "false"}, {"reason", reason}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Health liveness(const JobSnapshot& job, Clock::time_point now, Millis stuck_after) {
  if (job.in_rendezvous || now - job.last_update <= stuck_after) return Health{true, ""};
  return Health{false, fmt::format("the agent's loop has not run for {:.1f} s",
                                   seconds(now - job.last_update))};
}

Health readiness(const JobSnapshot& job) {
  switch (job.state) {
    case JobState::kRunning:
      return Health{true, ""};
    case JobState::kRendezvous:
      if (!job.health_check_failure.empty()) {
        return Health{false, "not joining: " + job.health_check_failure};
      }
      return Health{false, job.rounds_formed == 0
                               ? "waiting for the other nodes (the first round has not formed)"
                               : "waiting for the other nodes to form the next round"};
    case JobState::kStopping:
      return Health{false, "stopping the workers"};
    case JobState::kRestarting:
      return Health{false, "restarting the workers"};
    case JobState::kSucceeded:
      return Health{false, "the job succeeded; no workers run"};
    case JobState::kFailed:
      return Health{false, "the job failed; no workers run"};
  }
  return Health{false, "unknown state"};
}

// ---- /status ------------------------------------------------------------------------------

namespace {

nlohmann::json members_json(const JobSnapshot& job) {
  using nlohmann::json;
  json members = json::array();
  for (const auto& m : job.members) {
    members.push_back({{"node", m.node},
                       {"host", m.host},
                       {"addr", m.addr},
                       {"ranks", m.ranks},
                       {"state", m.state},
                       {"last_heard_s", optional_seconds(m.last_heard)},
                       {"keep_alive_age_s", optional_seconds(m.keep_alive_age)},
                       {"lost_after_s", optional_seconds(m.lost_after)}});
  }
  return members;
}

nlohmann::json ranks_json(const JobSnapshot& job) {
  using nlohmann::json;
  json ranks = json::array();
  for (const auto& r : job.ranks) {
    auto score = job.scores.find(r.rank);
    ranks.push_back(
        {{"rank", r.rank},
         {"local_rank", r.local_rank},
         {"node", r.node},
         {"host", r.host.str()},
         {"pid", r.pid},
         {"state", to_string(r.state)},
         {"steps", r.steps},
         {"step_time_s", r.last_wall.count() > 0 ? json(seconds(r.last_wall)) : json(nullptr)},
         {"compute_s", r.compute.count() > 0 ? json(seconds(r.compute)) : json(nullptr)},
         {"straggler_score", score != job.scores.end() ? json(score->second) : json(nullptr)},
         {"straggler",
          std::find(job.stragglers.begin(), job.stragglers.end(), r.rank) != job.stragglers.end()},
         {"last_progress_s", optional_seconds(last_progress(r))},
         {"where", rank_position(r)},
         {"stale", r.stale}});
  }
  return ranks;
}

nlohmann::json events_json(const JobSnapshot& job, Clock::time_point now) {
  using nlohmann::json;
  json events = json::array();
  for (const auto& e : job.events) {
    events.push_back({{"time", iso_time(e.wall)},
                      {"age_s", seconds(now - e.at)},
                      {"round", e.round},
                      {"kind", e.kind},
                      {"text", e.text}});
  }
  return events;
}

}  // namespace

std::string status_json(const JobSnapshot& job, Clock::time_point now, std::time_t wall_now) {
  using nlohmann::json;
  const JobFacts& f = job.facts;
  const Health ready = readiness(job);
  json doc = {
      {"kind", "agent"},
      {"run_id", f.run_id},
      {"backend", f.backend},
      {"time", iso_time(wall_now)},
      {"uptime_s", seconds(now - f.started)},
      {"node",
       {{"host", f.host},
        {"addr", f.addr},
        {"group_rank", job.round ? json(job.round->group_rank) : json(nullptr)},
        {"pid", f.pid}}},
      {"nnodes", {{"min", f.min_nodes}, {"max", f.max_nodes}}},
      {"nproc_per_node", f.nproc_per_node},
      {"state", to_string(job.state)},
      {"state_s", seconds(now - job.state_since)},
      {"ready", ready.ok},
      {"ready_reason", ready.reason},
  };
  if (job.round) {
    const RoundStatus& r = *job.round;
    doc["round"] = {{"number", r.number},         {"attempt", r.attempt},
                    {"world_size", r.world_size}, {"group_world_size", r.group_world_size},
                    {"base_rank", r.base_rank},   {"formed_s_ago", seconds(now - r.formed)}};
  } else {
    doc["round"] = nullptr;
  }
  json causes = json::object();
  for (RestartCause c : kCauses) causes[to_string(c)] = count_of(job.restarts, c);
  // The job's counts (every node's), and this node's restarts and re-forms by cause.
  doc["restarts"] = {{"spent", job.job.restarts},
                     {"max", f.max_restarts},
                     {"membership_changes", job.job.membership_changes},
                     {"in_a_row_without_progress", job.job.restarts_without_progress},
                     {"by_cause", causes}};
  json exits = json::object();
  for (ExitReason r : kReasons) exits[to_string(r)] = count_of(job.exits, r);
  doc["worker_exits"] = exits;

  doc["members"] = members_json(job);
  doc["ranks"] = ranks_json(job);
  doc["events"] = events_json(job, now);

  if (job.incident) {
    const IncidentStatus& i = *job.incident;
    doc["incident"] = {{"kind", "hang"},       {"hang_kind", i.hang_kind},
                       {"summary", i.summary}, {"culprits", i.culprits},
                       {"node", i.node},       {"time", iso_time(i.wall)},
                       {"file", i.file}};
  } else {
    doc["incident"] = nullptr;
  }
  return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// ---- /metrics -----------------------------------------------------------------------------

namespace {

// The agent, its state and its round.
void write_state_metrics(const JobSnapshot& job, status_http::MetricsText& out) {
  const JobFacts& f = job.facts;
  out.family("ddprun_info", "gauge",
             "This agent: its run id, rendezvous backend, host and address (always 1)");
  out.sample("ddprun_info",
             {{"run_id", f.run_id}, {"backend", f.backend}, {"host", f.host}, {"addr", f.addr}}, 1);

  out.family("ddprun_state", "gauge", "Where this agent is in the job: 1 for its state, 0 others");
  for (JobState s : kStates) {
    out.sample("ddprun_state", {{"state", to_string(s)}}, job.state == s ? 1 : 0);
  }
  out.family("ddprun_ready", "gauge", "1 when this node runs its workers in a formed round");
  out.sample("ddprun_ready", readiness(job).ok ? 1 : 0);

  out.family("ddprun_round", "gauge", "The number of the round this node runs in (-1: none yet)");
  out.sample("ddprun_round", job.round ? job.round->number : -1);
  out.family("ddprun_rounds_formed_total", "counter", "Rounds this node ran workers in");
  out.sample("ddprun_rounds_formed_total", job.rounds_formed);
  out.family("ddprun_round_nodes", "gauge", "Nodes in the current round");
  out.sample("ddprun_round_nodes", job.round ? job.round->group_world_size : 0);
  out.family("ddprun_world_size", "gauge", "Worker ranks in the current round (WORLD_SIZE)");
  out.sample("ddprun_world_size", job.round ? job.round->world_size : 0);
}

// The members, restarts, exits, hangs and keep-alives.
void write_member_metrics(const JobSnapshot& job, status_http::MetricsText& out) {
  const JobFacts& f = job.facts;
  out.family("ddprun_members", "gauge",
             "Nodes as this node sees them: the current round's, and the last 16 nodes lost "
             "from earlier rounds (state lost)");
  for (const char* state : kMemberStates) {
    const auto n = std::count_if(job.members.begin(), job.members.end(),
                                 [&](const MemberStatus& m) { return m.state == state; });
    out.sample("ddprun_members", {{"state", state}}, static_cast<double>(n));
  }

  out.family("ddprun_restarts_total", "counter",
             "Times the worker group was restarted or re-formed, by cause");
  for (RestartCause c : kCauses) {
    out.sample("ddprun_restarts_total", {{"cause", to_string(c)}},
               static_cast<double>(count_of(job.restarts, c)));
  }
  out.family("ddprun_job_restarts", "gauge",
             "Restarts the job spent, counted once per restart across every node");
  out.sample("ddprun_job_restarts", job.job.restarts);
  out.family("ddprun_job_membership_changes", "gauge",
             "Times the job re-formed for a node lost or admitted, across every node");
  out.sample("ddprun_job_membership_changes", job.job.membership_changes);
  out.family("ddprun_max_restarts", "gauge",
             "Restarts a worker failure may spend (--max_restarts)");
  out.sample("ddprun_max_restarts", f.max_restarts);
  out.family("ddprun_worker_exits_total", "counter", "Exits of this node's workers, by reason");
  for (ExitReason r : kReasons) {
    out.sample("ddprun_worker_exits_total", {{"reason", to_string(r)}},
               static_cast<double>(count_of(job.exits, r)));
  }
  out.family("ddprun_hangs_total", "counter", "Hangs this node reported");
  out.sample("ddprun_hangs_total", static_cast<double>(job.hangs));

  out.family("ddprun_keepalive_age_seconds", "gauge",
             "Since the keep-alive of the node this one judges last moved");
  out.family("ddprun_keepalive_lost_after_seconds", "gauge",
             "How long without a keep-alive declares the judged node lost");
  for (const auto& m : job.members) {
    const std::string node = std::to_string(m.node);
    if (m.keep_alive_age) {
      out.sample("ddprun_keepalive_age_seconds", {{"node", node}}, seconds(*m.keep_alive_age));
    }
  }
  for (const auto& m : job.members) {
    if (m.lost_after) {
      out.sample("ddprun_keepalive_lost_after_seconds", {{"node", std::to_string(m.node)}},
                 seconds(*m.lost_after));
    }
  }
  out.family("ddprun_node_last_heard_seconds", "gauge",
             "Since each other node's progress summary last changed");
  for (const auto& m : job.members) {
    if (m.last_heard && m.state != "self") {
      out.sample("ddprun_node_last_heard_seconds",
                 {{"node", std::to_string(m.node)}, {"host", m.host}}, seconds(*m.last_heard));
    }
  }
}

// Each rank's progress and straggler score.
void write_rank_metrics(const JobSnapshot& job, status_http::MetricsText& out) {
  auto rank_labels = [](const RankStatus& r) {
    return status_http::Labels{{"rank", std::to_string(r.rank)}, {"node", std::to_string(r.node)}};
  };
  out.family("ddprun_rank_running", "gauge", "1 while the rank's worker runs");
  for (const auto& r : job.ranks) {
    out.sample("ddprun_rank_running", rank_labels(r),
               r.state == RankStatus::State::kRunning ? 1 : 0);
  }
  out.family("ddprun_rank_last_progress_seconds", "gauge",
             "Since the rank last completed a collective or a DDP step");
  for (const auto& r : job.ranks) {
    if (auto p = last_progress(r)) {
      out.sample("ddprun_rank_last_progress_seconds", rank_labels(r), seconds(*p));
    }
  }
  out.family("ddprun_rank_step_seconds", "gauge",
             "Wall time of the rank's last synchronized DDP step");
  for (const auto& r : job.ranks) {
    if (r.last_wall.count() > 0) {
      out.sample("ddprun_rank_step_seconds", rank_labels(r), seconds(r.last_wall));
    }
  }
  out.family("ddprun_rank_step_compute_seconds", "gauge",
             "Smoothed compute time of the rank's synchronized steps (waiting excluded)");
  for (const auto& r : job.ranks) {
    if (r.compute.count() > 0) {
      out.sample("ddprun_rank_step_compute_seconds", rank_labels(r), seconds(r.compute));
    }
  }
  out.family("ddprun_rank_steps", "gauge", "DDP steps the rank finished in this round");
  for (const auto& r : job.ranks) {
    if (r.has_page) out.sample("ddprun_rank_steps", rank_labels(r), static_cast<double>(r.steps));
  }
  out.family("ddprun_rank_straggler_score", "gauge",
             "The fastest rank's compute time per step over this rank's (1 = fastest)");
  for (const auto& r : job.ranks) {
    auto it = job.scores.find(r.rank);
    if (it != job.scores.end()) {
      out.sample("ddprun_rank_straggler_score", rank_labels(r), it->second);
    }
  }
}

}  // namespace

void write_job_metrics(const JobSnapshot& job, status_http::MetricsText& out) {
  write_state_metrics(job, out);
  write_member_metrics(job, out);
  write_rank_metrics(job, out);
}

}  // namespace ddp::agent
