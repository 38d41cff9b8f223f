// The server side of torch's file-based timer protocol (torchrun's "file timer
// watchdog", torch.distributed.elastic.timer.FileTimerServer). Internal to
// ddp::agent.
//
// The protocol (torch 1.13 and every 2.x seen; the format did not change):
// workers use FileTimerClient, which opens a FIFO O_WRONLY|O_NONBLOCK, writes
// one JSON object and a newline, and closes it:
//   {"version": 1, "pid": 1234, "scope_id": "step", "expiration_time": 1700000000.25, "signal": 9}
// expiration_time is unix seconds; a negative one releases the scope
// (FileTimerClient.release writes expiration_time -1 and signal 0). A timer is
// keyed by (pid, scope_id): acquiring a key again replaces its expiration and
// signal. A signal of 0 or less means "report but do not signal"; torch's
// client sends SIGKILL unless told otherwise. The client refuses a request
// longer than PIPE_BUF (4,096 bytes), so a line is never interleaved.
//
// What torch's server does with expired timers (the caller's job here): per
// pid, log "Reaping worker_pid=[<pid>]. Expired timers: [<scopes>]", take the
// earliest-expiring timer whose signal is > 0 and kill(pid, signal) ("No
// signal specified with worker=[<pid>]. Do not reap it." when none has one);
// a pid that is gone (ESRCH) counts as reaped; then ALL the pid's timers are
// cleared, expired or not (forget_pid). take_expired returns timers ordered by
// expiration_time so that "the first with a signal" is the first in order.
//
// Differences from torch, on purpose: requests are accepted only for the pids
// the caller names (the agent's workers; torch would signal any pid someone
// writes), lines are validated instead of crashing the watchdog loop, and the
// number of timers is bounded.
//
// Ownership: FileTimerServer creates the FIFO and owns it and its descriptor;
// it is neither copyable nor movable. Blocking: nothing blocks; drain() reads
// what the pipe holds now (at most kMaxDrainBytes per call). Thread-safety:
// none; one thread (the agent's monitor loop) uses an instance, polling fd()
// for readability. parse_timer_request is a pure function. Errors: the
// constructor throws ddp::InvalidArgument for a path it refuses (a symbolic
// link, something other than a FIFO) or cannot create, naming the path and
// why; drain() throws ddp::InternalError when read() fails unexpectedly;
// malformed input never throws (it is counted). The destructor never throws.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddp::agent {

// torchrun's FIFO when TORCHELASTIC_TIMER_FILE is unset: this prefix and a
// random uuid4 ("/tmp/watchdog_timer_" + str(uuid.uuid4())).
inline constexpr std::string_view kDefaultTimerFilePrefix = "/tmp/watchdog_timer_";

// Limits on what a client can make the server hold.
inline constexpr std::size_t kMaxTimerLine = 64 * 1024;     // bytes, without the newline
inline constexpr std::size_t kMaxScopeIdBytes = 1024;       // after JSON unescaping
inline constexpr std::size_t kMaxTimersPerPid = 1024;       // more: ignored
inline constexpr std::size_t kMaxTimersTotal = 65536;       // more: ignored
inline constexpr std::size_t kMaxDrainBytes = 1024 * 1024;  // read by one drain() call

struct TimerRequest {
  int pid = 0;
  std::string scope_id;
  // Unix seconds; < 0 releases the scope.
  double expiration_time = 0;
  // 1..64, or 0: no signal (a client's 0 or negative signal).
  int signal = 0;
};

// One line of the protocol (without its newline). nullopt, with *why set (when
// `why` is not null), when it is not a valid request: not a JSON object, a
// field missing or of the wrong type (pid and signal integers, expiration_time
// a finite number, scope_id a string), a "version" other than 1 (a missing one
// is accepted: torch's server never reads it), pid <= 0 or over INT_MAX,
// signal > 64, scope_id over kMaxScopeIdBytes, a line over kMaxTimerLine.
// Unknown fields are ignored. Never throws.
std::optional<TimerRequest> parse_timer_request(std::string_view line, std::string* why);

struct ExpiredTimer {
  int pid;
  std::string scope_id;
  int signal;  // 0: report, do not signal
  double expiration_time;
};

// What torch's server does with the timers that expired at one look, per
// pid (in order of each pid's earliest timer): every expired scope, and the
// earliest-expiring timer with a signal > 0 (none: report, do not signal).
struct Reap {
  int pid = 0;
  std::vector<std::string> scopes;
  std::optional<ExpiredTimer> signal_from;
};
std::vector<Reap> plan_reaps(const std::vector<ExpiredTimer>& expired);

class FileTimerServer {
 public:
  // Creates the FIFO at `path`, mode 0600, and opens it
  // O_RDWR|O_NONBLOCK|O_CLOEXEC: holding a write end, the server never reads
  // EOF, and a client's open (even a blocking one) never blocks or fails with
  // ENXIO while the server lives. Like torch's FileTimerServer, an existing
  // FIFO at `path` is unlinked and a fresh one made (so it is ours, 0600, and
  // no stale reader shares it). Refused with InvalidArgument: `path` is a
  // symbolic link (even to a FIFO), or exists and is not a FIFO (torch would
  // delete a regular file there), or the FIFO cannot be made or opened.
  explicit FileTimerServer(std::string path, bool remove_on_close = true);
  // Closes the descriptor; when `remove_on_close`, unlinks the path if it
  // still names the FIFO this server made.
  ~FileTimerServer();
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::string& path() const { return path_; }
  // Readable when drain() has something to do.
  int fd() const { return fd_; }

  // Reads what is available now (never blocks; at most kMaxDrainBytes, so
  // call it again while fd() stays readable), splits it into lines and
  // applies each valid request whose pid is in `valid_pids`. A partial line
  // waits for the next call. Invalid lines count as bad_messages(); valid
  // requests for another pid, and acquisitions past kMaxTimersPerPid or
  // kMaxTimersTotal, count as ignored_messages(). A line over kMaxTimerLine
  // is dropped (through its newline, however long) and counted as bad,
  // without buffering more than kMaxTimerLine bytes.
  void drain(const std::set<int>& valid_pids);

  // Removes and returns the timers whose expiration_time is <= now, ordered
  // by expiration_time (then pid, then scope_id).
  std::vector<ExpiredTimer> take_expired(std::chrono::system_clock::time_point now);

  // The worker exited (or was reaped): its timers go.
  void forget_pid(int pid);

  std::size_t active_timers() const { return timers_.size(); }
  std::size_t bad_messages() const { return bad_; }          // unparseable
  std::size_t ignored_messages() const { return ignored_; }  // valid, not applied

 private:
  struct Timer {
    double expiration_time;
    int signal;
  };

  void handle_line(std::string_view line, const std::set<int>& valid_pids);
  void apply(TimerRequest request);

  std::string path_;
  bool remove_on_close_;
  int fd_ = -1;
  // The FIFO this server made, to unlink only that one.
  dev_t dev_ = 0;
  ino_t ino_ = 0;

  std::map<std::pair<int, std::string>, Timer> timers_;
  std::map<int, std::size_t> per_pid_;
  // The start of a line whose newline has not arrived (<= kMaxTimerLine).
  std::string pending_;
  // Inside an over-long line: drop bytes through the next newline.
  bool discarding_ = false;
  std::size_t bad_ = 0;
  std::size_t ignored_ = 0;
};

}  // namespace ddp::agent
