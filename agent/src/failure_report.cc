#include "ddp/agent/failure_report.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <ctime>
#include <limits>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ddp/common/json.h"
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

using Json = nlohmann::json;

// A member of `object`, or null when `object` is not an object or lacks it.
// Only ever a pointer into the document: copying a value (json::value(), a
// by-value default) recurses through all of it.
const Json* member(const Json* object, const char* key) {
  if (object == nullptr || !object->is_object()) return nullptr;
  auto it = object->find(key);
  return it == object->end() ? nullptr : &*it;
}

// The string `value` refers to when it is a non-empty string.
const std::string* non_empty_string(const Json* value) {
  if (value == nullptr || !value->is_string()) return nullptr;
  const std::string& text = value->get_ref<const std::string&>();
  return text.empty() ? nullptr : &text;
}

// A timestamp the worker wrote, when it is a plain integer from 0 to
// INT64_MAX: a JSON integer, or a string of decimal digits (what @record
// writes). std::from_chars neither throws nor accepts a sign for an unsigned
// type, and reports an overflow; it must consume the whole string.
std::optional<std::int64_t> plain_timestamp(const Json* value) {
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (value == nullptr) return std::nullopt;
  std::uint64_t seconds = 0;
  if (value->is_number_unsigned()) {
    seconds = value->get<std::uint64_t>();
  } else if (value->is_number_integer()) {
    return std::nullopt;  // signed: nlohmann keeps non-negative integers unsigned
  } else if (value->is_string()) {
    const std::string& text = value->get_ref<const std::string&>();
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, seconds);
    if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  } else {
    return std::nullopt;
  }
  if (seconds > kMax) return std::nullopt;
  return static_cast<std::int64_t>(seconds);
}

// "a number", "an array", "null": for a diagnostic.
std::string type_text(const Json& value) {
  if (value.is_null()) return "null";
  const std::string name = value.type_name();
  return (value.is_array() || value.is_object() ? "an " : "a ") + name;
}

// Says what the agent could not use; never longer than a couple of hundred
// bytes, whatever the file holds.
std::string unreadable(const std::string& why, bool too_deep) {
  std::string text = "(unreadable error file: " + why;
  if (too_deep) {
    text +=
        "; values nested deeper than " + std::to_string(json::kMaxDepth) + " levels were dropped";
  }
  return text + ")";
}

// Where well-formed JSON stopped, for the diagnostic. nlohmann's SAX parser
// keeps its nesting in a heap vector (no recursion) and builds nothing.
struct ErrorPosition : nlohmann::json_sax<Json> {
  std::size_t byte = 0;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception&) override {
    byte = position;
    return false;
  }
};

std::string invalid_json_text(std::string_view text) {
  ErrorPosition position;
  Json::sax_parse(text.begin(), text.end(), &position, Json::input_format_t::json,
                  /*strict=*/true);
  // nlohmann counts the bytes read, the offending one included: 1-based.
  return "not valid JSON (error at byte " + std::to_string(position.byte) + ")";
}

// torchrun's timestamp_isoformat: local time, "YYYY-MM-DD_HH:MM:SS".
std::string iso_time(std::int64_t seconds) {
  std::time_t t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  char buffer[64] = {};
  // A time localtime cannot represent (only a test sets one: the report shows
  // plausible times or the agent's clock) is shown as a number.
  if (::localtime_r(&t, &tm) == nullptr ||
      std::strftime(buffer, sizeof(buffer), "%Y-%m-%d_%H:%M:%S", &tm) == 0) {
    return std::to_string(seconds);
  }
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
  struct stat st {};
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

void parse_error_file(std::string_view text, ProcessFailure& failure) {
  // Everything below reads the document through pointers: no sub-document is
  // copied, compared or dumped, and a field of the wrong type is skipped
  // instead of throwing. std::bad_alloc aside, nothing here throws.
  try {
    const json::Parsed parsed = json::parse_bounded(text);
    if (!parsed.valid) {
      failure.message = unreadable(invalid_json_text(text), false);
      return;
    }
    const Json* data = &parsed.value;
    if (!data->is_object()) {
      failure.message = unreadable(std::string("a JSON ") + data->type_name() + ", not an object",
                                   parsed.too_deep);
      return;
    }
    const Json* message = member(data, "message");
    const Json* timestamp = nullptr;
    if (message == nullptr) {
      failure.message = unreadable("no \"message\"", parsed.too_deep);
    } else if (message->is_string()) {
      // torchrun's {"message": "...", "timestamp": ...}
      if (const std::string* string = non_empty_string(message)) failure.message = *string;
      timestamp = member(data, "timestamp");
    } else if (message->is_object()) {
      // @record's {"message": {"message": ..., "extraInfo": {...}}}
      const Json* extra = member(message, "extraInfo");
      if (const std::string* callstack = non_empty_string(member(extra, "py_callstack"))) {
        failure.message = *callstack;
      } else if (const std::string* inner = non_empty_string(member(message, "message"))) {
        failure.message = *inner;
      } else {
        failure.message = kNotAvailable;
      }
      timestamp = member(extra, "timestamp");
    } else {
      failure.message =
          unreadable("its \"message\" is " + type_text(*message) + ", not a string or an object",
                     parsed.too_deep);
    }
    if (auto seconds = plain_timestamp(timestamp)) failure.timestamp = *seconds;
  } catch (const std::exception& e) {
    // Not reached for any input (only an allocation failure): the agent must
    // still report and restart.
    failure.message = unreadable(e.what(), false).substr(0, 256);
  }
}

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
  // The generated message first: parse_error_file replaces it only with a
  // non-empty one.
  if (exit_code < 0) {
    failure.message = "Signal " + std::to_string(-exit_code) + " (" + signal_name(-exit_code) +
                      ") received by PID " + std::to_string(pid);
  } else {
    failure.message =
        "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";
  }
  std::string text;
  const ErrorFile read =
      error_file.empty() ? ErrorFile::kMissing : read_error_file(error_file, text);
  if (read == ErrorFile::kRefused) {
    failure.error_file = error_file;
    failure.message = "(unreadable error file: " + text + ")";
  } else if (read == ErrorFile::kRead) {
    failure.error_file = error_file;
    parse_error_file(text, failure);
  }
  return failure;
}

std::size_t root_cause(const std::vector<ProcessFailure>& failures) {
  // By the agent's clock only: a worker writes its error file's timestamp and
  // could otherwise make itself (or anyone else) the root cause.
  std::size_t best = 0;
  for (std::size_t i = 1; i < failures.size(); ++i) {
    if (failures[i].observed < failures[best].observed) best = i;
  }
  return best;
}

std::int64_t report_timestamp(const ProcessFailure& failure) {
  const std::int64_t observed =
      std::chrono::duration_cast<std::chrono::seconds>(failure.observed.time_since_epoch()).count();
  // `observed` (a system_clock time, within +-292 years) plus a day cannot
  // overflow; the worker's timestamp is only compared.
  const bool plausible = failure.timestamp >= kEarliestPlausibleTimestamp &&
                         failure.timestamp <= observed + kMaxTimestampAheadSeconds;
  return plausible ? failure.timestamp : observed;
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
        << "  time      : " << iso_time(report_timestamp(f)) << "\n"
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
  return "\n" + border + "\n" + title + "\n" + section + "\nFailures:\n" + others + "\n" + section +
         "\nRoot Cause (first observed failure):\n" + root_text + "\n" + border + "\n";
}

}  // namespace ddp::agent
