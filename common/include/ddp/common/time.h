// Time helpers: a clock interface (so restart and timeout logic can be tested
// with a fake), deadlines, and exponential backoff with jitter.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>

namespace ddp {

using Clock = std::chrono::steady_clock;
using Duration = std::chrono::milliseconds;

// A point in time after which an operation gives up. Deadline::never() never passes.
class Deadline {
 public:
  explicit Deadline(Duration timeout);
  static Deadline never();

  bool expired() const;
  // Time left, at least zero. For never(), a very large duration.
  Duration remaining() const;
  Clock::time_point when() const { return when_; }

 private:
  Deadline() = default;
  Clock::time_point when_ = Clock::time_point::max();
};

// Exponential backoff: next() returns initial, then doubles up to `max`, with up
// to 25% random jitter so that many clients retrying at once spread out.
class Backoff {
 public:
  explicit Backoff(Duration initial = Duration(10), Duration max = Duration(1000));
  Duration next();
  void reset() { current_ = initial_; }

 private:
  Duration initial_;
  Duration max_;
  Duration current_;
  std::minstd_rand rng_;
};

}  // namespace ddp
