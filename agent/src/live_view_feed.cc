#include "live_view_feed.h"

#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "ddp/agent/failure_report.h"

namespace ddp::agent {

LiveViewFeed::LiveViewFeed(const AgentOptions& options, RendezvousHandler& rendezvous,
                           ProgressWatch& watch)
    : options_(options), rdzv_(rendezvous), watch_(watch), board_(*options.runtime) {
  // The keep-alive ages the handler shows (a handler of dynamic membership only).
  rdzv_.observe_keep_alives([this](KeepAliveProbe probe) { keep_alives_ = std::move(probe); });
}

bool LiveViewFeed::start(AgentEvents& notices) {
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
    f.started = options_.runtime->now();
    set_state(job, JobState::kRendezvous);
  });
  if (!options_.status.port) return true;
  try {
    status_ = std::make_unique<StatusEndpoint>(options_.status, rdzv_.store_token(), board_,
                                               stuck_after(options_));
  } catch (const std::exception& e) {
    notices.notice(std::string("cannot serve the live view (--status_port): ") + e.what());
    return false;
  }
  // Printed whatever the log level: with --status_port=0 it is how one learns the port.
  notices.notice(
      fmt::format("live view at {} (/metrics, /status, /livez, /readyz){}", status_->url(),
                  status_->token_required() ? "; clients must carry the store's token" : ""));
  return true;
}

std::optional<std::uint16_t> LiveViewFeed::port() const {
  if (!status_) return std::nullopt;
  return status_->port();
}

void LiveViewFeed::joining() {
  board_.update([](JobSnapshot& job) {
    set_state(job, JobState::kRendezvous);
    job.in_rendezvous = true;
  });
}

void LiveViewFeed::health_check(const std::string& failure) {
  board_.update([&failure](JobSnapshot& job) { job.health_check_failure = failure; });
}

void LiveViewFeed::round_formed(const RoundFormed& info) {
  const RoundStatus r{info, options_.runtime->now()};
  board_.update([&](JobSnapshot& job) {
    job.round = r;
    job.job = info.job;
    ++job.rounds_formed;
    job.in_rendezvous = false;
    job.members.clear();
    job.ranks.clear();
    job.scores.clear();
    job.stragglers.clear();
  });
  board_.event(
      "round_formed",
      fmt::format("round {} formed: {} node{}, world size {}; this node is node {}", info.number,
                  info.group_world_size, info.group_world_size == 1 ? "" : "s", info.world_size,
                  info.group_rank));
  refresh();
}

void LiveViewFeed::workers_running() {
  board_.update([](JobSnapshot& job) { set_state(job, JobState::kRunning); });
}

void LiveViewFeed::workers_stopping() {
  board_.update([](JobSnapshot& job) { set_state(job, JobState::kStopping); });
}

// The current round's members as the agent knows them now, by group rank.
std::vector<MemberStatus> LiveViewFeed::round_members() const {
  const RendezvousInfo& info = round_->info();
  std::vector<MemberStatus> members;
  MemberStatus self;
  self.node = info.group_rank;
  self.host = options_.hostname;
  self.addr = rdzv_.params().local_addr;
  for (int i = 0; i < options_.spec.local_world_size; ++i) self.ranks.push_back(info.base_rank + i);
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

void LiveViewFeed::refresh() {
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
void LiveViewFeed::membership_changed(const MembershipChange& change) {
  if (!change.lost) {
    board_.event("node_joined", change.what);
    return;
  }
  lost_nodes_.insert(change.node);
  // It stays listed as lost once the next round forms without it.
  std::string host;
  for (const auto& m : round_members()) {
    if (m.node != change.node) continue;
    lost_members_.push_back(m);
    lost_members_.back().state = "lost";
    if (!m.host.empty()) host = " (" + m.host + ")";
  }
  refresh();
  board_.event("node_lost",
               fmt::format("node {}{} was declared lost: {}", change.node, host, change.what));
}

void LiveViewFeed::worker_exited(const WorkerExit& exit) {
  board_.update([&](JobSnapshot& job) { ++job.exits[exit.reason]; });
}

void LiveViewFeed::worker_failed(const WorkerExit& exit) {
  board_.event(
      "worker_failed",
      fmt::format("rank {} (node {}, pid {}) failed with {}", exit.rank, exit.node, exit.pid,
                  exit.status < 0 ? signal_name(-exit.status)
                                  : "exit code " + std::to_string(exit.status)));
}

void LiveViewFeed::restarting(const Restart& restart) {
  const RestartCause cause = restart.cause;
  board_.update([&](JobSnapshot& job) {
    ++job.restarts[cause];
    job.job = restart.job;
    set_state(job, JobState::kRestarting);
  });
  if (cause == RestartCause::kWorkerFailure || cause == RestartCause::kHang) {
    board_.event("restart", fmt::format("restarting the worker group ({}/{} restarts{})",
                                        restart.job.restarts, restart.max_restarts,
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

void LiveViewFeed::hang(const HangReport& hang) {
  const IncidentStatus& incident = hang;
  board_.update([&](JobSnapshot& job) {
    ++job.hangs;
    job.incident = incident;
  });
  board_.event("hang", "hang (" + incident.hang_kind + "): " + incident.summary);
}

void LiveViewFeed::recovering(const std::string& why) {
  board_.event("in_place", "keeping the workers through the re-form (in-place recovery): " + why);
}

void LiveViewFeed::recovered(const std::string& line) { board_.event("recovered", line); }

void LiveViewFeed::job_ended(int code) {
  board_.update([&](JobSnapshot& job) {
    set_state(job, code == 0 ? JobState::kSucceeded : JobState::kFailed);
  });
  board_.event(
      code == 0 ? "done" : "failed",
      code == 0 ? "the job succeeded" : "the job ended with exit code " + std::to_string(code));
}

}  // namespace ddp::agent
