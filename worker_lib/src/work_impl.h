// A Work completed by whoever runs the operation (a backend thread, a watchdog).
// Thread-safe: complete()/fail() may race with wait()/is_completed() from any thread;
// the first of complete()/fail() wins.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/worker/process_group.h"

namespace ddp::detail {

class WorkImpl : public Work {
 public:
  // `default_wait` bounds wait() with a zero timeout (the group's timeout plus slack).
  WorkImpl(std::uint64_t seq, std::string op, std::chrono::milliseconds default_wait)
      : seq_(seq), op_(std::move(op)), default_wait_(default_wait) {}

  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;
  bool is_completed() const override { return done_.load(std::memory_order_acquire); }
  std::exception_ptr exception() const override;
  std::uint64_t sequence_number() const override { return seq_; }
  // Always notifies: the callback runs on the thread of complete()/fail().
  bool on_completion(std::function<void()> callback) override;

  const std::string& op() const { return op_; }

  // Marks success, then runs the completion callbacks; no-op when already completed.
  void complete();
  // Marks failure with `error`, then runs the callbacks; no-op when already completed.
  void fail(std::exception_ptr error);

 private:
  void finish(std::exception_ptr error);

  const std::uint64_t seq_;
  const std::string op_;
  const std::chrono::milliseconds default_wait_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
  std::vector<std::function<void()>> callbacks_;  // run once, by complete()/fail()
};

}  // namespace ddp::detail
