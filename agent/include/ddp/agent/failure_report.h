// Failure reports in torchrun's format (ChildFailedError): each failed rank with
// time, host, rank, local rank, exit code (or signal), pid and error file, and
// the root cause: the first failure in time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
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
  // message.extraInfo.py_callstack), else a generated one.
  std::string message;
  // Seconds since the epoch: the error file's timestamp when present, else
  // when the agent observed the exit.
  std::int64_t timestamp = 0;
  // Observation order (for the root cause when timestamps tie).
  std::chrono::system_clock::time_point observed;
};

// Builds a failure from an exit; reads `error_file` when it exists (torchrun's
// JSON: {"message": {"message": ..., "extraInfo": {"py_callstack": ...,
// "timestamp": ...}}} or {"message": "...", "timestamp": ...}). An unreadable
// or malformed error file is named in the message, never fatal. Never blocks
// and never follows a symbolic link: the file is refused (and the reason put
// in the message) when the path is or passes through a symbolic link, when it
// is not a regular file (a FIFO, a directory, a device), or when it is larger
// than kMaxErrorFileBytes.
inline constexpr std::size_t kMaxErrorFileBytes = 4 * 1024 * 1024;
ProcessFailure make_failure(int local_rank, int rank, int pid, int exit_code,
                            const std::string& error_file,
                            std::chrono::system_clock::time_point observed);

// "SIGSEGV" for 11, "SIG<n>" for unknown numbers.
std::string signal_name(int signo);

// The index of the root cause in `failures` (earliest timestamp, then earliest
// observation). `failures` must not be empty.
std::size_t root_cause(const std::vector<ProcessFailure>& failures);

// The report torchrun prints ("<title> FAILED", Failures:, Root Cause ...).
std::string format_report(const std::string& title, const std::vector<ProcessFailure>& failures,
                          const std::string& hostname);

// The agent's exit code for a failure: its exit code, or 128 + signal.
int exit_code_for(int status);

}  // namespace ddp::agent
