#include "ddp/common/time.h"

#include <algorithm>

namespace ddp {

Deadline::Deadline(Duration timeout) {
  auto now = Clock::now();
  // Saturate instead of overflowing for huge timeouts.
  if (timeout >= std::chrono::duration_cast<Duration>(Clock::time_point::max() - now)) {
    when_ = Clock::time_point::max();
  } else {
    when_ = now + timeout;
  }
}

Deadline Deadline::never() { return Deadline(); }

bool Deadline::expired() const { return Clock::now() >= when_; }

Duration Deadline::remaining() const {
  if (when_ == Clock::time_point::max()) return Duration::max() / 2;
  auto left = std::chrono::duration_cast<Duration>(when_ - Clock::now());
  return std::max(left, Duration(0));
}

Backoff::Backoff(Duration initial, Duration max)
    : initial_(initial),
      max_(max),
      current_(initial),
      rng_(static_cast<std::uint32_t>(Clock::now().time_since_epoch().count())) {}

Duration Backoff::next() {
  Duration base = current_;
  current_ = std::min(current_ * 2, max_);
  auto jitter_range = std::max<std::int64_t>(base.count() / 4, 1);
  std::uniform_int_distribution<std::int64_t> jitter(0, jitter_range);
  return base + Duration(jitter(rng_));
}

}  // namespace ddp
