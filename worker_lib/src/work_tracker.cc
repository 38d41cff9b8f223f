#include "work_tracker.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ddp/common/error.h"

namespace ddp::detail {

WorkTracker::WorkTracker(std::string origin, std::chrono::milliseconds timeout,
                         std::shared_ptr<ArrivalTracker> arrivals, Hooks hooks)
    : origin_(std::move(origin)), timeout_(timeout), arrivals_(std::move(arrivals)),
      hooks_(std::move(hooks)) {}

WorkTracker::~WorkTracker() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  watchdog_.join();
}

void WorkTracker::add(std::shared_ptr<WorkImpl> work, std::optional<std::uint64_t> collective_seq,
                      Query query, Clock::time_point issued) {
  std::lock_guard lock(mutex_);
  if (!broken_.empty()) {
    throw BackendError(origin_, fmt::format("{} #{} not run: the group failed earlier ({})",
                                            work->op(), work->sequence_number(), broken_));
  }
  entries_.push_back(Entry{std::move(work), collective_seq, std::move(query), issued});
}

void WorkTracker::fail_all_locked(std::exception_ptr first, std::exception_ptr rest) {
  bool is_first = true;
  for (auto& entry : entries_) {
    entry.work->fail(is_first ? first : rest);
    is_first = false;
  }
  entries_.clear();
}

std::string WorkTracker::break_locked(std::unique_lock<std::mutex>& lock, std::string message) {
  broken_ = std::move(message);
  auto error = std::make_exception_ptr(BackendError(origin_, broken_));
  lock.unlock();
  if (hooks_.abort) hooks_.abort();
  lock.lock();
  fail_all_locked(error, error);
  return broken_;
}

std::optional<std::string> WorkTracker::poll(Clock::time_point now) {
  std::unique_lock lock(mutex_);
  if (!broken_.empty()) return std::nullopt;
  // Completed ones, in order.
  while (!entries_.empty()) {
    auto& front = entries_.front();
    bool done = false;
    try {
      done = front.query();
    } catch (const std::exception& e) {
      return break_locked(lock, fmt::format("{} #{} failed: {}", front.work->op(),
                                            front.work->sequence_number(), e.what()));
    }
    if (!done) break;
    if (front.seq && hooks_.completed) hooks_.completed(*front.seq);
    front.work->complete();
    entries_.pop_front();
  }
  std::optional<std::string> async;
  if (hooks_.async_error) async = hooks_.async_error();
  if (async) return break_locked(lock, fmt::format("asynchronous backend error: {}", *async));
  if (entries_.empty() || now - entries_.front().issued < timeout_) return std::nullopt;
  // The oldest outstanding operation timed out.
  auto front = entries_.front();
  std::vector<int> missing;
  lock.unlock();
  if (front.seq && arrivals_) {
    missing = arrivals_->missing(*front.seq, std::chrono::milliseconds(500));
  }
  if (hooks_.abort) hooks_.abort();
  lock.lock();
  auto message = fmt::format(
      "{} #{} timed out after {} ms; ranks that did not arrive: [{}]; the "
      "communicator was aborted",
      front.work->op(), front.work->sequence_number(), timeout_.count(), fmt::join(missing, ", "));
  broken_ = message;
  auto first = std::make_exception_ptr(TimeoutError(origin_, message));
  auto rest = std::make_exception_ptr(
      BackendError(origin_, fmt::format("aborted after an earlier failure: {}", message)));
  fail_all_locked(first, rest);
  spdlog::error("{}: {}", origin_, message);
  return message;
}

void WorkTracker::start_watchdog(std::chrono::milliseconds interval) {
  watchdog_ = JoinedThread([this, interval] {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      stop_cv_.wait_for(lock, interval, [&] { return stop_; });
      if (stop_) break;
      lock.unlock();
      poll();
      lock.lock();
    }
  });
}

void WorkTracker::throw_if_broken() const {
  std::lock_guard lock(mutex_);
  if (!broken_.empty()) {
    throw BackendError(origin_, fmt::format("the group failed earlier: {}", broken_));
  }
}

bool WorkTracker::broken() const {
  std::lock_guard lock(mutex_);
  return !broken_.empty();
}

std::size_t WorkTracker::outstanding() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

std::string exchange_unique_id(Store& store, int rank, const std::function<std::string()>& generate,
                               std::chrono::milliseconds timeout, const std::string& key) {
  if (rank == 0) {
    auto id = generate();
    store.set(key, id);
    return id;
  }
  try {
    return store.get(key, timeout);
  } catch (const TimeoutError& e) {
    throw TimeoutError("exchange_unique_id",
                       fmt::format("rank {}: rank 0 did not publish '{}' within {} ms ({})", rank,
                                   key, timeout.count(), e.what()));
  }
}

}  // namespace ddp::detail
