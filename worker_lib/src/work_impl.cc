#include "work_impl.h"

#include <thread>

namespace ddp::detail {

bool WorkImpl::wait(std::chrono::milliseconds timeout) {
  // Small collectives finish in tens of microseconds: spin briefly before
  // sleeping, so the caller does not pay a scheduler wake-up for each of them.
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
  while (!done_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < spin_until) {
    std::this_thread::yield();
  }
  std::unique_lock lock(mutex_);
  auto limit = timeout.count() > 0 ? timeout : default_wait_;
  if (!cv_.wait_for(lock, limit, [&] { return done_.load(std::memory_order_acquire); })) {
    return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

std::exception_ptr WorkImpl::exception() const {
  std::lock_guard lock(mutex_);
  return error_;
}

bool WorkImpl::on_completion(std::function<void()> callback) {
  {
    std::lock_guard lock(mutex_);
    if (!done_.load(std::memory_order_relaxed)) {
      callbacks_.push_back(std::move(callback));
      return true;
    }
  }
  callback();
  return true;
}

void WorkImpl::complete() { finish(nullptr); }

void WorkImpl::fail(std::exception_ptr error) { finish(std::move(error)); }

void WorkImpl::finish(std::exception_ptr error) {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard lock(mutex_);
    if (done_.load(std::memory_order_relaxed)) return;
    error_ = std::move(error);
    done_.store(true, std::memory_order_release);
    callbacks.swap(callbacks_);
  }
  cv_.notify_all();
  for (auto& callback : callbacks) callback();
}

}  // namespace ddp::detail
