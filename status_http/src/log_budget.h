// A budget for log lines that clients can cause (bad requests, a handler
// failing on their requests): at most `burst` lines per `window`, so that no
// client can flood the log. Lines over the budget are counted, and the first
// line of a later window says how many were left out.
//
// Ownership: plain value. Blocking: none. Thread-safety: none; the server's
// thread only. Errors: none.
#pragma once

#include <chrono>
#include <cstdint>

namespace ddp::status_http {

class LogBudget {
 public:
  using Clock = std::chrono::steady_clock;
  LogBudget(int burst, Clock::duration window) : burst_(burst), window_(window) {}

  // Whether a line may be written at `now`; counts it either way.
  bool take(Clock::time_point now);
  // Lines refused since the last call, and resets the count (for the line
  // that was just allowed to mention).
  std::uint64_t take_left_out();

 private:
  int burst_;
  Clock::duration window_;
  Clock::time_point window_start_{};
  int lines_in_window_ = 0;
  std::uint64_t left_out_ = 0;
};

}  // namespace ddp::status_http
