// The worker's side of the agent's control channel (ddp/worker_contract/worker_contract.h),
// for in-place recovery (ddp/worker/recovery.h): opened once by
// init_process_group when the program opts in and the agent passed
// DDP_CONTROL_FD. A thread of its own reads it: an `abort` (or the agent
// going away) sets the current round's AbortSignal and aborts every
// group tracked for that round at once; a `round` is kept until reform()
// takes it.
//
// Ownership: the channel and its reader live as long as the process (the
// agent sees it close when the process exits). Blocking: wait_next_round() only
// (send() never waits for the agent to read). Thread-safety: every method
// may be called from any thread.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "ddp/worker/process_group.h"
#include "ddp/worker_contract/control_channel.h"
#include "ddp/worker_contract/worker_contract.h"
#include "recovery/abortable_store.h"

namespace ddp::detail {

class ControlClient {
 public:
  // Opens the channel named by DDP_CONTROL_FD, says hello (in_place=1) and
  // starts reading; null when there is none or it is not an agent's control
  // socket (a SOCK_SEQPACKET Unix socket). `change_grace`: how long a failed
  // collective waits for the agent's word that the round ended (the round's
  // change_grace; at most 600 s is used). Once per process: later calls
  // return the same client (or null).
  static ControlClient* open(std::chrono::milliseconds change_grace);
  // The open client, or null.
  static ControlClient* get();

  // The signal of the round this worker is in (or joins).
  std::shared_ptr<AbortSignal> signal();
  // Aborts `group` when the current round ends (at once when it already has).
  void track(const std::shared_ptr<ProcessGroup>& group);

  struct NextRound {
    // The agent's `round`; nullopt when its message was malformed.
    std::optional<contract::WorkerRound> round;
    std::shared_ptr<AbortSignal> signal;  // ends it; now the current signal
  };
  // Waits until the agent names the next round (at most `timeout`) and makes
  // it the current one. Throws ShutdownError when the agent went away,
  // TimeoutError.
  NextRound wait_next_round(std::chrono::milliseconds timeout);
  // The number of the round this worker is in, as the agent named it last;
  // -1 before it named one (the worker started in its round).
  int round();

  // The round this worker is in (ddp::in_place::RoundNow): its generation (0
  // for the one it started in, +1 for each wait_next_round), its number as
  // named or as the agent's `abort` said it (-1 while unknown), whether it
  // ended and why.
  struct Current {
    int generation = 0;
    int number = -1;
    bool ended = false;
    std::string why;
  };
  Current current();
  // The number of the round of `generation`; -1 when unknown or out of range.
  int round_number(int generation);

  // Tells the agent (a message of worker_contract.h, encoded); false (with a
  // warning when the channel is full) when it could not: the agent is gone, or
  // has not read what it was told before. Never blocks, never throws.
  bool send(const control::Message& message);

  // A collective of the current round failed with `error` (a peer's
  // connection broke, a timeout): when a node dies its peers' collectives
  // fail before the agents' verdict. Waits up to the agent's grace
  // (DDP_CHANGE_GRACE_MS, or a round's grace_ms) for the round to end, and
  // returns GroupChanged when it did, else `error` as it is. A GroupChanged
  // is returned at once.
  std::exception_ptr explain(std::exception_ptr error);

 private:
  ControlClient(int fd, std::chrono::milliseconds change_grace);
  void read_loop();
  // The current round ended: sets its signal, aborts its groups.
  void end_round(const std::string& why);
  // The agent's `abort` (nullopt: unreadable) for the current round, or for
  // the next one when it was named but not joined yet.
  void on_abort(const std::optional<contract::Abort>& abort);

  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace ddp::detail
