// In-place recovery (ddp/worker/recovery.h): under ddprun, when a node is lost
// or joins, or a worker elsewhere is restarted, this process keeps running,
// re-forms its group, and the replicas are made identical again from the
// lowest rank that survived; a newcomer receives that state instead of
// training from a checkpoint.
#pragma once

#include <string>

#include "ddp/worker/replica_state.h"
#include "setup.h"

namespace ddp::examples {

// Registers what makes a replica in `t.replica`: the parameters, their
// momentum and `t.progress`. Every rank holds the same; the optimizer state
// stays identical after a sync because every rank applies the same averaged
// gradients. Call once, after wrap_in_ddp().
void register_replica_state(Training& t);

// Says what a sync of the replica state did: with --step-times a
// `state-sync ...` line on every rank, and on a rank that kept or received a
// live peer's state, from which rank, how much and where training stands.
void report_sync(const Training& t, const SyncResult& got);

// After a change of membership (`why`: what the caught ddp::GroupChanged
// said): waits for the next round, moves DDP onto the new group and makes the
// replicas identical again; re-forms again as long as the membership keeps
// changing meanwhile. The step that was interrupted is not counted on any
// rank. Rank 0 says how the group re-formed. Throws what ddp::reform() throws
// when the job ends or this worker is not in the next round.
void recover_in_place(Training& t, const std::string& why);

}  // namespace ddp::examples
