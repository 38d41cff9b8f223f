// Spawning worker processes for the launcher tests: fork/exec with extra
// environment variables, output captured to a temp file, killed on timeout.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "net_util.h"

namespace ddp::test {

// The directory of the built executables (ctest sets DDP_BUILD_BIN).
inline std::filesystem::path build_bin() {
  if (const char* dir = std::getenv("DDP_BUILD_BIN"); dir && *dir) return dir;
  return std::filesystem::canonical("/proc/self/exe").parent_path();
}


struct Spawned {
  pid_t pid = -1;
  std::filesystem::path log;
};

struct Result {
  int exit_code = -1;  // -1: killed on timeout or by a signal
  std::string output;  // stdout and stderr
};

inline Spawned spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  static int counter = 0;
  Spawned s;
  s.log = std::filesystem::temp_directory_path() /
          ("ddp_worker_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".log");
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    int fd = ::open(s.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    _exit(127);
  }
  s.pid = pid;
  return s;
}

// Waits for every process (killing the stragglers' process groups at `timeout`),
// returns their results and removes their logs.
inline std::vector<Result> wait_all(std::vector<Spawned>& procs, std::chrono::seconds timeout) {
  std::vector<Result> results(procs.size());
  std::vector<bool> done(procs.size(), false);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::size_t remaining = procs.size();
  while (remaining > 0) {
    for (std::size_t i = 0; i < procs.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      if (::waitpid(procs[i].pid, &status, WNOHANG) == procs[i].pid) {
        done[i] = true;
        --remaining;
        results[i].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (std::size_t i = 0; i < procs.size(); ++i) {
        if (!done[i]) {
          ::kill(-procs[i].pid, SIGKILL);
          ::waitpid(procs[i].pid, nullptr, 0);
          done[i] = true;
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (std::size_t i = 0; i < procs.size(); ++i) {
    std::ifstream in(procs[i].log);
    std::stringstream ss;
    ss << in.rdbuf();
    results[i].output = ss.str();
    std::filesystem::remove(procs[i].log);
  }
  return results;
}

}  // namespace ddp::test
