// The thread that completes a group's torch futures.
//
// ddp::worker notifies a Work's completion on the group's own thread, under
// the group's lock; torch runs a future's callbacks (DDP's reducer, comm hooks
// that issue the next collective, Python callbacks) inside markCompleted. So
// the notification only hands the completion to this thread, which runs it
// outside every ddp lock, in the order received.
//
// Thread-safe. post() after stop() (or from a notification racing with it)
// runs the task on the calling thread, so no completion is ever lost. The
// thread holds the completer alive until it has run everything posted, so the
// last owner may let go of it from inside a task.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace ddp::torch_backend {

class FutureCompleter : public std::enable_shared_from_this<FutureCompleter> {
 public:
  // Starts the thread.
  static std::shared_ptr<FutureCompleter> start();

  // Runs `task` on the completer's thread (it must not throw).
  void post(std::function<void()> task);
  // Lets the thread run the tasks already posted and end; waits for that
  // unless called from a task (then returns at once). Idempotent.
  void stop();

 private:
  FutureCompleter() = default;
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  bool ended_ = false;
  std::thread::id thread_id_;
};

}  // namespace ddp::torch_backend
