// Child processes for tests and benchmarks: start a program with a given
// environment and its stdout and stderr captured into files, wait for it with
// a timeout, kill it (with its process group), and read what /proc says of
// processes (descriptors, group members).
//
// One exit-code convention everywhere (wait_child, Child::code, RunResult):
// the exit status; 128 + the signal for a process a signal ended; -1 for one
// still running at its timeout (the helper then killed it) or not reaped yet.
// "Gone" checks (kill_if_alive, live_members_of_group, process_state.h's
// process_dead) count a zombie as gone: on this machine PID 1 does not reap
// orphans, so a killed orphan stays a zombie for good.
//
// Ownership: spawn() writes its files into a directory the caller owns
// (usually a TempDir) and leaves the process to the caller, who reaps it:
// wait_child, the *_children functions, wait_all, or a ChildrenGuard.
// Blocking: spawn() does not wait for the program; the wait functions poll
// every few milliseconds up to their timeouts. Thread-safety: a Child, and a
// vector of them, belong to one thread; the functions may be called from any
// thread, but a child spawned with die_with_parent dies with the thread that
// spawned it. Errors: spawn() and run() throw std::runtime_error when an
// output file cannot be opened or fork() fails; a program that cannot be
// executed exits 127 with the reason on its stderr.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "process_state.h"
#include "sys_error.h"
#include "temp_dir.h"

extern char** environ;

namespace ddp::test {

namespace fs = std::filesystem;

// The directory of this program.
inline std::string exe_dir() { return fs::canonical("/proc/self/exe").parent_path().string(); }

// The directory of the built programs: DDP_BUILD_BIN (ctest sets it), else
// this program's own (tests and programs share build/bin).
inline std::string bin_dir() {
  const char* dir = std::getenv("DDP_BUILD_BIN");
  return dir != nullptr && *dir != '\0' ? std::string(dir) : exe_dir();
}

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
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

// This process's environment with `extra` set over it.
inline std::map<std::string, std::string> environment_with(
    const std::map<std::string, std::string>& extra = {}) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    const auto eq = var.find('=');
    if (eq != std::string::npos) env.emplace(var.substr(0, eq), var.substr(eq + 1));
  }
  for (const auto& [name, value] : extra) env[name] = value;
  return env;
}

struct SpawnOptions {
  // The child leads a process group of its own; kill_children() kills the
  // whole group, so whatever the program started goes with it.
  bool own_group = false;
  // The child gets SIGKILL when the thread that spawned it exits
  // (PR_SET_PDEATHSIG), so a benchmark that dies leaves nothing running.
  bool die_with_parent = false;
};

struct Child {
  pid_t pid = -1;
  fs::path out;  // its stdout
  fs::path err;  // its stderr
  bool own_group = false;
  // Set when poll_children(), wait_children(), kill_children() or wait_all()
  // reaps it; wait_child() takes a bare pid and sets none of them.
  bool done = false;
  bool killed = false;  // by kill_children(), while it still ran
  int status = 0;       // waitpid()'s
  std::chrono::steady_clock::time_point ended;

  // The exit code (see the top of the file): -1 until reaped, and when killed.
  int code() const {
    if (!done || killed) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  bool ok() const { return code() == 0; }
  // "exit status N", "signal N" or "still running", for messages.
  std::string exit_text() const {
    if (!done) return "still running";
    if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
    return "signal " + std::to_string(WTERMSIG(status));
  }
};

// Starts `argv` (argv[0] a path: no PATH search) with exactly `env` as its
// environment, stdout into <dir>/<tag>.stdout and stderr into
// <dir>/<tag>.stderr (both truncated). The child gets nothing of this process
// but descriptors 0, 1 and 2, so that the descriptors a test finds in it (or
// in its children) are its own; and SIGPIPE at its default action, whatever
// this process does with it. `pass_fds`: descriptors of this process the
// child gets as 3, 4, ... in this order.
inline Child spawn(const std::vector<std::string>& argv,
                   const std::map<std::string, std::string>& env, const fs::path& dir,
                   const std::string& tag = "ddprun", SpawnOptions options = {},
                   const std::vector<int>& pass_fds = {}) {
  Child child;
  child.out = dir / (tag + ".stdout");
  child.err = dir / (tag + ".stderr");
  child.own_group = options.own_group;
  // Everything the child uses is built before fork(): in a parent with
  // threads, the child may only make async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (const auto& [name, value] : env) env_strings.push_back(name + "=" + value);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const std::string cannot = "cannot execute " + argv.at(0) + "\n";
  const int out = ::open(child.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = ::open(child.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0 || err < 0) {
    const auto error = sys_error("open " + (out < 0 ? child.out : child.err).string());
    for (int fd : {out, err}) {
      if (fd >= 0) ::close(fd);
    }
    throw error;
  }
  const pid_t parent = ::getpid();
  child.pid = ::fork();
  if (child.pid == 0) {
    if (options.own_group) ::setpgid(0, 0);
    if (options.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the parent is gone already
    }
    ::signal(SIGPIPE, SIG_DFL);  // an ignored SIGPIPE would survive the exec
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    // Out of the way first (a passed descriptor may be one of 3, 4, ...), then in place.
    constexpr int kHigh = 1000;
    for (std::size_t i = 0; i < pass_fds.size(); ++i) {
      ::dup2(pass_fds[i], kHigh + static_cast<int>(i));
    }
    for (std::size_t i = 0; i < pass_fds.size(); ++i) {
      ::dup2(kHigh + static_cast<int>(i), 3 + static_cast<int>(i));
    }
    ::close_range(3 + static_cast<unsigned>(pass_fds.size()), ~0U, 0);
    ::execve(args[0], args.data(), envp.data());
    [[maybe_unused]] ssize_t written = ::write(STDERR_FILENO, cannot.data(), cannot.size());
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(out);
  ::close(err);
  if (child.pid < 0) {
    errno = fork_errno;
    throw sys_error("fork");
  }
  // Also here: no window in which a kill of the group misses the child.
  if (options.own_group) ::setpgid(child.pid, child.pid);
  return child;
}

// Waits for `pid`; kills it (SIGKILL, the process alone) after `timeout`.
// Returns the exit code, 128 + signal, or -1 when it was killed at the timeout.
inline int wait_child(pid_t pid, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Reaps, without waiting, every child that ended; true when all have.
inline bool poll_children(std::vector<Child>& children) {
  bool all = true;
  for (auto& c : children) {
    if (c.done) continue;
    int status = 0;
    if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.done = true;
      c.status = status;
      c.ended = std::chrono::steady_clock::now();
    } else {
      all = false;
    }
  }
  return all;
}

// Waits until every child ended or `deadline` passed (polling every
// millisecond, so that Child::ended is that precise); false when some still
// run. Kills nobody.
inline bool wait_children(std::vector<Child>& children,
                          std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    if (poll_children(children)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Kills (with its group, when it has one of its own) and reaps every child
// that still runs.
inline void kill_children(std::vector<Child>& children) {
  for (auto& c : children) {
    if (c.done) continue;
    if (c.own_group) ::killpg(c.pid, SIGKILL);
    ::kill(c.pid, SIGKILL);
  }
  for (auto& c : children) {
    if (c.done) continue;
    ::waitpid(c.pid, &c.status, 0);
    c.done = true;
    c.killed = true;
    c.ended = std::chrono::steady_clock::now();
  }
}

// Kills and reaps, when the scope ends, every child in `children` that still runs.
struct ChildrenGuard {
  std::vector<Child>& children;
  ~ChildrenGuard() { kill_children(children); }
};

struct RunResult {
  int code = -1;
  std::string out;
  std::string err;
  // Both streams, stdout first.
  std::string output() const { return out + err; }
};

// Waits for every child up to `timeout`, kills those still running (code -1)
// and returns each one's code and output.
inline std::vector<RunResult> wait_all(std::vector<Child>& children,
                                       std::chrono::milliseconds timeout) {
  wait_children(children, std::chrono::steady_clock::now() + timeout);
  kill_children(children);
  std::vector<RunResult> results;
  for (const auto& c : children) results.push_back({c.code(), read_text(c.out), read_text(c.err)});
  return results;
}

// Runs `argv` to its end (killed after `timeout`): its code and output. Its
// files in `dir` are removed.
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

// Every child's stderr after a "--- <its file>" line, for failure messages;
// only the last `bytes` of each (after "...") when it is longer.
template <typename Children>
std::string stderr_of(const Children& children, std::size_t bytes = std::string::npos) {
  std::string text;
  for (const Child& c : children) {
    std::string err = read_text(c.err);
    if (err.size() > bytes) err = "..." + err.substr(err.size() - bytes);
    text += "--- " + c.err.string() + "\n" + err;
  }
  return text;
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
    const auto text = read_proc_file(base + "/fdinfo/" + entry->d_name);
    if (!text) continue;  // closed meanwhile, or the process ended
    std::istringstream info(*text);
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

// Live (neither zombie nor dead) processes whose process group is `pgid`, from /proc.
inline std::vector<pid_t> live_members_of_group(pid_t pgid) {
  std::vector<pid_t> members;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return members;
  while (dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    const auto stat = proc_stat(static_cast<pid_t>(pid));
    if (stat && stat->pgrp == pgid && stat->state != 'Z' && stat->state != 'X') {
      members.push_back(static_cast<pid_t>(pid));
    }
  }
  ::closedir(proc);
  return members;
}

// Polls `done` every `interval` until it holds or `timeout` passes; returns its last value.
template <typename Predicate>
bool eventually(Predicate done, std::chrono::milliseconds timeout = std::chrono::seconds(1),
                std::chrono::milliseconds interval = std::chrono::milliseconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return done();
    std::this_thread::sleep_for(interval);
  }
  return true;
}

// Waits until `path` exists (a worker announcing itself); false after timeout.
inline bool wait_for_file(const fs::path& path,
                          std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!fs::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace ddp::test
