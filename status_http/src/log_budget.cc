#include "log_budget.h"

namespace ddp::status_http {

bool LogBudget::take(Clock::time_point now) {
  if (now - window_start_ >= window_) {
    window_start_ = now;
    lines_in_window_ = 0;
  }
  if (lines_in_window_ < burst_) {
    ++lines_in_window_;
    return true;
  }
  ++left_out_;
  return false;
}

std::uint64_t LogBudget::take_left_out() {
  const std::uint64_t count = left_out_;
  left_out_ = 0;
  return count;
}

}  // namespace ddp::status_http
