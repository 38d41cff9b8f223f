#include "ddp/common/background.h"

#include <condition_variable>
#include <deque>
#include <mutex>

namespace ddp {

// ---- BackgroundCall ------------------------------------------------------------------------

struct BackgroundCall::State {
  mutable std::mutex mutex;
  std::condition_variable changed;
  bool finished = false;
  std::exception_ptr error;
};

BackgroundCall::BackgroundCall(std::function<void()> call, const Runtime& runtime)
    : state_(std::make_shared<State>()) {
  thread_ = runtime.start_thread([state = state_, call = std::move(call)]() mutable {
    std::exception_ptr error;
    try {
      call();
    } catch (...) {
      error = std::current_exception();
    }
    call = nullptr;  // what the call owned goes before the owner is told
    std::lock_guard lock(state->mutex);
    state->error = error;
    state->finished = true;
    state->changed.notify_all();
  });
}

BackgroundCall::~BackgroundCall() {
  if (!thread_.joinable()) return;
  if (finished()) {
    thread_.join();
  } else {
    thread_.detach();  // owns all it touches; ends on its own
  }
}

bool BackgroundCall::wait_until(Clock::time_point deadline) {
  std::unique_lock lock(state_->mutex);
  return state_->changed.wait_until(lock, deadline, [&] { return state_->finished; });
}

void BackgroundCall::wait() {
  std::unique_lock lock(state_->mutex);
  state_->changed.wait(lock, [&] { return state_->finished; });
}

bool BackgroundCall::wait_for(Duration wait) {
  std::unique_lock lock(state_->mutex);
  return state_->changed.wait_for(lock, wait, [&] { return state_->finished; });
}

bool BackgroundCall::finished() const {
  std::lock_guard lock(state_->mutex);
  return state_->finished;
}

std::exception_ptr BackgroundCall::error() const {
  std::lock_guard lock(state_->mutex);
  return state_->finished ? state_->error : nullptr;
}

// ---- BackgroundWorker ----------------------------------------------------------------------

struct BackgroundWorker::State {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Task> tasks;
  Task tick;
  Duration period;
  bool stopping = false;
  bool finished = false;
};

BackgroundWorker::BackgroundWorker(Duration period, Task tick, const Runtime& runtime)
    : state_(std::make_shared<State>()) {
  state_->period = period;
  state_->tick = std::move(tick);
  thread_ = runtime.start_thread([state = state_] {
    try {
      run(*state);
    } catch (...) {
      // The tick failed: the worker ends (see the header).
    }
    std::deque<Task> dropped;
    Task tick;
    std::unique_lock lock(state->mutex);
    dropped.swap(state->tasks);
    tick.swap(state->tick);
    state->finished = true;
    state->changed.notify_all();
    lock.unlock();  // what they own is released outside the lock
  });
}

BackgroundWorker::~BackgroundWorker() { stop(Duration(0)); }

void BackgroundWorker::post(Task task) {
  std::lock_guard lock(state_->mutex);
  if (state_->finished) return;
  state_->tasks.push_back(std::move(task));
  state_->changed.notify_all();
}

void BackgroundWorker::set_period(Duration period) {
  std::lock_guard lock(state_->mutex);
  state_->period = period;
  state_->changed.notify_all();
}

bool BackgroundWorker::stop(Duration wait, Task last) {
  if (!thread_.joinable()) return ended_in_time_;
  std::unique_lock lock(state_->mutex);
  if (last && !state_->finished) state_->tasks.push_back(std::move(last));
  state_->stopping = true;
  state_->changed.notify_all();
  const bool finished = state_->changed.wait_for(lock, wait, [&] { return state_->finished; });
  lock.unlock();
  if (finished) {
    thread_.join();
  } else {
    thread_.detach();  // blocked in its tick or a task; owns all it touches
  }
  ended_in_time_ = finished;
  return finished;
}

void BackgroundWorker::run(State& state) {
  auto next_tick = Clock::now();
  std::unique_lock lock(state.mutex);
  for (;;) {
    state.changed.wait_until(lock, next_tick, [&] {
      return state.stopping || !state.tasks.empty() || Clock::now() >= next_tick;
    });
    if (!state.tasks.empty()) {
      Task task = std::move(state.tasks.front());
      state.tasks.pop_front();
      lock.unlock();
      try {
        task();
      } catch (...) {
        // Best effort (see the header).
      }
      task = nullptr;
      lock.lock();
      continue;
    }
    if (state.stopping) return;
    if (Clock::now() >= next_tick) {
      lock.unlock();
      state.tick();  // what escapes ends the worker
      lock.lock();
      next_tick = Clock::now() + state.period;
    }
  }
}

}  // namespace ddp
