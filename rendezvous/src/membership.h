// The decisions of dynamic rendezvous, free of I/O and of real time so that
// they are tested with a fake clock: who is in a round and in what order, when
// last call is over, and when a silent node is dead.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/time.h"
#include "records.h"

namespace ddp::rendezvous_detail {

// What the previous round hands to the next: its members in group-rank order,
// and the member it lost (empty when none). Empty members: a first round.
struct Lineage {
  std::vector<std::string> members;
  std::string lost;
};

struct RoundRule {
  int min_nodes = 1;
  int max_nodes = 1;
};

// Decides a round from its arrivals, or returns nullopt to keep waiting:
//   - at max_nodes arrivals, at once;
//   - at min_nodes or more, once every survivor of the previous round (its
//     members but the lost one) has arrived, or once last call is over.
// The members chosen (survivors first, then newcomers by arrival, at most
// max_nodes) are returned as arrival indices in group-rank order: by
// --node_rank where given, then survivors in their previous order, then
// newcomers in arrival order. The same nodes always get the same ranks.
std::optional<std::vector<int>> decide_round(const std::vector<Arrival>& arrivals,
                                             const Lineage& previous, const RoundRule& rule,
                                             bool last_call_over);

// Last call as one observer sees it: it starts when the observer first sees
// min_nodes arrivals, and is over last_call_timeout later.
class LastCall {
 public:
  LastCall(int min_nodes, Duration timeout) : min_nodes_(min_nodes), timeout_(timeout) {}
  void observe(int arrivals, Clock::time_point now);
  bool over(Clock::time_point now) const;
  // When it will be over; time_point::max() while min_nodes were not seen.
  Clock::time_point deadline() const;

 private:
  int min_nodes_;
  Duration timeout_;
  std::optional<Clock::time_point> started_;
};

// Judges one watched node from readings of its keep-alive counter, on the
// watcher's own clock (clocks of different nodes are never compared): the
// node is dead once the counter has not moved for interval x max_attempts.
class HeartbeatTracker {
 public:
  HeartbeatTracker(Duration interval, int max_attempts, Clock::time_point start);
  // A reading (nullopt: the key does not exist, which is no sign of life).
  void observe(const std::optional<std::string>& value, Clock::time_point now);
  bool dead(Clock::time_point now) const;
  // Whole keep-alive intervals without a change.
  int missed(Clock::time_point now) const;
  // When the value last changed (or the tracker started).
  Clock::time_point last_change() const { return last_change_; }

 private:
  Duration interval_;
  int max_attempts_;
  Clock::time_point last_change_;
  std::optional<std::string> last_value_;
};

}  // namespace ddp::rendezvous_detail
