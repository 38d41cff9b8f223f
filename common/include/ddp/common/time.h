// Time helpers: a clock seam (so heartbeat, last-call and join timeouts are
// tested with a fake clock, not sleeps), deadlines, and exponential backoff
// with jitter.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>

namespace ddp {

using Clock = std::chrono::steady_clock;
using Duration = std::chrono::milliseconds;

// Where time comes from. Logic whose decisions depend on elapsed time takes a
// TimeSource; production code passes real_time(), tests a FakeTime.
// Implementations are thread-safe.
class TimeSource {
 public:
  virtual ~TimeSource() = default;
  virtual Clock::time_point now() const = 0;
};

// The steady clock. A process-wide object that is never destroyed.
const TimeSource& real_time();

// A clock that moves only when told to. Starts at an arbitrary fixed point far
// from the epoch (so "now - timeout" never underflows). Thread-safe.
class FakeTime : public TimeSource {
 public:
  FakeTime();
  Clock::time_point now() const override;
  void advance(Duration by);

 private:
  std::atomic<Clock::rep> ticks_;
};

// A point in time after which an operation gives up. Deadline::never() never passes.
// The TimeSource must outlive the deadline.
class Deadline {
 public:
  explicit Deadline(Duration timeout, const TimeSource& time = real_time());
  static Deadline never();

  bool expired() const;
  // Time left, at least zero. For never(), a very large duration.
  Duration remaining() const;
  Clock::time_point when() const { return when_; }

 private:
  Deadline() = default;
  const TimeSource* time_ = &real_time();
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
