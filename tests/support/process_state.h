// What /proc says about a process: its state, parent, group and CPU time
// (/proc/<pid>/stat), and the fields of /proc/<pid>/status, for tests that
// check a process is gone and benchmarks that measure one.
//
// Ownership: none; every call reads /proc afresh. Blocking: a file read.
// Thread-safety: every function may be called from any thread. Errors: none
// thrown; a process that is gone (or a field /proc does not have) reads as
// nullopt, and process_dead() says true. That includes a process that ends
// between the open and the read of its file: the read then fails with ESRCH,
// which std::ifstream's buffer turns into an exception (libstdc++), so /proc
// is read with open(2) and read(2) here.
#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <sstream>
#include <string>

namespace ddp::test {

// The fields of /proc/<pid>/stat that tests and benchmarks read.
struct ProcStat {
  char state = '?';  // R, S, D, T, Z (zombie), X (dead), ...
  pid_t ppid = -1;
  pid_t pgrp = -1;
  // CPU time used so far, in clock ticks (sysconf(_SC_CLK_TCK) a second).
  double user_ticks = 0;
  double system_ticks = 0;
};

// Everything left to read from `fd` (a /proc file), or nullopt when a read
// fails (ESRCH: its process ended after the file was opened). Leaves `fd` open.
inline std::optional<std::string> read_proc_fd(int fd) {
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) return text;
    text.append(buffer, static_cast<std::size_t>(n));
  }
}

// The text of a /proc file, or nullopt when it cannot be opened or read.
inline std::optional<std::string> read_proc_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  auto text = read_proc_fd(fd);
  ::close(fd);
  return text;
}

// `pid`'s /proc/<pid>/stat, or nullopt when the process is gone.
inline std::optional<ProcStat> proc_stat(pid_t pid) {
  const auto read = read_proc_file("/proc/" + std::to_string(pid) + "/stat");
  if (!read) return std::nullopt;
  const std::string& text = *read;
  // The command name (field 2) is in parentheses and may hold spaces or ')':
  // the fields that follow start after the last ')'.
  const auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return std::nullopt;
  std::istringstream fields(text.substr(close + 2));
  ProcStat stat;
  long ppid = -1, pgrp = -1;
  fields >> stat.state >> ppid >> pgrp;
  // Fields 6 to 13 (session ... cmajflt) come before utime (14) and stime (15).
  std::string skip;
  for (int field = 6; field <= 13; ++field) fields >> skip;
  fields >> stat.user_ticks >> stat.system_ticks;
  stat.ppid = static_cast<pid_t>(ppid);
  stat.pgrp = static_cast<pid_t>(pgrp);
  return stat;
}

// true when `pid` is gone or a zombie (dead, waiting for its parent to reap it:
// on this machine PID 1 does not reap orphans, so a killed orphan stays one).
inline bool process_dead(pid_t pid) {
  const auto stat = proc_stat(pid);
  return !stat || stat->state == 'Z' || stat->state == 'X';
}

// The CPU seconds (user + system) process `pid` used so far (0 when it is gone).
inline double process_cpu_seconds(pid_t pid) {
  const auto stat = proc_stat(pid);
  if (!stat) return 0;
  return (stat->user_ticks + stat->system_ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// A field of /proc/<pid>/status in kB, as the kernel writes it ("VmRSS",
// "VmHWM"); pid 0 reads this process's. nullopt when the process is gone or
// has no such field.
inline std::optional<double> proc_status_kib(pid_t pid, const std::string& field) {
  const auto text = read_proc_file(pid == 0 ? std::string("/proc/self/status")
                                            : "/proc/" + std::to_string(pid) + "/status");
  if (!text) return std::nullopt;
  std::istringstream status(*text);
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1));
  }
  return std::nullopt;
}

}  // namespace ddp::test
