// What /proc says about a process, for tests that check a process is gone.
#pragma once

#include <sys/types.h>

#include <fstream>
#include <iterator>
#include <string>

namespace ddp::test {

// true when `pid` is gone or a zombie (dead, waiting for its parent to reap it:
// on this machine PID 1 does not reap orphans, so a killed orphan stays one).
inline bool process_dead(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  auto close = text.rfind(')');
  return close == std::string::npos || close + 2 >= text.size() || text[close + 2] == 'Z' ||
         text[close + 2] == 'X';
}

}  // namespace ddp::test
