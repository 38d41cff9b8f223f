// One node's join of a dynamic round as a state record, and every decision
// made from it as a pure function of the state and the time: whether this
// node decides, which arrival records to read, whether a missing record may
// still come, what to publish, what to wait for next, and when the join has
// timed out. No store, no clock, no thread: tested with plain values
// (join_state_test.cc). The executor (dynamic_rendezvous.cc) reads the store
// into the state and performs what these decide.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/time.h"
#include "ddp/rendezvous/rendezvous.h"
#include "membership.h"
#include "records.h"

namespace ddp::rendezvous_detail {

// A decider waits this long for the record of an arrival whose index was
// taken: a node writes it right after, so a longer silence means the node
// died in between (or the count was bumped by someone else).
inline constexpr Duration kRecordGrace = std::chrono::seconds(5);

// What the join's decisions depend on (RendezvousParams).
struct JoinRules {
  RoundRule nodes;
  Duration join_timeout{600'000};
  Duration last_call_timeout{30'000};
  // Every node's verdict time: keep_alive_interval x keep_alive_max_attempt.
  Duration verdict{15'000};
};

struct JoinState {
  int round = 0;
  // This node's arrival index (a counter anyone may add to: not narrowed).
  std::int64_t index = -1;
  Clock::time_point deadline;
  // From when this node decides when it is not arrival 0.
  Clock::time_point fallback_at;
  LastCall last_call{1, Duration(0)};
  // Arrival i's record, once read (decider); nullopt while it is missing.
  std::vector<std::optional<Arrival>> arrivals;
  // Arrivals whose record was missing, since when (this node's clock).
  std::map<int, Clock::time_point> missing;
  // The previous round's members and its lost one, once loaded (decider).
  std::optional<Lineage> lineage;
};

// A fresh join of `round` at `now` as arrival `index`.
JoinState start_join(const JoinRules& rules, int round, std::int64_t index,
                     Clock::time_point deadline, Clock::time_point now);

// When a node other than arrival 0 decides a round it joined at `now`: long
// after arrival 0 should have (it died).
Clock::time_point fallback_after(const JoinRules& rules, Clock::time_point now);

// Whether this node decides at `now`: arrival 0 at once, another arrival the
// round considers from fallback_at on, a node past what a round considers never.
bool may_decide(const JoinState& join, Clock::time_point now);

// The arrival indices whose records to read at `now`, in order: those
// missing at the last look but still within their grace, then those not read
// yet below `count`.
std::vector<int> records_to_read(const JoinState& join, int count, Clock::time_point now);

// Notes what a read of arrival `index`'s record found (nullopt: missing; the
// first time it was seen missing is kept).
void note_record(JoinState& join, int index, std::optional<Arrival> record, Clock::time_point now);

// Whether a missing record may still come at `now` (the decision waits for it).
bool awaiting_record(const JoinState& join, Clock::time_point now);

// What a decider writes: an assignment per arrival considered (spare for
// those not chosen and those whose record never came), the members in
// group-rank order (the next round's lineage), and the decision that points
// at them. decision.master_* and store_port are group rank 0's.
struct Publication {
  Decision decision;
  std::vector<Assignment> assignments;
  std::vector<std::string> members;
};

// Decides the round from the records read (the first `count` arrivals) and
// the lineage, at `now`, noting the arrivals for last call. nullopt: not yet
// (too few, last call not over, or a record may still come).
std::optional<Publication> plan_round(JoinState& join, const JoinRules& rules, int count,
                                      Clock::time_point now);

// What a node that has not yet seen the decision waits for next, and until when.
struct Wake {
  enum class Kind {
    kRecord,  // arrival `index`'s record (a decider)
    kClosed,  // the round's decision
  } kind = Kind::kClosed;
  int index = 0;
  Clock::time_point until;
};
Wake next_wake(const JoinState& join, const JoinRules& rules, Clock::time_point now);

// Where a round's workers reach their store: the agents' store
// (agents_host:agents_port) when nodes serve none for their workers
// (worker_store_port 0), else the one group rank 0's agent serves.
struct WorkerStores {
  std::string agents_host;
  std::uint16_t agents_port = 0;
  std::uint16_t worker_store_port = 0;
};

// This node's view of round `round` (key prefix `round_prefix`), formed as
// decision `c` and this node's assignment `a` say.
RendezvousInfo round_info(int round, const std::string& round_prefix, const Decision& c,
                          const Assignment& a, const std::string& member,
                          const WorkerStores& stores);

// Whether the join is past its deadline at `now`.
inline bool timed_out(const JoinState& join, Clock::time_point now) { return now >= join.deadline; }

}  // namespace ddp::rendezvous_detail
