// Failure reports in torchrun's format (ChildFailedError): each failed rank with
// time, host, rank, local rank, exit code (or signal), pid and error file, and
// the root cause: the failure the agent observed first.
//
// A worker's error file is written by the worker: the agent reads it as
// untrusted text. Its nesting is bounded at parse time (values deeper than
// ddp::json::kMaxDepth levels are dropped, the rest is kept), a field of the
// wrong type is ignored rather than fatal, and its timestamp never decides the
// root cause (a worker could write any time there to be blamed first or last).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::agent {

struct ProcessFailure {
  int local_rank = 0;
  int rank = 0;
  int pid = 0;
  // Exit code (> 0) or minus the signal number.
  int exit_code = 0;
  // The worker's TORCHELASTIC_ERROR_FILE, or "<N/A>" when it wrote none.
  std::string error_file;
  // From the error file (its "message", or the traceback in
  // message.extraInfo.py_callstack), else a generated one. Never empty after
  // make_failure.
  std::string message;
  // Seconds since the epoch: the error file's timestamp when it is a plain
  // non-negative integer, else when the agent observed the exit. Written by
  // the worker, so only shown (see report_timestamp), never used to order
  // failures.
  std::int64_t timestamp = 0;
  // When the agent observed the exit, on its own clock: the only thing that
  // orders failures (root_cause).
  std::chrono::system_clock::time_point observed;
};

// Builds a failure from an exit; reads `error_file` when it exists (torchrun's
// JSON: {"message": {"message": ..., "extraInfo": {"py_callstack": ...,
// "timestamp": ...}}} or {"message": "...", "timestamp": ...}) and takes its
// message and timestamp as parse_error_file does. An unreadable or malformed
// error file is named in the message, never fatal. Never blocks and never
// follows a symbolic link: the file is refused (and the reason put in the
// message) when the path is or passes through a symbolic link, when it is not
// a regular file (a FIFO, a directory, a device), or when it is larger than
// kMaxErrorFileBytes. The message is never empty: without a usable one from
// the file it says which signal killed the worker, or how to get a traceback.
inline constexpr std::size_t kMaxErrorFileBytes = 4 * 1024 * 1024;
ProcessFailure make_failure(int local_rank, int rank, int pid, int exit_code,
                            const std::string& error_file,
                            std::chrono::system_clock::time_point observed);

// The pure part of make_failure: takes the message and timestamp of `failure`
// from `text`, the contents of a worker's error file. No I/O.
//
// - message: message.extraInfo.py_callstack when it is a non-empty string,
//   else message.message when it is a non-empty string, else "<N/A>" (an
//   object "message", as torchrun); a string "message" as it is. Left as it
//   was when the file's message is an empty string (make_failure's generated
//   one stays). When the text is not JSON, not an object, has no "message" or
//   one of another type, the message says so: "(unreadable error file: ...)".
//   Values nested deeper than ddp::json::kMaxDepth are dropped before anything
//   is looked at, so a message at a normal depth is kept beside them.
// - timestamp: message.extraInfo.timestamp (object message) or the top-level
//   "timestamp" (string message) when it is a JSON integer or a string of
//   decimal digits, from 0 to INT64_MAX. Anything else (a float, a sign, other
//   characters, an overflow, another type) is ignored: `timestamp` is left as
//   it was and the message is still taken.
//
// Never throws for any input (a field of the wrong type is skipped, never an
// nlohmann exception), never recurses once per level of the input (the
// document is bounded at parse time and only ever read through references),
// and the message it sets is at most max(text.size(), 256) bytes.
void parse_error_file(std::string_view text, ProcessFailure& failure);

// "SIGSEGV" for 11, "SIG<n>" for unknown numbers.
std::string signal_name(int signo);

// The index of the root cause in `failures`: the earliest `observed` (the
// agent's own clock), the first in `failures` on a tie. The worker-written
// `timestamp` plays no part. `failures` must not be empty.
std::size_t root_cause(const std::vector<ProcessFailure>& failures);

// The time a report shows for `failure`, in seconds since the epoch: its
// `timestamp` (the error file's, as torchrun shows) when it is plausible, i.e.
// not before 2000-01-01 and not more than a day after `observed`; otherwise
// `observed` (rounded down to the second).
inline constexpr std::int64_t kEarliestPlausibleTimestamp = 946684800;  // 2000-01-01T00:00:00Z
inline constexpr std::int64_t kMaxTimestampAheadSeconds = 24 * 60 * 60;
std::int64_t report_timestamp(const ProcessFailure& failure);

// The report torchrun prints ("<title> FAILED", Failures:, Root Cause ...),
// each failure's time as report_timestamp says.
std::string format_report(const std::string& title, const std::vector<ProcessFailure>& failures,
                          const std::string& hostname);

// The agent's exit code for a failure: its exit code, or 128 + signal.
int exit_code_for(int status);

}  // namespace ddp::agent
