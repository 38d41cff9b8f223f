#include "joined_thread.h"

#include <utility>

namespace ddp::detail {

JoinedThread::JoinedThread(std::function<void()> body, const Runtime& runtime)
    : thread_(runtime.start_thread(std::move(body))) {}

JoinedThread::~JoinedThread() { join(); }

JoinedThread& JoinedThread::operator=(JoinedThread&& other) noexcept {
  if (this != &other) {
    join();
    thread_ = std::move(other.thread_);
  }
  return *this;
}

void JoinedThread::join() {
  if (thread_.joinable()) thread_.join();
}

}  // namespace ddp::detail
