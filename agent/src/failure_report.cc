#include "ddp/agent/failure_report.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cerrno>
#include <ctime>
#include <sstream>

#include <nlohmann/json.hpp>

#include "safe_file.h"

namespace ddp::agent {
namespace {

constexpr const char* kNotAvailable = "<N/A>";

std::string indent_lines(const std::string& text) {
  std::string out;
  for (char c : text) {
    out.push_back(c);
    if (c == '\n') out += "  ";
  }
  return out;
}

std::int64_t to_int(const nlohmann::json& value) {
  if (value.is_number_integer()) return value.get<std::int64_t>();
  if (value.is_string()) return std::stoll(value.get<std::string>());
  return 0;
}

// torchrun's timestamp_isoformat: local time, "YYYY-MM-DD_HH:MM:SS".
std::string iso_time(std::int64_t seconds) {
  std::time_t t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%d_%H:%M:%S", &tm);
  return buffer;
}

enum class ErrorFile { kMissing, kRead, kRefused };

// Reads a worker's error file into `text`, or says in `text` why not. The
// agent must never block here nor be steered elsewhere: the file lives in a
// log directory others may write to, so a symbolic link is refused (it could
// show any file we can read), O_NONBLOCK keeps a planted FIFO from blocking
// the open, anything but a regular file is refused before reading, and the
// size is bounded (a file that grows while we read is cut off and refused).
ErrorFile read_error_file(const std::string& path, std::string& text) {
  int fd = detail::open_no_symlinks(path, O_RDONLY | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) return ErrorFile::kMissing;  // the worker wrote none
    text = path + ": " + detail::open_error_text(errno);
    return ErrorFile::kRefused;
  }
  struct stat st{};
  ErrorFile result = ErrorFile::kRefused;
  if (::fstat(fd, &st) != 0) {
    text = path + ": fstat: " + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    text = path + " is " + detail::file_type_text(st.st_mode) + ", not a regular file (refused)";
  } else {
    std::string data;
    char buffer[65536];
    for (;;) {
      ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        text = path + ": read: " + std::strerror(errno);
        break;
      }
      if (n == 0) {
        text = std::move(data);
        result = ErrorFile::kRead;
        break;
      }
      data.append(buffer, static_cast<std::size_t>(n));
      if (data.size() > kMaxErrorFileBytes) {
        text = path + " is larger than " + std::to_string(kMaxErrorFileBytes) + " bytes (refused)";
        break;
      }
    }
  }
  ::close(fd);
  return result;
}

}  // namespace

std::string signal_name(int signo) {
  const char* abbrev = ::sigabbrev_np(signo);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "SIG" + std::to_string(signo);
}

int exit_code_for(int status) { return status < 0 ? 128 - status : status; }

ProcessFailure make_failure(int local_rank, int rank, int pid, int exit_code,
                            const std::string& error_file,
                            std::chrono::system_clock::time_point observed) {
  ProcessFailure failure;
  failure.local_rank = local_rank;
  failure.rank = rank;
  failure.pid = pid;
  failure.exit_code = exit_code;
  failure.observed = observed;
  failure.timestamp =
      std::chrono::duration_cast<std::chrono::seconds>(observed.time_since_epoch()).count();
  failure.error_file = kNotAvailable;
  std::string text;
  const ErrorFile read = error_file.empty() ? ErrorFile::kMissing : read_error_file(error_file, text);
  if (read == ErrorFile::kRefused) {
    failure.error_file = error_file;
    failure.message = "(unreadable error file: " + text + ")";
  } else if (read == ErrorFile::kRead) {
    failure.error_file = error_file;
    try {
      nlohmann::json data = nlohmann::json::parse(text);
      const nlohmann::json& message = data.at("message");
      if (message.is_string()) {
        failure.message = message.get<std::string>();
        if (data.contains("timestamp")) failure.timestamp = to_int(data["timestamp"]);
      } else {
        const nlohmann::json& extra = message.value("extraInfo", nlohmann::json::object());
        if (extra.contains("py_callstack") && extra["py_callstack"].is_string()) {
          failure.message = extra["py_callstack"].get<std::string>();
        } else if (message.contains("message") && message["message"].is_string()) {
          failure.message = message["message"].get<std::string>();
        } else {
          failure.message = kNotAvailable;
        }
        if (extra.contains("timestamp")) failure.timestamp = to_int(extra["timestamp"]);
      }
    } catch (const std::exception& e) {
      failure.message = std::string("(unreadable error file: ") + e.what() + ")";
    }
  }
  if (failure.message.empty()) {
    if (exit_code < 0) {
      failure.message = "Signal " + std::to_string(-exit_code) + " (" + signal_name(-exit_code) +
                        ") received by PID " + std::to_string(pid);
    } else {
      failure.message = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";
    }
  }
  return failure;
}

std::size_t root_cause(const std::vector<ProcessFailure>& failures) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < failures.size(); ++i) {
    const auto& a = failures[i];
    const auto& b = failures[best];
    if (a.timestamp < b.timestamp || (a.timestamp == b.timestamp && a.observed < b.observed)) {
      best = i;
    }
  }
  return best;
}

std::string format_report(const std::string& title_name,
                          const std::vector<ProcessFailure>& failures,
                          const std::string& hostname) {
  const std::string title = title_name + " FAILED";
  const std::size_t root = failures.empty() ? 0 : root_cause(failures);
  std::size_t width = title.size();
  std::string root_text;
  std::string others;
  for (std::size_t i = 0; i < failures.size(); ++i) {
    const auto& f = failures[i];
    std::ostringstream out;
    out << "[" << i << "]:\n"
        << "  time      : " << iso_time(f.timestamp) << "\n"
        << "  host      : " << hostname << "\n"
        << "  rank      : " << f.rank << " (local_rank: " << f.local_rank << ")\n"
        << "  exitcode  : " << f.exit_code << " (pid: " << f.pid << ")\n"
        << "  error_file: " << f.error_file << "\n"
        << "  traceback : " << indent_lines(f.message);
    std::string text = out.str();
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) width = std::max(width, line.size());
    if (i == root) {
      root_text = text;
    } else {
      others += (others.empty() ? "" : "\n") + text;
    }
  }
  if (others.empty()) others = "  <NO_OTHER_FAILURES>";
  width = std::min<std::size_t>(width, 60);
  const std::string border(width, '=');
  const std::string section(width, '-');
  return "\n" + border + "\n" + title + "\n" + section + "\nFailures:\n" + others + "\n" +
         section + "\nRoot Cause (first observed failure):\n" + root_text + "\n" + border + "\n";
}

}  // namespace ddp::agent
