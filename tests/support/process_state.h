// What /proc says about a process: its state, parent, group and CPU time
// (/proc/<pid>/stat), and the fields of /proc/<pid>/status, for tests that
// check a process is gone and benchmarks that measure one.
//
// Ownership: none; every call reads /proc afresh. Blocking: a file read.
// Thread-safety: every function may be called from any thread. Errors: none
// thrown; a process that is gone (or a field /proc does not have) reads as
// nullopt, and process_dead() says true.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
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

// `pid`'s /proc/<pid>/stat, or nullopt when the process is gone.
inline std::optional<ProcStat> proc_stat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)), {});
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
  std::ifstream status(pid == 0 ? std::string("/proc/self/status")
                                : "/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1));
  }
  return std::nullopt;
}

}  // namespace ddp::test
