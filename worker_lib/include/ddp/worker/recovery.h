// In-place recovery: a worker that keeps its process, and what it holds in
// memory, through a change of the job's membership (a node lost or joined, a
// worker restarted on another node).
//
//   ddp::InitOptions init;
//   init.recover_in_place = true;                 // the opt-in
//   ddp::init_process_group(init);
//   ... the model, DistributedDataParallel, ddp::ReplicaState (replica_state.h) ...
//   state.sync(*ddp::default_group());            // a newcomer receives the state here
//   for (;;) {
//     try {
//       ... one training step ...
//     } catch (const ddp::GroupChanged&) {       // the round ended under this step
//       ddp::reform();                            // the next round: rank, world size, groups
//       ddp_model.reform(ddp::default_group());   // a new Reducer on the new group
//       state.sync(*ddp::default_group());        // every replica identical again
//     }                                           // the interrupted step is not counted
//   }
//
// When it applies: under ddprun, whose agent passes each worker a control
// channel (DDP_CONTROL_FD, ddp/worker_contract/worker_contract.h). With the opt-in the
// library says so on the channel and reads it on a thread of its own; when the
// round ends, the agent tells this worker instead of stopping it, and the
// library aborts every group it made (ProcessGroup::abort): whatever the
// program waits in fails at once with GroupChanged. Without the opt-in, or
// without an agent (env://, a process of its own), nothing changes: the
// agent stops and restarts workers as torchrun does.
//
// Thread-safety: reform() belongs to the training thread (like
// init_process_group) and must not run while the program issues collectives
// on other threads. Groups made with new_group() are gone after reform():
// make them again, in the same order on every rank.
//
// A program that makes its groups itself instead of through
// init_process_group (ddp_torch, the torch.distributed backend "ddp") takes
// the same steps one at a time through ddp::in_place below.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "ddp/store/store.h"
#include "ddp/worker/process_group.h"
#include "ddp/worker_contract/worker_contract.h"

namespace ddp {

// Whether this worker recovers in place: it opted in and its agent offers a
// control channel. Never blocks.
bool recovers_in_place();

struct Reformed {
  int round = 0;  // the rendezvous round joined
  int rank = 0;   // this worker's rank in it
  int world_size = 0;
  int group_rank = 0;  // this node's rank among the round's nodes, and their number
  int group_world_size = 0;
  int restart_count = 0;  // restarts the job spent so far (TORCHELASTIC_RESTART_COUNT)
  // The round's MASTER_ADDR:MASTER_PORT, for a program that also re-forms
  // PyTorch's own env:// group.
  std::string master_addr;
  int master_port = 0;
  int previous_rank = 0;  // and in the round that ended
  int previous_world_size = 0;
  double seconds = 0;  // reform()'s own time: waiting for the agent, making the group
  // Why the last round ended, as the agent said it ("node 2 (member ...) was
  // lost: it missed its keep-alives"); empty when it gave no reason.
  std::string why;
};

// Joins the next round: waits until the agent names it (at most
// InitOptions::timeout), destroys the groups of the round that ended, and
// makes the new default group (collective: every worker of the new round
// makes it, survivors here and newcomers in init_process_group). rank(),
// world_size(), default_group() and job_store() then describe the new round.
// Throws GroupChanged when yet another change came meanwhile (call it again),
// ShutdownError when the agent went away, TimeoutError, and InvalidArgument
// when this worker does not recover in place. A worker that cannot re-form
// should exit with an error: its agent starts a new process in its place,
// which joins as a newcomer.
Reformed reform();

// In-place recovery for a program that makes its own groups (the torch
// backend: torch's env:// store, its own Gloo groups). The same channel and
// the same rules as above:
//
//   in_place::open();                          // the opt-in: once, before any group
//   group = make_gloo_process_group(in_place::round_store(store), ..., options
//                                   with on_failure = in_place::failure_explainer());
//   in_place::track(group);                    // aborted when the round ends
//   ... a collective fails with GroupChanged ...
//   round = in_place::wait_next_round(timeout);// then make the new round's groups
//   in_place::report_reformed(round, wait_s, build_s);
//
// Thread-safety: every function may be called from any thread.
// ddp::init_process_group with recover_in_place uses the same channel: a
// process that does both shares one.
namespace in_place {

// Opens the agent's control channel (DDP_CONTROL_FD) and says hello: from now
// on, the agent keeps this worker when the round ends and tells it instead.
// Once per process: later calls return what the first did. False (nothing
// changes: the agent restarts this worker) when the environment is not a
// ddprun agent's (no round, no control channel). Never blocks; throws
// InvalidArgument when ddprun's variables are malformed.
bool open();
// Whether open() opened the channel. Never blocks.
bool is_open();

// Where this worker stands: the round it is in, and whether that ended.
struct RoundNow {
  // Counts the rounds this worker joined through wait_next_round(): 0 for
  // the one it started in. Identifies a round (its number may be unknown).
  int generation = 0;
  // The round's number as the agent named it (wait_next_round) or said it
  // when it ended; -1 while unknown (the round this worker started in).
  int number = -1;
  bool ended = false;  // the agent ended it (or went away)
  std::string why;     // the agent's words, when ended
};
// Never blocks. Without an open channel: generation 0, never ended.
RoundNow current_round();
// The number of the round of `generation` (see RoundNow::number); -1 when
// unknown or out of range.
int round_number(int generation);

// Aborts `group` (ProcessGroup::abort: every operation fails with
// GroupChanged) when the current round ends; at once when it already has.
// Holds only a weak reference. Does nothing without an open channel.
void track(const std::shared_ptr<ProcessGroup>& group);

// For GlooOptions::on_failure: a failed collective waits up to the round's
// grace for the agent's word and then reads GroupChanged when the round
// ended. Empty without an open channel.
std::function<std::exception_ptr(std::exception_ptr)> failure_explainer();

// `base` with its blocking calls ended by GroupChanged once the current
// round ends (so making a group does not wait for peers that will not come);
// `base` itself without an open channel.
std::shared_ptr<Store> round_store(std::shared_ptr<Store> base);

// Waits (at most `timeout`) until the agent names the next round, and makes
// it the current one: its groups are made next, and tracked. Returns it as
// the agent said it (contract::environment_of gives its variables). Throws
// InvalidArgument without an open channel, ShutdownError when the agent went
// away, TimeoutError, ProtocolError when the message is malformed or names
// another local rank.
contract::WorkerRound wait_next_round(std::chrono::milliseconds timeout);

// Tells the agent that this worker's groups are re-formed for `round`
// (waiting for it took `wait_seconds`, making the groups `build_seconds`).
// Never blocks; false (with a warning) when the agent could not be told.
bool report_reformed(const contract::WorkerRound& round, double wait_seconds, double build_seconds);

}  // namespace in_place

}  // namespace ddp
