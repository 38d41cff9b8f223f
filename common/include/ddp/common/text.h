// Text that another process or another node wrote (a store value, a worker's
// progress page, a peer's progress summary) on its way to a terminal, a log or
// a report. The one place that decides what of it may be shown.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace ddp {

// `text` with every byte outside printable ASCII (0x20..0x7e) replaced by
// '?': no control character (an escape sequence that rewrites the terminal,
// a line break that forges a "ddprun: ..." line) and no stray byte of a
// multi-byte sequence survives. The length is unchanged.
std::string printable(std::string_view text);

// Whether `c` is one printable() keeps.
constexpr bool is_printable(char c) {
  return static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f;
}

// A duration as seconds the way a user writes them: "300", "0.5", "-1.25"
// (exact to the millisecond, no trailing zeros, no unit).
std::string seconds_text(std::chrono::milliseconds duration);

}  // namespace ddp
