// The dynamic rendezvous' keys (rendezvous/PROTOCOL.md) and the store calls
// that read and write its records through the codec (records.h), free of any
// decision. Under P = "rdzv/<run_id>/":
//   P/current                  "<round> <nodes>" of the last round that formed
//   P/config                   the job that holds the run id
//   P/counts                   the job's restarts and membership changes (job_counts.h)
//   P/alive/<member>           a node's keep-alive (liveness.h)
//   R = P/round_<r>:
//     R/arrivals               a node's arrival index: tickets on a store that
//                              has them (etcd), add() on any other
//     R/rec_<i>                arrival i's record (Arrival)
//     R/closed                 the round's one decision (Decision), set once by compare_set
//     R/assign_<d>_<i>         decider d's answer to arrival i (Assignment)
//     R/members_<d>            the members in group-rank order (the next round's lineage)
//     R/end, R/exit_barrier, R/left   how the round ended (round.h), its exit
//                              barrier, and the count of nodes that left the job
//
// Thread-safety: free functions of the Store they are given (any thread).
// Errors: the store's; a record that does not parse is a ProtocolError naming its key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/rendezvous/round.h"
#include "ddp/store/store.h"
#include "join_state.h"
#include "membership.h"
#include "records.h"

namespace ddp::rendezvous_detail {

class RunKeys {
 public:
  explicit RunKeys(const std::string& run_id) : prefix_("rdzv/" + run_id + "/") {}
  const std::string& prefix() const { return prefix_; }
  std::string current() const { return prefix_ + "current"; }
  std::string config() const { return prefix_ + "config"; }
  std::string counts() const { return prefix_ + "counts"; }
  std::string round(int round) const { return prefix_ + "round_" + std::to_string(round); }

  // Below a round prefix R.
  static std::string record(const std::string& r, std::int64_t index) {
    return r + "/rec_" + std::to_string(index);
  }
  static std::string closed(const std::string& r) { return r + "/closed"; }
  static std::string end(const std::string& r) { return r + "/end"; }
  static std::string assignment(const std::string& r, int decider, std::int64_t index) {
    return r + "/assign_" + std::to_string(decider) + "_" + std::to_string(index);
  }
  static std::string members(const std::string& r, int decider) {
    return r + "/members_" + std::to_string(decider);
  }

 private:
  std::string prefix_;
};

// The value of `key`, or nullopt when it does not exist; never waits.
std::optional<std::string> try_get(Store& store, const std::string& key);

// Takes this node's arrival index in round R; and how many arrived (both as
// counted: anyone may add to the counter; clamp with considered_arrivals).
// Counting reads: it creates no key. A counter that is not an integer is a
// ProtocolError naming its key.
std::int64_t take_arrival_index(Store& store, const std::string& r);
std::int64_t count_arrivals(Store& store, const std::string& r);

// The records of arrivals `indices` of round R, in batches of 1,024 (one
// multi_get when every record is there); nullopt for a missing one.
std::vector<std::optional<Arrival>> read_records(Store& store, const std::string& r,
                                                 const std::vector<int>& indices);

// P/current, when a round formed.
std::optional<Current> read_current(Store& store, const RunKeys& keys);
// Round R's decision, when it was made.
std::optional<Decision> read_decision(Store& store, const std::string& r);
// Round R's end, when it ended (nullopt also for text that is no end).
std::optional<RoundEnd> read_end(Store& store, const std::string& r);
// Round `round`'s members and the member it lost (empty before a first round).
Lineage read_lineage(Store& store, const RunKeys& keys, int round);

// Writes the answers, then the decision that points at them (compare_set:
// the first decision wins). true when this one won.
bool publish(Store& store, const std::string& r, const Publication& publication);

// Ends round R with `end` unless it ended; returns the end that holds.
std::string end_round_once(Store& store, const std::string& r, const RoundEnd& end);

// This node leaves the job after round `last_round` (-1: it joined none) of
// `nodes` nodes: counts it in R/left; the last of them deletes what is left
// of the job (that round, the one before, P/current, P/config, P/counts).
void leave_job(Store& store, const RunKeys& keys, int last_round, int nodes);

// Deletes round R's keys (its workers' keys cannot be listed and stay).
void delete_round_keys(Store& store, const std::string& r);

}  // namespace ddp::rendezvous_detail
