// Time helpers: the runtime seam (the clock, sleeping and starting threads, so
// that heartbeat, last-call and join timeouts are tested with a fake clock, not
// sleeps, and what runs in the background is seen by tests),
// deadlines, and exponential backoff with jitter. Background threads are
// background.h's.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <thread>

namespace ddp {

using Clock = std::chrono::steady_clock;
using Duration = std::chrono::milliseconds;

// Where time comes from and how it passes. Logic whose decisions depend on
// elapsed time takes a Runtime and never reads a clock or sleeps on its own;
// production code passes real_runtime(), tests a FakeTime. Waits on a
// condition variable or a socket are real time (they wake on events).
// Implementations are thread-safe.
class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual Clock::time_point now() const = 0;
  // The wall clock, for protocols that speak in Unix time (torch's file
  // timer). The real one by default.
  virtual std::chrono::system_clock::time_point wall_now() const;
  // Blocks the calling thread for `d` of this runtime's time.
  virtual void sleep_for(Duration d) const = 0;
  // Starts `body` on a new thread and hands the thread to the caller, which
  // joins or detaches it. Only background.h's BackgroundCall and
  // BackgroundWorker call this (the one place that detaches threads).
  virtual std::thread start_thread(std::function<void()> body) const;
};

// The steady clock and real sleeps. A process-wide object that is never destroyed.
const Runtime& real_runtime();

// A clock that moves only when told to: advance(), or sleep_for() on any
// thread (a sleep returns at once, the clock moved by its length). Starts at an
// arbitrary fixed point far from the epoch (so "now - timeout" never
// underflows). Threads are real, and counted: a test sees what its code runs
// in the background. Thread-safe.
class FakeTime : public Runtime {
 public:
  FakeTime();
  Clock::time_point now() const override;
  // 2026-01-01T00:00:00Z plus whatever the fake clock moved since it started.
  std::chrono::system_clock::time_point wall_now() const override;
  void sleep_for(Duration d) const override;
  std::thread start_thread(std::function<void()> body) const override;
  void advance(Duration by);
  // Threads started through this runtime so far.
  int threads_started() const { return threads_started_.load(); }

 private:
  mutable std::atomic<Clock::rep> ticks_;
  mutable std::atomic<int> threads_started_{0};
};

// A point in time after which an operation gives up. Deadline::never() never passes.
// The Runtime must outlive the deadline.
class Deadline {
 public:
  explicit Deadline(Duration timeout, const Runtime& time = real_runtime());
  static Deadline never();

  bool expired() const;
  // Time left, at least zero. For never(), a very large duration.
  Duration remaining() const;
  Clock::time_point when() const { return when_; }

 private:
  Deadline() = default;
  const Runtime* time_ = &real_runtime();
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
