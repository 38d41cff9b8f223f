// Helpers for tests that run ddprun as a child process: start with a given
// environment, capture stdout/stderr into files, wait with a timeout, inspect
// /proc. Header-only; every helper cleans up what it creates.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
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

#include <gtest/gtest.h>

#include "process_state.h"
#include "temp_dir.h"

namespace ddp::test {

namespace fs = std::filesystem;

inline std::string bin_dir() {
  const char* dir = std::getenv("DDP_BUILD_BIN");
  return dir ? dir : ".";
}

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The minimal environment tests give ddprun (so the expected worker
// environment is known exactly).
inline std::map<std::string, std::string> base_env() {
  std::map<std::string, std::string> env;
  env["PATH"] = std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin";
  env["HOME"] = "/tmp";
  env["DDP_TEST_MARKER"] = "kept";
  return env;
}

struct Child {
  pid_t pid = -1;
  fs::path out;
  fs::path err;
};

inline Child spawn(const std::vector<std::string>& argv,
                   const std::map<std::string, std::string>& env, const fs::path& dir,
                   const std::string& tag = "ddprun") {
  Child child;
  child.out = dir / (tag + ".stdout");
  child.err = dir / (tag + ".stderr");
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int out = ::open(child.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int err = ::open(child.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  child.pid = ::fork();
  if (child.pid == 0) {
    ::dup2(out, 1);
    ::dup2(err, 2);
    // ddprun gets nothing of the test process but 0, 1 and 2, so that the
    // descriptors a test finds in ddprun (or its workers) are ddprun's own.
    ::close_range(3, ~0U, 0);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::close(out);
  ::close(err);
  return child;
}

// Waits for the child; kills it (SIGKILL) and returns -1 after `timeout`.
// Returns the exit code, or 128+signal.
inline int wait_child(pid_t pid, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

struct RunResult {
  int code = -1;
  std::string out;
  std::string err;
};

inline RunResult run(const std::vector<std::string>& argv,
                     const std::map<std::string, std::string>& env, const fs::path& dir,
                     std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  Child child = spawn(argv, env, dir);
  RunResult result;
  result.code = wait_child(child.pid, timeout);
  result.out = read_text(child.out);
  result.err = read_text(child.err);
  fs::remove(child.out);
  fs::remove(child.err);
  return result;
}

// Kills `pid` when it still runs: the cleanup of a test whose process should
// have been killed by the code under test but was not.
inline void kill_if_alive(pid_t pid) {
  if (pid > 0 && !process_dead(pid)) ::kill(pid, SIGKILL);
}

// The descriptors of process `pid` that are not close-on-exec, as
// "<fd> -> <target>" (from /proc/<pid>/fd and the flags in /proc/<pid>/fdinfo),
// leaving out 0, 1 and 2. Empty when the process is gone.
inline std::vector<std::string> inheritable_fds(pid_t pid) {
  std::vector<std::string> found;
  const std::string base = "/proc/" + std::to_string(pid);
  DIR* dir = ::opendir((base + "/fd").c_str());
  if (dir == nullptr) return found;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    if (std::atoi(entry->d_name) <= 2) continue;
    std::ifstream info(base + "/fdinfo/" + entry->d_name);
    std::string key;
    std::string flags;
    while (info >> key) {
      if (key == "flags:") {
        info >> flags;
        break;
      }
    }
    if (flags.empty()) continue;  // closed meanwhile
    if ((std::stoul(flags, nullptr, 8) & O_CLOEXEC) != 0) continue;
    char target[512] = {};
    ssize_t n = ::readlink((base + "/fd/" + entry->d_name).c_str(), target, sizeof(target) - 1);
    found.push_back(std::string(entry->d_name) + " -> " +
                    (n > 0 ? std::string(target, static_cast<std::size_t>(n)) : "?"));
  }
  ::closedir(dir);
  return found;
}

// Live (non-zombie) processes whose process group is `pgid`, from /proc.
inline std::vector<pid_t> live_members_of_group(pid_t pgid) {
  std::vector<pid_t> members;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return members;
  while (dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    std::ifstream stat(std::string("/proc/") + entry->d_name + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), {});
    auto close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(text.substr(close + 2));
    char state = 0;
    long ppid = 0, pgrp = 0;
    fields >> state >> ppid >> pgrp;
    if (pgrp == pgid && state != 'Z' && state != 'X') members.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(proc);
  return members;
}

// Polls `done` until it holds or `timeout` passes; returns its last value.
template <typename Predicate>
bool eventually(Predicate done, std::chrono::milliseconds timeout = std::chrono::seconds(1)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Waits until `path` exists (a worker announcing itself); false after timeout.
inline bool wait_for_file(const fs::path& path,
                          std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!fs::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace ddp::test
