// In-place recovery's part of init (ddp/worker/recovery.h): a round's store
// and groups, and what the agent's `round` message says of the round to join.
// reform() itself is in reform.cc. Internal to the worker library.
// Thread-safety: callers hold InitState's mutex.
#pragma once

#include <memory>
#include <string>

#include "ddp/store/store.h"
#include "ddp/worker/process_group.h"
#include "ddp/worker_contract/worker_contract.h"
#include "init_state.h"
#include "recovery/control_client.h"

namespace ddp::detail {

// The round the agent named (its `round` message), checked against what a
// kept worker is: a worker keeps its node and its slot on it. ProtocolError
// when the message is malformed or names another local rank.
contract::WorkerRound named_round(const ControlClient::NextRound& next, int local_rank);

// A group of the current round: with in-place recovery, aborted when the round ends.
std::shared_ptr<ProcessGroup> round_group(InitState& s, std::shared_ptr<ProcessGroup> group);

// The round's store: `base` inside `prefix`, its waits ended by the round's
// abort when this worker recovers in place.
std::shared_ptr<Store> round_store(const InitState& s, std::shared_ptr<Store> base,
                                   const std::string& prefix);

}  // namespace ddp::detail
