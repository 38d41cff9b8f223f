#include "arrival_tracker.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ddp/common/env.h"
#include "ddp/common/error.h"
#include "ddp/common/time.h"

namespace ddp::detail {

ArrivalTracker::ArrivalTracker(std::shared_ptr<Store> store, int rank, int size,
                               std::chrono::milliseconds quiet)
    : store_(std::move(store)), rank_(rank), size_(size), quiet_(quiet) {
  thread_ = JoinedThread([this] { publish_loop(); });
}

ArrivalTracker::~ArrivalTracker() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::string ArrivalTracker::key(int rank) { return fmt::format("arrivals/{}", rank); }

void ArrivalTracker::entered(std::uint64_t seq) {
  {
    std::lock_guard lock(mutex_);
    if (seq + 1 <= wanted_) return;
    wanted_ = seq + 1;
    if (!idle_) return;  // the publisher is timing a quiet period; no wake-up needed
  }
  cv_.notify_one();
}

void ArrivalTracker::publish_loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    idle_ = true;
    cv_.wait(lock, [&] { return stop_ || wanted_ != published_; });
    idle_ = false;
    if (stop_) return;
    // Wait until the count has been stable for quiet_: fast collectives in a row
    // keep changing it and cost nothing (entered() does not even notify while we
    // are in this phase); a blocked or idle rank publishes.
    std::uint64_t seen = wanted_;
    cv_.wait_for(lock, quiet_, [&] { return stop_; });
    if (stop_) return;
    if (wanted_ != seen) continue;
    std::uint64_t value = wanted_;
    lock.unlock();
    try {
      store_->set(key(rank_), std::to_string(value));
    } catch (const std::exception& e) {
      // The store being gone is reported by the collective itself; a failed
      // progress update only makes a later diagnosis less precise.
      spdlog::debug("rank {}: cannot publish collective progress: {}", rank_, e.what());
    }
    lock.lock();
    if (value > published_) published_ = value;
  }
}

std::vector<int> ArrivalTracker::missing(std::uint64_t seq, std::chrono::milliseconds settle) {
  std::uint64_t mine;
  {
    std::lock_guard lock(mutex_);
    mine = wanted_;
  }
  try {
    store_->set(key(rank_), std::to_string(mine));
  } catch (const std::exception&) {
  }
  Deadline deadline(settle);
  std::vector<int> absent;
  while (true) {
    absent.clear();
    for (int r = 0; r < size_; ++r) {
      bool arrived = false;
      try {
        if (store_->check({key(r)})) {
          auto value = env::parse_int(store_->get(key(r), std::chrono::milliseconds(1000)), key(r));
          arrived = static_cast<std::uint64_t>(value) > seq;
        }
      } catch (const std::exception&) {
      }
      if (!arrived) absent.push_back(r);
    }
    if (absent.empty() || deadline.expired()) return absent;
    std::this_thread::sleep_for(
        std::min<std::chrono::milliseconds>(std::chrono::milliseconds(50), deadline.remaining()));
  }
}

}  // namespace ddp::detail
