// Which ranks entered which collective, tracked through the group's store so a
// timed-out collective can name the ranks that never arrived.
//
// Each rank publishes "arrivals/<rank>" = number of collectives it has entered.
// Publishing is asynchronous and lazy: a background thread writes the count only
// once it has stayed unchanged for `quiet` (a rank blocked in a collective, or
// idle), so a stream of fast collectives costs no store traffic at all, only an
// integer update and a notify. A rank stuck in collective N has therefore
// published N+1 long before anyone times out on N. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ddp/store/store.h"
#include "joined_thread.h"

namespace ddp::detail {

class ArrivalTracker {
 public:
  ArrivalTracker(std::shared_ptr<Store> store, int rank, int size,
                 std::chrono::milliseconds quiet = std::chrono::milliseconds(100));
  ~ArrivalTracker();
  ArrivalTracker(const ArrivalTracker&) = delete;
  ArrivalTracker& operator=(const ArrivalTracker&) = delete;

  // This rank entered collective `seq` (0-based); never blocks on the store.
  void entered(std::uint64_t seq);

  // The ranks that have not entered collective `seq`. Publishes this rank's
  // progress synchronously, then polls the others' for up to `settle` (their
  // publisher may lag a little). Store errors count the rank as missing.
  std::vector<int> missing(std::uint64_t seq, std::chrono::milliseconds settle);

  static std::string key(int rank);

 private:
  void publish_loop();

  std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  const std::chrono::milliseconds quiet_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::uint64_t wanted_ = 0;     // entered count to publish
  std::uint64_t published_ = 0;  // last count written to the store
  bool stop_ = false;
  bool idle_ = false;  // the publisher waits for a change (not timing a quiet period)
  JoinedThread thread_;
};

}  // namespace ddp::detail
