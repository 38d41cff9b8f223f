// The live view's feed: what the agent's events and its progress watch say,
// written on the board (job_status.h) that the status endpoint
// (--status_port) serves. It implements AgentEvents (the agent's fan-out
// calls it after the printer) and adds what only the live view shows: the
// job's facts, the endpoint, and the round's members and ranks refreshed at
// each look.
//
// Ownership: borrows the options, the rendezvous handler and the progress
// watch (they must outlive it); owns the board and the endpoint. Blocking:
// start() binds the endpoint's socket; nothing else blocks. Thread-safety:
// the agent's thread only (the endpoint's thread reads the board, which is
// thread-safe). Errors: start() returns false after telling `notices` why.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "ddp/agent/agent_events.h"
#include "ddp/agent/worker_spec.h"
#include "ddp/rendezvous/rendezvous.h"
#include "job_status.h"
#include "progress_watch.h"
#include "status_endpoint.h"

namespace ddp::agent {

class LiveViewFeed final : public AgentEvents {
 public:
  LiveViewFeed(const AgentOptions& options, RendezvousHandler& rendezvous, ProgressWatch& watch);

  // Fills the board's facts and starts the endpoint when asked for; false
  // (after telling `notices` why) when it cannot listen.
  bool start(AgentEvents& notices);
  // Stops the endpoint (the board stays).
  void stop() { status_.reset(); }
  std::optional<std::uint16_t> port() const;
  // What the agent knows, as the endpoint serves it.
  const JobBoard& board() const { return board_; }

  // The round this node runs in now (must live until the next follow()).
  void follow(const Round& round) { round_ = &round; }
  // What the agent knows now of every member and rank of the round.
  void refresh();

  void joining() override;
  void health_check(const std::string& failure) override;
  void round_formed(const RoundFormed& round) override;
  void workers_running() override;
  void workers_stopping() override;
  void membership_changed(const MembershipChange& change) override;
  void worker_exited(const WorkerExit& exit) override;
  void worker_failed(const WorkerExit& exit) override;
  void restarting(const Restart& restart) override;
  void hang(const HangReport& hang) override;
  void recovering(const std::string& why) override;
  void recovered(const std::string& line) override;
  void job_ended(int exit_code) override;

 private:
  std::vector<MemberStatus> round_members() const;

  const AgentOptions& options_;
  RendezvousHandler& rdzv_;
  ProgressWatch& watch_;
  const Round* round_ = nullptr;
  KeepAliveProbe keep_alives_;  // null: the handler shows none
  // What the agent knows, and its endpoint (--status_port).
  JobBoard board_;
  std::unique_ptr<StatusEndpoint> status_;
  // Nodes declared lost in the current round; members of earlier rounds that
  // were lost (listed until the job ends, at most 16).
  std::set<int> lost_nodes_;
  std::vector<MemberStatus> lost_members_;  // of the current round, as last seen
  std::vector<MemberStatus> departed_;
};

}  // namespace ddp::agent
