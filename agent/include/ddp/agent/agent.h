// The per-node agent: rendezvous, spawn the worker group, watch it, restart it
// (every node together, in a new round with a fresh store prefix) and report.
//
//   StderrPrinter printer;
//   Agent agent(options, rendezvous, loop, printer);
//   int exit_code = agent.run();
//
// run() blocks until the job ends and returns the process exit code: 0 on
// success (after the exit barrier), the root cause's exit code (or 128+signal)
// when restarts are exhausted, 128+signo when the agent got a handled signal,
// 1 when rendezvous fails or a worker cannot be started. It prints nothing
// itself: what users read (the failure report, notices, hang reports) goes to
// the AgentEvents it was given (ddprun: a StderrPrinter), and the live view
// gets the same events. It throws only when the event loop itself breaks
// (InternalError: epoll/signalfd failures). The agent uses the rendezvous handler's store to
// tell other agents to restart or stop ("<round prefix>/end") and watches that
// key on a thread of its own (only when there is more than one node). On a
// signal or a local failure it stops its own workers at once and tells the
// others in parallel, on another thread, waiting for the store at most
// AgentOptions::announce_timeout: a frozen or unreachable store never holds up
// Ctrl-C. A call still blocked then is abandoned (ddp::BackgroundCall), so the
// process should end soon after run() returns (ddprun calls _exit). Before
// returning, run() calls the handler's shutdown() (not when a rendezvous thread
// was left blocked by a signal). Not thread-safe: one thread constructs the
// agent and calls run().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/agent/agent_events.h"
#include "ddp/agent/worker_event_loop.h"
#include "ddp/agent/worker_spec.h"
#include "ddp/rendezvous/rendezvous.h"

namespace ddp::agent {

// The job's exit code when --max_no_progress_restarts stopped it (NVIDIA's
// fault-tolerant launcher uses the same for its own no-progress stop).
inline constexpr int kNoProgressExitCode = 93;

class Agent {
 public:
  // Borrows `rendezvous`, `loop` and `events`; they must outlive the
  // agent. `events` gets every event of the run (agent_events.h), from the
  // thread that calls run().
  Agent(AgentOptions options, RendezvousHandler& rendezvous, WorkerEventLoop& loop,
        AgentEvents& events);
  // As above, the events going to a StderrPrinter of its own.
  Agent(AgentOptions options, RendezvousHandler& rendezvous, WorkerEventLoop& loop);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  int run();

  // The restart count of the current (or last) attempt.
  int restart_count() const;

  // The port of the live view (AgentOptions::status) while run() runs, from
  // before the first round; nullopt when it is off, or before and after run().
  // The agent's thread only (an event loop callback may ask).
  std::optional<std::uint16_t> status_port() const;

  // Whether run() ended by printing a failure report: this node's workers
  // failed and no restarts were left. False before run() returns, and when
  // it ended otherwise (success, a signal, another node's failure, a
  // rendezvous error).
  bool reported_worker_failure() const;

  // The hang incident files run() wrote (paths below AgentOptions::run_log_dir).
  const std::vector<std::string>& incident_files() const;

 private:
  class Impl;
  std::unique_ptr<AgentEvents> printer_;  // the default printer, when none was given
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::agent
