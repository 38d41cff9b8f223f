// Asking a worker's Python whether it has torch, and the note that says it has none.
#include "ddp/launcher/python_check.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

extern char** environ;

namespace ddp::launcher {
namespace {

// Runs `argv` (argv[0] a path) with stdin and stderr on /dev/null, in ddprun's
// environment and directory, and returns what it wrote on stdout once it
// exited; nullopt when it cannot be started, writes more than `max_bytes`, or
// is still running after `timeout` (it is killed then).
std::optional<std::string> output_of(const std::vector<std::string>& argv,
                                     std::chrono::milliseconds timeout, std::size_t max_bytes) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return std::nullopt;
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  ::posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  ::posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  // ddprun blocks the signals it handles; the child gets a clean slate.
  posix_spawnattr_t attributes;
  ::posix_spawnattr_init(&attributes);
  sigset_t none;
  sigset_t all;
  ::sigemptyset(&none);
  ::sigfillset(&all);
  ::posix_spawnattr_setsigmask(&attributes, &none);
  ::posix_spawnattr_setsigdefault(&attributes, &all);
  ::posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawn(&pid, args[0], &actions, &attributes, args.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attributes);
  ::close(out[1]);
  if (spawned != 0) {
    ::close(out[0]);
    return std::nullopt;
  }
  std::string output;
  bool at_end = false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!at_end && output.size() <= max_bytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd readable{out[0], POLLIN, 0};
    const int polled = ::poll(&readable, 1, static_cast<int>(left.count()));
    if (polled < 0 && errno == EINTR) continue;
    if (polled <= 0) break;
    char buffer[4096];
    const ssize_t n = ::read(out[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    at_end = n == 0;
    output.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  const bool complete = at_end && output.size() <= max_bytes;
  if (!complete) ::kill(pid, SIGKILL);
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  if (!complete) return std::nullopt;
  return output;
}

}  // namespace

std::optional<bool> python_finds_torch(const std::string& python,
                                       std::chrono::milliseconds timeout) {
  const char* script =
      "import importlib.util; print(importlib.util.find_spec('torch') is not None)";
  const std::optional<std::string> answer = output_of({python, "-c", script}, timeout, 16);
  if (answer == "True\n") return true;
  if (answer == "False\n") return false;
  return std::nullopt;
}

std::string missing_torch_note(const std::string& program, const std::string& python,
                               PythonSource source) {
  const std::string origin =
      source == PythonSource::kPythonExec ? "$PYTHON_EXEC" : "the first python3 on PATH";
  // The example names the Python that has torch on Debian's python3-torch,
  // unless that is the one that lacks it.
  const std::string example =
      python == "/usr/bin/python3" ? "/path/to/venv/bin/python3" : "/usr/bin/python3";
  return "ddprun: note: the workers ran " + program + " with " + python + " (" + origin +
         "), which has no module named 'torch'\n"
         "ddprun: note: if " +
         program +
         " uses PyTorch, set PYTHON_EXEC to a Python that has it, "
         "e.g. PYTHON_EXEC=" +
         example + " ddprun ...\n";
}

std::string python_guess_note(const std::string& program, const std::string& python) {
  return "ddprun: note: the workers ran " + program + " as a Python script (" + python + " -u " +
         program +
         "): it is not executable and its name does not end in .py\n"
         "ddprun: note: if " +
         program + " is not Python, make it executable (chmod +x " + program +
         ") to run it directly\n";
}

}  // namespace ddp::launcher
