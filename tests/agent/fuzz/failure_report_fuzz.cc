// libFuzzer target for ddp::agent::parse_error_file: arbitrary bytes as the
// text of a worker's error file (TORCHELASTIC_ERROR_FILE), which the worker
// writes and the agent must read without trusting.
//
// Build (from the repository root; what scripts/fuzz needs to wire it in):
//   sources:  tests/agent/fuzz/failure_report_fuzz.cc agent/src/failure_report.cc
//   includes: -Iagent/include -Iagent/src -Icommon/include
//             (agent/src for safe_file.h; common/include for the header-only
//             ddp/common/json.h; nlohmann/json from the system)
//   libraries: none beyond the C++ standard library (the usual
//             -lspdlog -lfmt -pthread of scripts/fuzz are harmless)
//   clang++-14 -std=c++20 -g -O1 -fno-omit-frame-pointer \
//     -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
//     -Iagent/include -Iagent/src -Icommon/include \
//     tests/agent/fuzz/failure_report_fuzz.cc agent/src/failure_report.cc \
//     -o build/fuzz/failure_report_fuzz
// Run:
//   build/fuzz/failure_report_fuzz -max_len=65536 -timeout=20 <new-dir> \
//     tests/agent/fuzz/failure_report_corpus
// (-max_len=65536 leaves room for inputs nested 65,536 levels deep, far past
// ddp::json::kMaxDepth: a parse that recursed per level would show here.)
//
// Invariants checked, for every input:
// - parse_error_file never lets an exception escape;
// - after make_failure's fallbacks the message is never empty, and it is at
//   most max(input size, 256) bytes (the generated fallbacks are shorter);
// - the message is valid UTF-8 (nlohmann validates strings; diagnostics are
//   ASCII), so the report stays printable text;
// - a timestamp is only ever replaced by one in [0, INT64_MAX];
// - the root cause is the failure observed first, whatever the timestamps,
//   and report_timestamp is either the timestamp (when plausible) or the
//   observation time;
// - format_report does not throw and names the root cause.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/agent/failure_report.h"

namespace {

using ddp::agent::ProcessFailure;
using std::chrono::system_clock;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "failure_report_fuzz: invariant broken: %s\n", what);
  std::abort();
}

bool valid_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::size_t extra = 0;
    std::uint32_t code = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      code = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      code = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      code = c & 0x07;
    } else {
      return false;
    }
    if (text.size() - i <= extra) return false;  // truncated sequence
    for (std::size_t k = 1; k <= extra; ++k) {
      const auto d = static_cast<unsigned char>(text[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      code = (code << 6) | (d & 0x3F);
    }
    const std::uint32_t min = extra == 1 ? 0x80 : extra == 2 ? 0x800 : 0x10000;
    if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

std::int64_t seconds_of(system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // A fixed clock: the input alone decides the run (reproducible crashes).
  const system_clock::time_point observed{std::chrono::seconds(1700000000)};
  // The way make_failure builds it (no error file: the generated message),
  // then what it does with a file's text.
  const int exit_code = size % 2 == 0 ? 1 : -11;
  ProcessFailure failure = ddp::agent::make_failure(1, 5, 4242, exit_code, "", observed);
  const std::int64_t timestamp_before = failure.timestamp;
  try {
    ddp::agent::parse_error_file(text, failure);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exception: %s\n", e.what());
    fail("parse_error_file threw");
  } catch (...) {
    fail("parse_error_file threw a non-std exception");
  }
  if (failure.message.empty()) fail("empty message");
  if (failure.message.size() > std::max<std::size_t>(size, 256)) fail("message longer than bound");
  if (!valid_utf8(failure.message)) fail("message is not valid UTF-8");
  if (failure.timestamp != timestamp_before && failure.timestamp < 0) fail("negative timestamp");

  const std::int64_t shown = ddp::agent::report_timestamp(failure);
  if (shown != failure.timestamp && shown != seconds_of(observed)) fail("report_timestamp");
  if (shown < ddp::agent::kEarliestPlausibleTimestamp ||
      shown > seconds_of(observed) + ddp::agent::kMaxTimestampAheadSeconds) {
    fail("implausible time shown");
  }

  // Another failure observed later, with the earliest possible timestamp:
  // the fuzzed one stays the root cause, in either order.
  ProcessFailure later =
      ddp::agent::make_failure(0, 4, 4241, 2, "", observed + std::chrono::seconds(1));
  later.timestamp = 0;
  const std::vector<ProcessFailure> failures = {later, failure};
  if (ddp::agent::root_cause(failures) != 1) fail("root cause not by observation");
  std::string report;
  try {
    report = ddp::agent::format_report("train.py", failures, "node1");
  } catch (...) {
    fail("format_report threw");
  }
  if (report.find("Root Cause (first observed failure):\n[1]:\n") == std::string::npos) {
    fail("report lacks the root cause");
  }
  return 0;
}
