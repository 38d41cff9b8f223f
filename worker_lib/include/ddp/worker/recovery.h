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
#pragma once

#include <string>

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

}  // namespace ddp
