// A node that arrives at a full round (max_nodes) waits behind it as a spare:
// the round it joined forms only once the full one ends. It waits as long as
// the full round runs, and no longer: a round whose members all died (a
// crashed job) has nobody left to end it, so the spare ends it "lost".
//
// Thread-safety: used by the handler's thread only. Errors: the store's, and
// ShutdownError when the job ended while this node waited.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "ddp/store/store.h"
#include "dynamic_keys.h"
#include "liveness.h"
#include "membership.h"

namespace ddp::rendezvous_detail {

class SpareWait {
 public:
  // Waits behind round `full_round` of the run `keys` names.
  SpareWait(const RunKeys& keys, int full_round)
      : keys_(keys), round_(full_round), prefix_(keys.round(full_round)) {}

  // One look that never waits: the full round's end once it ended (ending it
  // "lost" when none of its members shows a sign of life, by `liveness`, at
  // `now`), else nullopt. Throws ShutdownError when the job's keys are gone
  // (the last agent to leave deletes them).
  std::optional<std::string> look(Store& store, Liveness& liveness, Clock::time_point now);

  // Waits up to `wait` (real time) for the full round's end, keeping its
  // value (at the job's end the store's host leaves at once). Throws
  // ShutdownError when the store went away.
  void wait(Store& store, Duration wait);

 private:
  RunKeys keys_;
  int round_;
  std::string prefix_;
  std::optional<std::string> end_;
  // What the looks saw of the members' keep-alives.
  std::map<std::string, HeartbeatTracker> seen_;
};

}  // namespace ddp::rendezvous_detail
