// In-place recovery as the agent runs it: when the round ends elsewhere (a
// node lost or joining, another node's restart) and every local worker runs
// and said it recovers in place, each is told that its round ended (its
// collectives fail at once) and keeps running into the next round, where the
// worker group resumes it. Once the kept workers report their re-form and
// state transfer (control channel), one line says how the recovery went.
//
// Ownership: borrows the options, the rendezvous parameters, the worker group
// and the events (they must outlive it). Blocking: never. Thread-safety: the
// agent's thread only. Errors: none thrown.
#pragma once

#include <optional>
#include <string>

#include "ddp/agent/agent_events.h"
#include "ddp/agent/worker_spec.h"
#include "ddp/rendezvous/rendezvous.h"
#include "worker_group.h"

namespace ddp::agent {

class InPlaceRecovery {
 public:
  InPlaceRecovery(const AgentOptions& options, const RendezvousParams& params, WorkerGroup& group,
                  AgentEvents& events);

  // Whether this node's workers are kept through the round's `end`: every
  // local worker runs, recovers in place and was told the round ended (a
  // restart also needs a restart left). False: they are stopped and started
  // again as usual.
  bool keep_workers_through(const RoundEnd& end);
  // The new round formed (with the workers kept, when they were).
  void round_formed(const RendezvousInfo& info);
  // Reports how the recovery went once every kept worker reported its state
  // transfer (or, with `final`, whatever was reported by the end of the round).
  void report(bool final);
  // The round ends: reports what is known; a reported recovery is done.
  void finish_report();
  // A recovery waits to be reported (the agent keeps looking).
  bool pending() const { return recovery_ && !recovery_->reported; }

 private:
  std::string describe_report() const;

  const AgentOptions& options_;
  const RendezvousParams& params_;
  WorkerGroup& group_;
  AgentEvents& events_;
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

}  // namespace ddp::agent
