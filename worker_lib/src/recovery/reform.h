// In-place recovery's part of init (ddp/worker/recovery.h): a round's store
// and groups, and what the agent's `round` message says of the round to join.
// reform() itself is in reform.cc. Internal to the worker library.
// Thread-safety: callers hold InitState's mutex.
#pragma once

#include <memory>
#include <string>

#include "ddp/common/control_channel.h"
#include "ddp/store/store.h"
#include "ddp/worker/process_group.h"
#include "init_state.h"

namespace ddp::detail {

// What the agent's `round` message says of the round to join.
struct RoundFacts {
  int round = 0;
  int rank = 0;
  int world_size = 0;
  std::string store_addr;
  int store_port = 0;
  std::string store_prefix;
};

// Reads the agent's `round` message; ProtocolError when a field is missing or invalid.
RoundFacts round_facts(const control::Message& m);

// A group of the current round: with in-place recovery, aborted when the round ends.
std::shared_ptr<ProcessGroup> round_group(InitState& s, std::shared_ptr<ProcessGroup> group);

// The round's store: `base` inside `prefix`, its waits ended by the round's
// abort when this worker recovers in place.
std::shared_ptr<Store> round_store(const InitState& s, std::shared_ptr<Store> base,
                                   const std::string& prefix);

}  // namespace ddp::detail
