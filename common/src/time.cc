#include "ddp/common/time.h"

#include <algorithm>
#include <thread>

namespace ddp {

namespace {

class RealRuntime : public Runtime {
 public:
  Clock::time_point now() const override { return Clock::now(); }
  void sleep_for(Duration d) const override { std::this_thread::sleep_for(d); }
};

}  // namespace

std::chrono::system_clock::time_point Runtime::wall_now() const {
  return std::chrono::system_clock::now();
}

std::thread Runtime::start_thread(std::function<void()> body) const {
  return std::thread(std::move(body));
}

const Runtime& real_runtime() {
  static const RealRuntime* runtime = new RealRuntime();  // never destroyed: usable from exit paths
  return *runtime;
}

FakeTime::FakeTime()
    : ticks_((Clock::time_point() + std::chrono::hours(24 * 365)).time_since_epoch().count()) {}

Clock::time_point FakeTime::now() const {
  return Clock::time_point(Clock::duration(ticks_.load()));
}

std::chrono::system_clock::time_point FakeTime::wall_now() const {
  const auto start = Clock::time_point() + std::chrono::hours(24 * 365);
  return std::chrono::system_clock::time_point(std::chrono::seconds(1767225600)) +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(now() - start);
}

void FakeTime::sleep_for(Duration d) const {
  if (d > Duration(0)) ticks_.fetch_add(std::chrono::duration_cast<Clock::duration>(d).count());
}

std::thread FakeTime::start_thread(std::function<void()> body) const {
  threads_started_.fetch_add(1);
  return Runtime::start_thread(std::move(body));
}

void FakeTime::advance(Duration by) {
  ticks_.fetch_add(std::chrono::duration_cast<Clock::duration>(by).count());
}

Deadline::Deadline(Duration timeout, const Runtime& time) : time_(&time) {
  auto now = time.now();
  // Saturate instead of overflowing for huge timeouts.
  if (timeout >= std::chrono::duration_cast<Duration>(Clock::time_point::max() - now)) {
    when_ = Clock::time_point::max();
  } else {
    when_ = now + timeout;
  }
}

Deadline Deadline::never() { return Deadline(); }

bool Deadline::expired() const { return time_->now() >= when_; }

Duration Deadline::remaining() const {
  if (when_ == Clock::time_point::max()) return Duration::max() / 2;
  auto left = std::chrono::duration_cast<Duration>(when_ - time_->now());
  return std::max(left, Duration(0));
}

Backoff::Backoff(Duration initial, Duration max)
    : initial_(initial), max_(max), current_(initial),
      rng_(static_cast<std::uint32_t>(Clock::now().time_since_epoch().count())) {}

Duration Backoff::next() {
  Duration base = current_;
  current_ = std::min(current_ * 2, max_);
  auto jitter_range = std::max<std::int64_t>(base.count() / 4, 1);
  std::uniform_int_distribution<std::int64_t> jitter(0, jitter_range);
  return base + Duration(jitter(rng_));
}

}  // namespace ddp
