// The worker library's one way to start a thread that belongs to an object:
// the object starts it, tells its body to return (through its own flag and
// condition variable, or by aborting what the body waits on) and joins it
// before any member the body uses goes. So the body may use its owner, which
// ddp::BackgroundCall and ddp::BackgroundWorker (ddp/common/background.h) do not
// allow: their owner may abandon the work, which must then own all it touches.
// The worker library's threads are both kinds: a process group's worker,
// send/receive and watcher threads, the arrival tracker's publisher and the
// NCCL watchdog are JoinedThreads (their owners must not return before them);
// the control channel's reader, which lives as long as the process, is a
// BackgroundCall. scripts/lint keeps raw std::thread and detach() out of
// worker_lib/src except in joined_thread.cc.
#pragma once

#include <functional>
#include <thread>

#include "ddp/common/time.h"

namespace ddp::detail {

// Thread-safety: one owner thread starts, joins and destroys it.
class JoinedThread {
 public:
  JoinedThread() = default;  // no thread
  // Starts `body` at once on a thread that `runtime` starts (it must outlive the thread).
  explicit JoinedThread(std::function<void()> body, const Runtime& runtime = real_runtime());
  // Joins: blocks until the body returned (the owner told it to before).
  ~JoinedThread();
  JoinedThread(JoinedThread&&) noexcept = default;
  // Joins the thread this one held, then takes `other`'s.
  JoinedThread& operator=(JoinedThread&& other) noexcept;
  JoinedThread(const JoinedThread&) = delete;
  JoinedThread& operator=(const JoinedThread&) = delete;

  // Blocks until the body returned; at once when there is no thread or it was joined.
  void join();
  // Whether it holds a thread not joined yet.
  bool joinable() const { return thread_.joinable(); }

 private:
  std::thread thread_;
};

}  // namespace ddp::detail
