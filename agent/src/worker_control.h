// The agent's side of its workers' control channels (ddp/worker_contract/worker_contract.h):
// one socket pair per worker, the worker's end inherited (DDP_CONTROL_FD), the
// agent's end kept here. A worker that recovers in place says hello; the
// agent then tells it when its round ends (abort) and which round comes next
// (round) instead of stopping it, and it reports how its re-form went
// (reformed, synced).
//
// Ownership: owns the agent's ends (and a worker's end until started()).
// Blocking: never (the sockets are read and written without waiting: a
// worker that does not read its channel until the socket's buffer is full
// gets kFull from send(), and the agent ends it as a failed worker).
// Thread-safety: the agent's thread only. Errors: prepare() throws
// InternalError when the kernel refuses a socket pair.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "ddp/worker_contract/control_channel.h"
#include "ddp/worker_contract/worker_contract.h"

namespace ddp::agent {

class WorkerControl {
 public:
  WorkerControl() = default;
  ~WorkerControl();
  WorkerControl(const WorkerControl&) = delete;
  WorkerControl& operator=(const WorkerControl&) = delete;

  // A new channel for the worker about to start at `local_rank` (replacing
  // that local rank's earlier one); returns the worker's end to inherit.
  int prepare(int local_rank);
  // The worker started (or could not): the agent closes the worker's end.
  void started(int local_rank);
  // The worker is gone: its channel goes.
  void forget(int local_rank);

  // Reads what every worker said since the last call. Never blocks.
  void poll();

  // Whether the worker at `local_rank` said it recovers in place.
  bool in_place(int local_rank) const;

  // What a worker reported of its re-form into the round expected (see
  // expect_reform), and of its state transfer in that round.
  std::optional<contract::Reformed> reformed(int local_rank) const;
  std::optional<contract::Synced> synced(int local_rank) const;
  // Forgets what the worker reported: its re-form into `round` is about to
  // start. From now on a report of another round (one sent before the worker
  // heard of this one) is stale, and dropped.
  void expect_reform(int local_rank, int round);

  // Sends to the worker at `local_rank` without blocking: kSent, kFull (the
  // worker has not read what it was sent before: a failed worker), kClosed
  // (the worker, or its channel, is gone), kRefused (the message cannot be
  // encoded: the agent's own error). Never throws.
  control::Sent send(int local_rank, const control::Message& message);

 private:
  struct Channel {
    int agent_fd = -1;
    int worker_fd = -1;  // until started()
    bool in_place = false;
    std::optional<int> expected_round;  // since expect_reform()
    std::optional<contract::Reformed> reformed;
    std::optional<contract::Synced> synced;
  };
  void close(Channel& channel);
  void take(Channel& channel, const control::Message& message);

  std::map<int, Channel> channels_;
};

}  // namespace ddp::agent
