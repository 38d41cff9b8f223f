// collect_native_stacks: fork + exec eu-stack (or gdb), read its output
// through one pipe with a deadline (poll), then kill its process group and reap
// it with waitpid(tool pid). See stack_dump.h.
#include "stack_dump.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "ddp/common/time.h"

extern char** environ;

namespace ddp::agent {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr std::size_t kMaxErrorQuote = 1024;

// The absolute path of executable `name` in PATH's absolute directories, then
// /usr/bin; empty when there is none. Relative PATH entries (and the empty
// one, meaning the working directory) are skipped.
std::string find_tool(const std::string& name) {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::string all = path;
    std::size_t start = 0;
    for (;;) {
      std::size_t end = all.find(':', start);
      std::string dir = all.substr(start, end == std::string::npos ? end : end - start);
      if (!dir.empty() && dir[0] == '/') dirs.push_back(dir);
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  dirs.push_back("/usr/bin");
  for (const auto& dir : dirs) {
    std::string candidate = dir + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return {};
}

// The state letter of /proc/<pid>/stat (R, S, D, T, t, Z...), or 0 when the
// process is gone.
char process_state(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) return 0;
  std::string text((std::istreambuf_iterator<char>(in)), {});
  // The command name is in parentheses and may hold ')': the state follows the last one.
  const auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return 0;
  return text[close + 2];
}

std::string errno_text(int err) { return std::strerror(err); }

// What one run of a tool gave.
struct ToolRun {
  std::string start_error;  // the tool could not be started (pipe, fork)
  bool timed_out = false;
  bool exited = false;  // exited by itself, with `exit_code`
  int exit_code = -1;
  int signal = 0;          // or was killed by this signal (not by us)
  bool has_frame = false;  // a line starting with "#0" followed by a blank
  std::string text;        // at most max_bytes of the output
  std::size_t total = 0;   // bytes the tool printed
};

// Scans output for "#0" + blank at a line start, across chunk boundaries.
class FrameFinder {
 public:
  bool found() const { return found_; }
  void feed(const char* data, std::size_t size) {
    for (std::size_t i = 0; i < size && !found_; ++i) {
      const char c = data[i];
      if (matched_ == 2 && (c == ' ' || c == '\t')) {
        found_ = true;
      } else if (matched_ == 1 && c == '0') {
        matched_ = 2;
      } else {
        matched_ = (line_start_ && c == '#') ? 1 : 0;
      }
      line_start_ = c == '\n';
    }
  }

 private:
  bool line_start_ = true;
  int matched_ = 0;
  bool found_ = false;
};

// Runs argv[0] (an absolute path) until it exits or `deadline`, keeping at
// most `max_bytes` of its output. Always reaps it before returning.
ToolRun run_tool(const std::vector<std::string>& args, SteadyClock::time_point deadline,
                 std::size_t max_bytes) {
  ToolRun run;
  // Everything the child needs is prepared before fork: after fork in a
  // multi-threaded process only async-signal-safe calls are allowed.
  std::vector<char*> argv;
  for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  // The caller's environment, without debuginfod (a tool would fetch debug
  // information over the network) and with messages in plain English.
  std::vector<std::string> env_strings;
  for (char** var = environ; var != nullptr && *var != nullptr; ++var) {
    std::string entry = *var;
    auto name = entry.substr(0, entry.find('='));
    if (name == "DEBUGINFOD_URLS" || name == "LC_ALL" || name == "LANGUAGE") continue;
    env_strings.push_back(std::move(entry));
  }
  env_strings.push_back("LC_ALL=C");
  std::vector<char*> envp;
  for (auto& var : env_strings) envp.push_back(var.data());
  envp.push_back(nullptr);
  const std::string exec_failed = "cannot execute " + args[0] + "\n";

  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) {
    run.start_error = "cannot open /dev/null: " + errno_text(errno);
    return run;
  }
  int out[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0) {
    run.start_error = "pipe: " + errno_text(errno);
    ::close(null_fd);
    return run;
  }
  sigset_t no_signals;
  sigemptyset(&no_signals);
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) {
    run.start_error = "fork: " + errno_text(errno);
    for (int fd : {null_fd, out[0], out[1]}) ::close(fd);
    return run;
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the caller died before prctl
    ::dup2(null_fd, STDIN_FILENO);            // dup2 clears O_CLOEXEC on the target
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(out[1], STDERR_FILENO);
    // Nothing else of the caller's reaches the tool (kernels before 5.11 lack
    // the flag: then only the descriptors' own close-on-exec flags apply).
    ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
    // The agent blocks the signals its signalfd reads and ignores SIGPIPE; both
    // would survive exec.
    ::signal(SIGPIPE, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &no_signals, nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    ssize_t ignored = ::write(STDOUT_FILENO, exec_failed.data(), exec_failed.size());
    (void)ignored;
    ::_exit(127);
  }
  // Parent. Set the group here too, so that it exists before we may kill it.
  ::setpgid(pid, pid);
  ::close(null_fd);
  ::close(out[1]);
  const int fd = out[0];

  FrameFinder frames;
  char buffer[16 * 1024];
  for (;;) {
    const auto now = real_runtime().now();
    if (now >= deadline) {
      run.timed_out = true;
      break;
    }
    // Rounded up, so that an early wake does not spin.
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    pollfd poll_fd{fd, POLLIN, 0};
    const int ready = ::poll(&poll_fd, 1, static_cast<int>(std::min<long long>(left, INT_MAX)));
    if (ready < 0 && errno != EINTR) break;  // cannot happen with one valid descriptor
    if (ready <= 0) continue;
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      break;
    }
    if (n == 0) break;  // EOF: the tool (and anything it started) closed its output
    const auto size = static_cast<std::size_t>(n);
    frames.feed(buffer, size);
    if (run.text.size() < max_bytes) {
      run.text.append(buffer, std::min(size, max_bytes - run.text.size()));
    }
    run.total += size;
  }
  ::close(fd);

  // Output closed: the tool is exiting. Wait for that (without reaping: its
  // zombie keeps the group id from being reused) until the deadline.
  bool gone = false;  // reaped by somebody else, or SIGCHLD ignored
  if (!run.timed_out) {
    auto pause = Duration(1);
    for (;;) {
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
        if (errno == EINTR) continue;
        gone = true;  // ECHILD
        break;
      }
      if (info.si_pid == pid) break;
      if (real_runtime().now() >= deadline) {
        run.timed_out = true;
        break;
      }
      real_runtime().sleep_for(pause);
      pause = std::min(pause * 2, Duration(10));
    }
  }
  // The whole group: the tool itself on timeout, anything it left behind
  // otherwise. The tool itself too, should its group not exist: the waitpid
  // below must not wait for it.
  ::kill(-pid, SIGKILL);
  ::kill(pid, SIGKILL);
  if (!gone) {
    int status = 0;
    pid_t reaped;
    do {
      reaped = ::waitpid(pid, &status, 0);
    } while (reaped < 0 && errno == EINTR);
    if (reaped == pid && !run.timed_out) {
      if (WIFEXITED(status)) {
        run.exited = true;
        run.exit_code = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        run.signal = WTERMSIG(status);
      }
    }
  }
  run.has_frame = frames.found();
  return run;
}

// The tool's output, trimmed, on one line, at most kMaxErrorQuote bytes.
std::string quote_output(const std::string& text) {
  std::string line;
  for (char c : text.substr(0, kMaxErrorQuote)) {
    if (c == '\n') {
      if (!line.empty() && line.back() != ' ') line += "; ";
    } else if (c != '\r') {
      line += c;
    }
  }
  while (!line.empty() && (line.back() == ' ' || line.back() == ';')) line.pop_back();
  if (text.size() > kMaxErrorQuote) line += " ...";
  return line;
}

// When ptrace was refused, Yama's setting is usually why.
std::string ptrace_hint(const std::string& text) {
  if (text.find("Operation not permitted") == std::string::npos) return {};
  std::ifstream in("/proc/sys/kernel/yama/ptrace_scope");
  int scope = -1;
  if (!(in >> scope) || scope <= 0) return {};
  return " (kernel.yama.ptrace_scope=" + std::to_string(scope) + ")";
}

// Why `pid` cannot be dumped ("" when it can); *was_stopped: it is stopped (T).
std::string target_problem(int pid, bool* was_stopped) {
  if (pid <= 0) return "invalid pid " + std::to_string(pid);
  const char state = process_state(pid);
  if (state == 0) return "no process " + std::to_string(pid);
  if (state == 'Z' || state == 'X') return "process " + std::to_string(pid) + " has exited";
  *was_stopped = state == 'T';
  return "";
}

// A tool's output of `total` bytes of which `text` was kept: cut after its
// last whole line, with a note of how much more there was.
std::string kept_text(std::string text, std::size_t total) {
  if (total > text.size()) {
    const auto line_end = text.rfind('\n');
    if (line_end != std::string::npos) text.resize(line_end + 1);
    const std::size_t more = total - text.size();
    if (!text.empty() && text.back() != '\n') text += '\n';
    text += "[cut] " + std::to_string(more) + " bytes more\n";
  }
  return text;
}

// Why a tool that ran showed no stack: how it ended and what it said.
std::string no_stack_problem(const char* tool, const ToolRun& run) {
  const std::string how = run.exited        ? "exited with status " + std::to_string(run.exit_code)
                          : run.signal != 0 ? "killed by signal " + std::to_string(run.signal)
                                            : "its exit status was taken by another wait";
  const std::string said = quote_output(run.text);
  return std::string(tool) + " showed no stack (" + how + ")" +
         (said.empty() ? std::string(" and printed nothing") : ": " + said) + ptrace_hint(run.text);
}

// The tools that print a process' native stacks, in the order they are tried.
struct Tool {
  const char* name;
  std::vector<std::string> args;  // after the program
};

std::vector<Tool> stack_tools(const std::string& pid_text) {
  return {
      // -i: inlined frames, -s: source file:line (both from DWARF where there
      // is some), -m: the module, which names the library of a frame without
      // a symbol. Without them eu-stack reads only symbol tables.
      {"eu-stack", {"-i", "-m", "-s", "-p", pid_text}},
      // -nx: no .gdbinit; -batch: no questions, detach and exit at the end;
      // -ascending: thread 1 (the main thread) first, as eu-stack prints it,
      // so that a cut keeps it.
      {"gdb", {"-nx", "-batch", "-p", pid_text, "-ex", "thread apply all -ascending bt"}},
  };
}

}  // namespace

StackDump collect_native_stacks(int pid, std::chrono::milliseconds timeout, std::size_t max_bytes) {
  StackDump dump;
  try {
    bool was_stopped = false;
    dump.error = target_problem(pid, &was_stopped);
    if (!dump.error.empty()) return dump;
    // A year at most: the sum must not overflow.
    const auto deadline = real_runtime().now() +
                          std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(8760));
    const std::string pid_text = std::to_string(pid);

    std::string problems;  // each tool's failure, in order
    auto add_problem = [&](const std::string& problem) {
      if (!problems.empty()) problems += "; ";
      problems += problem;
    };
    for (const auto& tool : stack_tools(pid_text)) {
      const std::string path = find_tool(tool.name);
      if (path.empty()) {
        add_problem(std::string(tool.name) + " not found in PATH or /usr/bin");
        continue;
      }
      if (!dump.tool.empty() && real_runtime().now() >= deadline) {
        add_problem(std::string(tool.name) + " not tried: the " + std::to_string(timeout.count()) +
                    " ms timeout is spent");
        break;
      }
      std::vector<std::string> args{path};
      args.insert(args.end(), tool.args.begin(), tool.args.end());
      dump.tool = tool.name;
      ToolRun run = run_tool(args, deadline, max_bytes);
      // A tool killed or dead while attached may leave the target stopped, or
      // its SIGSTOP still pending (then /proc still says S and the stop comes
      // later). SIGCONT both resumes a stopped target and discards a pending
      // stop, so it is sent whenever the target was running before.
      if (!was_stopped && run.start_error.empty()) ::kill(pid, SIGCONT);
      if (!run.start_error.empty()) {
        add_problem(std::string(tool.name) + ": " + run.start_error);
        continue;
      }
      if (run.timed_out) {
        add_problem(std::string(tool.name) + " timed out after " + std::to_string(timeout.count()) +
                    " ms");
        break;  // the deadline is spent
      }
      if (run.has_frame) {
        dump.text = kept_text(std::move(run.text), run.total);
        dump.error.clear();
        return dump;
      }
      add_problem(no_stack_problem(tool.name, run));
    }
    dump.error = problems;
  } catch (const std::exception& e) {  // std::bad_alloc: no stacks, no throw
    dump.text.clear();
    dump.error = std::string("stack dump failed: ") + e.what();
  }
  return dump;
}

}  // namespace ddp::agent
