#include "file_timer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "ddp/common/error.h"
#include "ddp/common/json.h"

namespace ddp::agent {
namespace {

using Json = nlohmann::json;

constexpr const char* kOrigin = "FileTimerServer";
// How much one read() takes from the pipe (a pipe holds 64 KiB by default).
constexpr std::size_t kReadChunk = 64 * 1024;

std::string errno_text(int err) { return std::strerror(err); }

// A member of the object `doc`, or null.
const Json* member(const Json& doc, const char* key) {
  auto it = doc.find(key);
  return it == doc.end() ? nullptr : &*it;
}

// A JSON integer as int64, saturating an unsigned one past INT64_MAX; nullopt
// when the value is not an integer (a float, a bool, a string...).
std::optional<std::int64_t> as_integer(const Json& value) {
  if (value.is_number_unsigned()) {
    auto u = value.get<std::uint64_t>();
    constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    return u > kMax ? std::numeric_limits<std::int64_t>::max() : static_cast<std::int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<std::int64_t>();
  return std::nullopt;
}

}  // namespace

std::optional<TimerRequest> parse_timer_request(std::string_view line, std::string* why) {
  auto fail = [why](const std::string& reason) -> std::optional<TimerRequest> {
    if (why != nullptr) *why = reason;
    return std::nullopt;
  };
  if (line.size() > kMaxTimerLine) {
    return fail("request longer than " + std::to_string(kMaxTimerLine) + " bytes");
  }
  // Every field is a scalar at depth 1: anything nested deeper is dropped at
  // parse time (and a field that is a container is refused below).
  ddp::json::Parsed parsed = ddp::json::parse_bounded(line, /*max_depth=*/1);
  if (!parsed.valid) return fail("not valid JSON");
  const Json& doc = parsed.value;
  if (!doc.is_object()) return fail("not a JSON object");

  // torch writes "version": 1 (1.13 and 2.x); its server never reads it, so a
  // request without one is accepted, but a different version is a format
  // this server does not know.
  if (const Json* version = member(doc, "version")) {
    auto v = as_integer(*version);
    if (!v) return fail("\"version\" is not an integer");
    if (*v != 1) return fail("unknown version " + std::to_string(*v) + " (only 1 is known)");
  }

  TimerRequest request;
  const Json* pid = member(doc, "pid");
  if (pid == nullptr) return fail("missing \"pid\"");
  auto pid_value = as_integer(*pid);
  if (!pid_value) return fail("\"pid\" is not an integer");
  if (*pid_value <= 0 || *pid_value > INT_MAX) {
    return fail("\"pid\" " + std::to_string(*pid_value) + " is out of range");
  }
  request.pid = static_cast<int>(*pid_value);

  const Json* scope = member(doc, "scope_id");
  if (scope == nullptr) return fail("missing \"scope_id\"");
  if (!scope->is_string()) return fail("\"scope_id\" is not a string");
  const auto& scope_text = scope->get_ref<const std::string&>();
  if (scope_text.size() > kMaxScopeIdBytes) {
    return fail("\"scope_id\" longer than " + std::to_string(kMaxScopeIdBytes) + " bytes");
  }
  request.scope_id = scope_text;

  const Json* expiration = member(doc, "expiration_time");
  if (expiration == nullptr) return fail("missing \"expiration_time\"");
  if (!expiration->is_number()) return fail("\"expiration_time\" is not a number");
  request.expiration_time = expiration->get<double>();
  if (!std::isfinite(request.expiration_time)) return fail("\"expiration_time\" is not finite");

  const Json* signal = member(doc, "signal");
  if (signal == nullptr) return fail("missing \"signal\"");
  auto signal_value = as_integer(*signal);
  if (!signal_value) return fail("\"signal\" is not an integer");
  if (*signal_value > 64) {
    return fail("\"signal\" " + std::to_string(*signal_value) + " is out of range");
  }
  // torch: "Using a negative or zero signal will not kill the process".
  request.signal = *signal_value > 0 ? static_cast<int>(*signal_value) : 0;
  return request;
}

FileTimerServer::FileTimerServer(std::string path, bool remove_on_close)
    : path_(std::move(path)), remove_on_close_(remove_on_close) {
  auto refuse = [this](const std::string& why) {
    throw InvalidArgument(kOrigin, "timer file '" + path_ + "': " + why);
  };
  if (path_.empty()) refuse("the path is empty");

  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) refuse("is a symbolic link; refusing to follow it");
    if (!S_ISFIFO(st.st_mode)) refuse("exists and is not a FIFO; refusing to replace it");
    // A FIFO left behind (torch does the same: remove, then mkfifo): a fresh
    // one is ours, mode 0600, and shared with no stale reader.
    if (::unlink(path_.c_str()) != 0 && errno != ENOENT) {
      refuse("cannot remove the existing FIFO: " + errno_text(errno));
    }
  } else if (errno != ENOENT) {
    refuse("cannot stat it: " + errno_text(errno));
  }

  if (::mkfifo(path_.c_str(), 0600) != 0) refuse("cannot create the FIFO: " + errno_text(errno));
  if (::lstat(path_.c_str(), &st) != 0 || !S_ISFIFO(st.st_mode)) {
    refuse("the FIFO was replaced right after its creation");
  }
  dev_ = st.st_dev;
  ino_ = st.st_ino;

  // O_RDWR on a FIFO (defined on Linux) opens without waiting for a writer,
  // and the write end held here means reads never see EOF.
  do {
    fd_ = ::open(path_.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
  } while (fd_ < 0 && errno == EINTR);
  std::string failure;
  if (fd_ < 0) {
    failure = "cannot open the FIFO: " + errno_text(errno);
  } else if (::fstat(fd_, &st) != 0 || !S_ISFIFO(st.st_mode) || st.st_dev != dev_ ||
             st.st_ino != ino_) {
    failure = "the FIFO was replaced while being opened";
  } else if (::fchmod(fd_, 0600) != 0) {
    // mkfifo's mode passed through the umask; make it exactly 0600.
    failure = "cannot set the FIFO's mode: " + errno_text(errno);
  }
  if (!failure.empty()) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    struct stat now {};
    if (::lstat(path_.c_str(), &now) == 0 && S_ISFIFO(now.st_mode) && now.st_dev == dev_ &&
        now.st_ino == ino_) {
      ::unlink(path_.c_str());
    }
    refuse(failure);
  }
}

FileTimerServer::~FileTimerServer() {
  if (fd_ >= 0) ::close(fd_);
  if (!remove_on_close_) return;
  // Only the FIFO made here: not whatever someone put at the path since.
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0 && S_ISFIFO(st.st_mode) && st.st_dev == dev_ &&
      st.st_ino == ino_) {
    ::unlink(path_.c_str());
  }
}

void FileTimerServer::drain(const std::set<int>& valid_pids) {
  std::string chunk(kReadChunk, '\0');
  std::size_t total = 0;
  while (total < kMaxDrainBytes) {
    const std::size_t want = std::min(kReadChunk, kMaxDrainBytes - total);
    ssize_t n = ::read(fd_, chunk.data(), want);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      throw InternalError(kOrigin, "read from timer file '" + path_ + "': " + errno_text(errno));
    }
    // EOF cannot happen while the write end opened here is held.
    if (n == 0) return;
    total += static_cast<std::size_t>(n);

    std::string_view data(chunk.data(), static_cast<std::size_t>(n));
    while (!data.empty()) {
      const std::size_t newline = data.find('\n');
      const bool complete = newline != std::string_view::npos;
      std::string_view piece = data.substr(0, complete ? newline : data.size());
      data.remove_prefix(complete ? newline + 1 : data.size());
      if (discarding_) {
        // The rest of an over-long line, already counted.
        if (complete) discarding_ = false;
        continue;
      }
      if (pending_.size() + piece.size() > kMaxTimerLine) {
        ++bad_;
        pending_.clear();
        discarding_ = !complete;
        continue;
      }
      if (!complete) {
        pending_.append(piece);
      } else if (pending_.empty()) {
        handle_line(piece, valid_pids);
      } else {
        pending_.append(piece);
        handle_line(pending_, valid_pids);
        pending_.clear();
      }
    }
  }
}

void FileTimerServer::handle_line(std::string_view line, const std::set<int>& valid_pids) {
  std::optional<TimerRequest> request = parse_timer_request(line, nullptr);
  if (!request) {
    ++bad_;
    return;
  }
  if (valid_pids.count(request->pid) == 0) {
    ++ignored_;
    return;
  }
  apply(std::move(*request));
}

void FileTimerServer::apply(TimerRequest request) {
  const int pid = request.pid;
  auto key = std::make_pair(pid, std::move(request.scope_id));
  auto it = timers_.find(key);
  if (request.expiration_time < 0) {
    // A release; releasing a scope that is not held does nothing (torch too).
    if (it != timers_.end()) {
      timers_.erase(it);
      auto count = per_pid_.find(pid);
      if (count != per_pid_.end() && --count->second == 0) per_pid_.erase(count);
    }
    return;
  }
  if (it != timers_.end()) {
    it->second = Timer{request.expiration_time, request.signal};
    return;
  }
  auto count = per_pid_.find(pid);
  const std::size_t held = count == per_pid_.end() ? 0 : count->second;
  if (held >= kMaxTimersPerPid || timers_.size() >= kMaxTimersTotal) {
    ++ignored_;
    return;
  }
  timers_.emplace(std::move(key), Timer{request.expiration_time, request.signal});
  ++per_pid_[pid];
}

std::vector<ExpiredTimer> FileTimerServer::take_expired(std::chrono::system_clock::time_point now) {
  const double now_seconds = std::chrono::duration<double>(now.time_since_epoch()).count();
  std::vector<ExpiredTimer> expired;
  for (auto it = timers_.begin(); it != timers_.end();) {
    if (it->second.expiration_time > now_seconds) {
      ++it;
      continue;
    }
    const int pid = it->first.first;
    expired.push_back(
        ExpiredTimer{pid, it->first.second, it->second.signal, it->second.expiration_time});
    it = timers_.erase(it);
    auto count = per_pid_.find(pid);
    if (count != per_pid_.end() && --count->second == 0) per_pid_.erase(count);
  }
  std::sort(expired.begin(), expired.end(), [](const ExpiredTimer& a, const ExpiredTimer& b) {
    if (a.expiration_time != b.expiration_time) return a.expiration_time < b.expiration_time;
    if (a.pid != b.pid) return a.pid < b.pid;
    return a.scope_id < b.scope_id;
  });
  return expired;
}

std::vector<Reap> plan_reaps(const std::vector<ExpiredTimer>& expired) {
  std::vector<ExpiredTimer> ordered = expired;
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const ExpiredTimer& a, const ExpiredTimer& b) {
                     return a.expiration_time < b.expiration_time;
                   });
  std::vector<Reap> reaps;
  for (const auto& timer : ordered) {
    auto it = std::find_if(reaps.begin(), reaps.end(),
                           [&](const Reap& reap) { return reap.pid == timer.pid; });
    if (it == reaps.end()) it = reaps.insert(reaps.end(), Reap{timer.pid, {}, std::nullopt});
    it->scopes.push_back(timer.scope_id);
    if (!it->signal_from && timer.signal > 0) it->signal_from = timer;
  }
  return reaps;
}

void FileTimerServer::forget_pid(int pid) {
  auto it = timers_.lower_bound(std::make_pair(pid, std::string()));
  while (it != timers_.end() && it->first.first == pid) it = timers_.erase(it);
  per_pid_.erase(pid);
}

}  // namespace ddp::agent
