// Health checks before a node joins a round (--health_check): a user command
// run through /bin/sh -c in a process group of its own, launched through the
// agent's event loop (so the agent stays responsive to signals while it
// runs), killed with its group when it outlives its timeout. A node whose
// check fails does not join: it says why, its live view answers not ready
// naming the check, and it tries again after an exponential back-off, until
// the rendezvous' join_timeout since its first try of this join has passed.
//
// Ownership: HealthGate holds references to the options, the loop, the
// runtime and the events; all must outlive it. Blocking: HealthGate::pass
// blocks in the event loop (the check's run and the back-off waits).
// Thread-safety: the agent's thread only. Errors: pass() throws what the
// loop's launch() throws (the shell cannot be started, the output file is
// refused); a failing check is no error.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ddp/agent/agent_events.h"
#include "ddp/agent/worker_event_loop.h"
#include "ddp/agent/worker_spec.h"
#include "ddp/common/time.h"

namespace ddp::agent {

// What the check's command is told about the node, in its environment:
//   DDP_HEALTH_CHECK_NODE_RANK   node_rank, or "" when unknown
//   DDP_HEALTH_CHECK_ATTEMPT     attempt (1, 2, ... within one join)
//   DDP_HEALTH_CHECK_LAST_ROUND  last_round, or "" before the node's first round
//   LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID
struct HealthCheckFacts {
  std::optional<int> node_rank;  // group rank in the last round, else --node_rank
  int local_world_size = 1;
  std::string run_id;
  int attempt = 1;
  std::optional<int> last_round;
};

// `base` ("NAME=value" each) with the facts' variables set (replacing any of
// the same name).
std::vector<std::string> health_check_env(const std::vector<std::string>& base,
                                          const HealthCheckFacts& facts);

// How one run of the check ended.
struct HealthCheckResult {
  enum class Kind { kPassed, kFailed, kTimedOut, kInterrupted };
  Kind kind = Kind::kPassed;
  // kFailed: exit code (>= 0) or minus the signal that killed the command.
  int status = 0;
  // kInterrupted: the agent's handled signal that came while it ran.
  int signo = 0;
  // The end of its stdout and stderr together (at most kOutputTail bytes).
  std::string output;
  static constexpr std::size_t kOutputTail = 4096;
};

// One line for the log: the command, how it ended, and its output's tail.
std::string describe_failure(const std::string& command, const HealthCheckResult& result,
                             std::chrono::milliseconds timeout);

// The last `max_bytes` of the file at `path` ("" when it cannot be read).
std::string read_tail(const std::string& path, std::size_t max_bytes);

// The delays between tries: `initial`, then doubled, at most `max`.
class HealthCheckBackoff {
 public:
  HealthCheckBackoff(std::chrono::milliseconds initial, std::chrono::milliseconds max);
  std::chrono::milliseconds next();

 private:
  std::chrono::milliseconds next_;
  std::chrono::milliseconds max_;
};

// Runs the check until a node may join, or the job ends here.
class HealthGate {
 public:
  // `other_exit`: each exit event of a process the gate did not launch (a
  // worker kept for an in-place recovery), handed on as it comes.
  HealthGate(const HealthCheckOptions& options, WorkerEventLoop& loop, const Runtime& runtime,
             AgentEvents& events, std::function<void(const LoopEvent&)> other_exit);

  bool enabled() const { return !options_.command.empty(); }

  // Runs the check (each try's facts: `facts` with the attempt set) until it
  // passes (nullopt), or returns the agent's exit code: 128+signo when a
  // handled signal came (the check's group killed, reaped), 1 when it still
  // failed `give_up_after` after the first try (said as a notice).
  // `base_env`: the agent's environment ("NAME=value" each), the facts added.
  std::optional<int> pass(const std::vector<std::string>& base_env, HealthCheckFacts facts,
                          std::chrono::milliseconds give_up_after);

  // One run of the check with this environment; its output goes to
  // options.output_file (truncated) and back in the result.
  HealthCheckResult run_once(const std::vector<std::string>& env);

 private:
  // Handles events until `deadline`: a handled signal's number, if one came.
  std::optional<int> wait_until(Clock::time_point deadline);
  // Kills the check's group and waits for its exit.
  void kill_and_reap(int pid);

  const HealthCheckOptions& options_;
  WorkerEventLoop& loop_;
  const Runtime& runtime_;
  AgentEvents& events_;
  std::function<void(const LoopEvent&)> other_exit_;
};

}  // namespace ddp::agent
