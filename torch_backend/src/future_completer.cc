#include "future_completer.h"

namespace ddp::torch_backend {

std::shared_ptr<FutureCompleter> FutureCompleter::start() {
  std::shared_ptr<FutureCompleter> completer(new FutureCompleter());
  std::lock_guard lock(completer->mutex_);
  // Detached: the thread owns a reference, so the completer lives until the
  // loop returned; stop() waits for that through ended_.
  std::thread thread([self = completer] { self->loop(); });
  completer->thread_id_ = thread.get_id();
  thread.detach();
  return completer;
}

void FutureCompleter::post(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      tasks_.push_back(std::move(task));
      cv_.notify_all();
      return;
    }
  }
  task();
}

void FutureCompleter::stop() {
  std::unique_lock lock(mutex_);
  stopping_ = true;
  cv_.notify_all();
  if (std::this_thread::get_id() == thread_id_) return;
  cv_.wait(lock, [&] { return ended_; });
}

void FutureCompleter::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) break;  // stopping, and everything posted has run
    {
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      // Destroyed here, unlocked: what the task held (a Work, its tensors)
      // may need the GIL to go, and a thread holding the GIL may be waiting
      // in stop() for this lock.
    }
    lock.lock();
  }
  ended_ = true;
  cv_.notify_all();
}

}  // namespace ddp::torch_backend
