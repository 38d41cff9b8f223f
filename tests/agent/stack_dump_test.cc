// collect_native_stacks against a real process blocked in a known function:
// eu-stack, the gdb fallback, a missing process, timeouts (the tool's whole
// process group killed and reaped, the target left running), the output bound,
// and what the tool's process gets (descriptors, signal mask, environment).
// Fake tools are shell scripts placed first in PATH. Attaching needs ptrace
// rights (root here); a refusal fails the tests with the tool's words.
#include "stack_dump.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "ddp/agent/worker_event_loop.h"
#include "process_state.h"
#include "temp_dir.h"

// What the dump must name: a function each thread of the target sleeps in.
extern "C" __attribute__((noinline)) void ddp_test_blocks_here() {
  for (;;) ::pause();
}

namespace ddp::agent {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test::proc_stat;
using test::TempDir;

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The state letters of every thread of `pid`, e.g. "SS".
std::string thread_states(pid_t pid) {
  std::string states;
  std::error_code ec;
  for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    const auto stat = proc_stat(std::stoi(task.path().filename().string()));
    if (stat) states += stat->state;
  }
  return states;
}

// A forked child with two threads, both sleeping in ddp_test_blocks_here().
// Killed and reaped when destroyed.
class BlockedChild {
 public:
  BlockedChild() {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      std::thread second(ddp_test_blocks_here);
      ddp_test_blocks_here();
    }
    for (int i = 0; i < 1000 && thread_states(pid_) != "SS"; ++i) std::this_thread::sleep_for(5ms);
  }
  ~BlockedChild() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  BlockedChild(const BlockedChild&) = delete;
  BlockedChild& operator=(const BlockedChild&) = delete;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

// Fails the test when the dump failed, saying plainly when ptrace was refused.
void expect_stacks(const StackDump& dump) {
  ASSERT_EQ(dump.error.find("Operation not permitted"), std::string::npos)
      << "ptrace is refused in this environment (root or CAP_SYS_PTRACE is needed, and "
         "kernel.yama.ptrace_scope must allow it): "
      << dump.error;
  ASSERT_EQ(dump.error, "");
  ASSERT_FALSE(dump.text.empty());
}

// The target is alive and was not left stopped: both threads sleeping (S) or
// running (R: just woken, as a detach does), over a while, since a stop signal
// left pending takes effect a moment later.
void expect_running(pid_t pid) {
  for (int i = 0; i < 10; ++i) {
    const std::string states = thread_states(pid);
    ASSERT_EQ(states.size(), 2u) << "target " << pid << " is gone";
    ASSERT_EQ(states.find_first_not_of("SR"), std::string::npos)
        << "target " << pid << " left in state " << states << " (T: stopped)";
    std::this_thread::sleep_for(5ms);
  }
}

// No child of this process but the target is left, and no zombie: a tool not
// reaped would show up here.
void expect_no_other_child() {
  int status = 0;
  EXPECT_EQ(::waitpid(-1, &status, WNOHANG), 0) << "a tool process was left behind";
}

// Sets an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A directory of fake tools, put first in PATH.
class FakeTools {
 public:
  FakeTools() : path_("PATH", dir_.str() + ":" + std::getenv("PATH")) {}
  void add(const std::string& name, const std::string& script,
           const std::string& interpreter = "/bin/sh") {
    const fs::path file = dir_.path() / name;
    std::ofstream(file) << "#!" << interpreter << "\n" << script;
    fs::permissions(file, fs::perms::owner_all);
  }
  const fs::path& dir() const { return dir_.path(); }

 private:
  TempDir dir_{"ddp-stack-dump"};
  ScopedEnv path_;
};

TEST(StackDump, EuStackNamesTheBlockedFunctionInEveryThread) {
  BlockedChild child;
  ASSERT_EQ(thread_states(child.pid()), "SS");
  const auto start = std::chrono::steady_clock::now();
  StackDump dump = collect_native_stacks(child.pid(), 30s);
  const auto took = std::chrono::steady_clock::now() - start;
  expect_stacks(dump);
  EXPECT_EQ(dump.tool, "eu-stack");
  EXPECT_EQ(count(dump.text, "\nTID "), 2u) << dump.text;
  EXPECT_EQ(count(dump.text, "ddp_test_blocks_here"), 2u) << dump.text;
  // -s: source lines, -m: modules.
  EXPECT_NE(dump.text.find("stack_dump_test.cc:"), std::string::npos) << dump.text;
  EXPECT_NE(dump.text.find("libc.so"), std::string::npos) << dump.text;
  EXPECT_EQ(dump.text.find("[cut]"), std::string::npos);
  EXPECT_LT(took, 10s);
  expect_running(child.pid());
  expect_no_other_child();

  // Found in /usr/bin when PATH has no absolute directory holding it.
  {
    ScopedEnv path("PATH", "/nonexistent:bin:");
    dump = collect_native_stacks(child.pid(), 30s);
  }
  ASSERT_EQ(dump.error, "");
  EXPECT_EQ(dump.tool, "eu-stack");
  EXPECT_EQ(count(dump.text, "ddp_test_blocks_here"), 2u) << dump.text;
  expect_running(child.pid());
  expect_no_other_child();
}

// A worker the real launcher started (which makes it allow its agent to trace
// it: PR_SET_PTRACER, for Yama's ptrace_scope=1) still has its stacks taken.
TEST(StackDump, AWorkerStartedByTheLauncherHasItsStacksTaken) {
  auto launcher = make_posix_event_loop({});
  ProcessSpec spec;
  spec.argv = {"/bin/sleep", "60"};
  spec.env = {"PATH=/usr/bin:/bin"};
  const int pid = launcher->launch(spec);
  for (int i = 0; i < 1000 && thread_states(pid) != "S"; ++i) std::this_thread::sleep_for(5ms);
  const StackDump dump = collect_native_stacks(pid, 30s);
  EXPECT_EQ(thread_states(pid), "S") << "the worker was left stopped, or is gone";
  launcher->signal_group(pid, SIGKILL);
  const LoopEvent exited = launcher->next_event(Clock::now() + 10s);
  EXPECT_EQ(exited.kind, LoopEvent::Kind::kExited);
  expect_stacks(dump);
  EXPECT_EQ(dump.tool, "eu-stack");
  EXPECT_EQ(count(dump.text, "\nTID "), 1u) << dump.text;
  EXPECT_NE(dump.text.find("sleep"), std::string::npos) << dump.text;
}

TEST(StackDump, FallsBackToGdbWhenEuStackShowsNoStack) {
  BlockedChild child;
  FakeTools tools;
  tools.add("eu-stack", "echo \"eu-stack: dwfl_linux_proc_attach pid $5: no luck\"\nexit 2\n");
  StackDump dump = collect_native_stacks(child.pid(), 60s);
  expect_stacks(dump);
  EXPECT_EQ(dump.tool, "gdb");
  EXPECT_EQ(count(dump.text, "ddp_test_blocks_here ("), 2u) << dump.text;
  // Ascending: the main thread (thread 1) first.
  const auto first = dump.text.find("\nThread 1 ");
  const auto second = dump.text.find("\nThread 2 ");
  ASSERT_NE(first, std::string::npos) << dump.text;
  ASSERT_NE(second, std::string::npos) << dump.text;
  EXPECT_LT(first, second);
  EXPECT_EQ(dump.text.find("\nThread 3 "), std::string::npos) << dump.text;
  expect_running(child.pid());
  expect_no_other_child();
}

TEST(StackDump, ReportsWhatEachToolSaidWhenNoneShowsAStack) {
  BlockedChild child;
  FakeTools tools;
  tools.add("eu-stack",
            "echo 'eu-stack: dwfl_linux_proc_attach: Operation not permitted'\nexit 2\n");
  tools.add("gdb", "echo 'ptrace: Operation not permitted.'\necho 'No stack.'\nexit 1\n");
  StackDump dump = collect_native_stacks(child.pid(), 30s);
  EXPECT_EQ(dump.tool, "gdb");
  EXPECT_EQ(dump.text, "");
  EXPECT_NE(dump.error.find("eu-stack showed no stack (exited with status 2): eu-stack: "
                            "dwfl_linux_proc_attach: Operation not permitted"),
            std::string::npos)
      << dump.error;
  EXPECT_NE(dump.error.find("gdb showed no stack (exited with status 1): ptrace: Operation not "
                            "permitted.; No stack."),
            std::string::npos)
      << dump.error;
  expect_running(child.pid());
  expect_no_other_child();
}

TEST(StackDump, NoProcessIsAnError) {
  // A pid just freed: a child that exited and was reaped.
  pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  StackDump dump = collect_native_stacks(gone, 10s);
  EXPECT_EQ(dump.error, "no process " + std::to_string(gone));
  EXPECT_EQ(dump.tool, "");
  EXPECT_EQ(dump.text, "");

  // A zombie has no threads to show.
  pid_t zombie = ::fork();
  if (zombie == 0) ::_exit(0);
  for (int i = 0; i < 1000 && proc_stat(zombie)->state != 'Z'; ++i)
    std::this_thread::sleep_for(1ms);
  dump = collect_native_stacks(zombie, 10s);
  EXPECT_EQ(dump.error, "process " + std::to_string(zombie) + " has exited");
  EXPECT_EQ(dump.tool, "");
  ASSERT_EQ(::waitpid(zombie, nullptr, 0), zombie);

  for (int pid : {0, -1}) {
    dump = collect_native_stacks(pid, 10s);
    EXPECT_EQ(dump.error, "invalid pid " + std::to_string(pid));
  }
  // No child at all is left: no tool ran.
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(StackDump, ZeroTimeoutKillsEuStackAndLeavesTheTargetRunning) {
  BlockedChild child;
  for (auto timeout : {0ms, 1ms}) {
    StackDump dump = collect_native_stacks(child.pid(), timeout);
    EXPECT_EQ(dump.tool, "eu-stack");
    EXPECT_EQ(dump.text, "");
    EXPECT_EQ(dump.error, "eu-stack timed out after " + std::to_string(timeout.count()) + " ms");
    expect_running(child.pid());
    expect_no_other_child();
  }
}

// Killed at any moment of its attach and unwinding, the real eu-stack leaves
// neither the target stopped nor a zombie behind. (The window where a killed
// tracer leaves its attach's SIGSTOP to take effect is microseconds wide: the
// next test forces it.)
TEST(StackDump, KilledAnywhereEuStackLeavesTheTargetRunning) {
  BlockedChild child;
  int timed_out = 0;
  for (int ms = 2; ms <= 80; ms += 2) {
    StackDump dump = collect_native_stacks(child.pid(), std::chrono::milliseconds(ms));
    if (dump.error.empty()) {
      EXPECT_EQ(count(dump.text, "ddp_test_blocks_here"), 2u) << dump.text;
    } else {
      EXPECT_NE(dump.error.find("timed out"), std::string::npos) << dump.error;
      ++timed_out;
    }
    expect_running(child.pid());
    expect_no_other_child();
  }
  EXPECT_GT(timed_out, 0);
}

// A tool that dies having stopped the target (as a tracer killed before it
// consumed its attach's SIGSTOP does) or that leaves it stopped: the target is
// continued. One that the user had stopped before the dump stays stopped.
TEST(StackDump, TargetLeftStoppedByTheToolIsContinued) {
  BlockedChild child;
  FakeTools tools;
  tools.add("eu-stack", "kill -STOP $5\nsleep 60\n");
  tools.add("gdb", "echo 'gdb should not run'\n");
  StackDump dump = collect_native_stacks(child.pid(), 200ms);
  EXPECT_EQ(dump.error, "eu-stack timed out after 200 ms");
  expect_running(child.pid());

  tools.add("eu-stack", "kill -STOP $5\necho '#0  0x0 somewhere'\n");
  dump = collect_native_stacks(child.pid(), 30s);
  EXPECT_EQ(dump.error, "");
  expect_running(child.pid());

  ASSERT_EQ(::kill(child.pid(), SIGSTOP), 0);
  for (int i = 0; i < 1000 && thread_states(child.pid()) != "TT"; ++i) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(thread_states(child.pid()), "TT");
  tools.add("eu-stack", "sleep 60\n");
  dump = collect_native_stacks(child.pid(), 100ms);
  EXPECT_EQ(dump.error, "eu-stack timed out after 100 ms");
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(thread_states(child.pid()), "TT");
  ::kill(child.pid(), SIGCONT);
  expect_no_other_child();
}

TEST(StackDump, TimeoutKillsTheToolsWholeProcessGroup) {
  BlockedChild child;
  FakeTools tools;
  const fs::path grandchild_file = tools.dir() / "grandchild";
  // A tool that starts a child in its group, ignores SIGTERM and never ends;
  // then one that closes its output but keeps running.
  tools.add("eu-stack", "trap '' TERM\nsleep 60 &\necho $! > " + grandchild_file.string() +
                            "\necho started\nwait\n");
  tools.add("gdb", "echo 'gdb should not run'\n");
  auto start = std::chrono::steady_clock::now();
  StackDump dump = collect_native_stacks(child.pid(), 300ms);
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(dump.tool, "eu-stack");
  EXPECT_EQ(dump.error, "eu-stack timed out after 300 ms");
  EXPECT_EQ(dump.text, "");
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 5s);
  std::ifstream in(grandchild_file);
  pid_t grandchild = -1;
  ASSERT_TRUE(in >> grandchild);
  // Orphaned, it may stay a zombie (nobody reaps orphans here), but it is dead.
  for (int i = 0; i < 1000 && !test::process_dead(grandchild); ++i) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_TRUE(test::process_dead(grandchild));
  expect_no_other_child();

  tools.add("eu-stack", "exec >/dev/null 2>&1\nsleep 60\n");
  start = std::chrono::steady_clock::now();
  dump = collect_native_stacks(child.pid(), 300ms);
  took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(dump.error, "eu-stack timed out after 300 ms");
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 5s);
  expect_running(child.pid());
  expect_no_other_child();
}

TEST(StackDump, OutputIsCutAtMaxBytesOnALineEnd) {
  BlockedChild child;
  FakeTools tools;
  tools.add("eu-stack",
            "i=0\nwhile [ $i -lt 5000 ]; do echo \"#0  0x00000000 frame_$i\"; i=$((i+1)); done\n");
  std::string full;
  for (int i = 0; i < 5000; ++i) full += "#0  0x00000000 frame_" + std::to_string(i) + "\n";
  StackDump dump = collect_native_stacks(child.pid(), 30s, 1000);
  ASSERT_EQ(dump.error, "");
  const auto cut = dump.text.find("[cut] ");
  ASSERT_NE(cut, std::string::npos) << dump.text;
  const std::string shown = dump.text.substr(0, cut);
  EXPECT_LE(shown.size(), 1000u);
  EXPECT_GT(shown.size(), 950u);  // whole lines only: less than one line lost
  EXPECT_EQ(full.compare(0, shown.size(), shown), 0);
  EXPECT_EQ(shown.back(), '\n');
  EXPECT_EQ(dump.text.substr(cut),
            "[cut] " + std::to_string(full.size() - shown.size()) + " bytes more\n");

  // Under the bound: as printed.
  dump = collect_native_stacks(child.pid(), 30s, full.size());
  EXPECT_EQ(dump.text, full);
  expect_no_other_child();
}

TEST(StackDump, ToolGetsDevNullStdinItsOwnGroupNoSignalMaskNoOtherDescriptors) {
  BlockedChild child;
  FakeTools tools;
  // A descriptor without close-on-exec, as a library might leave one.
  const int leaky = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(leaky, 3);
  tools.add("eu-stack",
            "echo \"#0  fake\"\n"
            "echo \"stdin=$(readlink /proc/$$/fd/0)\"\n"
            "echo \"stdout=$(readlink /proc/$$/fd/1) stderr=$(readlink /proc/$$/fd/2)\"\n"
            "[ -e /proc/$$/fd/" +
                std::to_string(leaky) +
                " ] && echo leaked\n"
                "echo \"pgrp=$(cut -d' ' -f5 /proc/$$/stat) pid=$$\"\n"
                "echo \"DEBUGINFOD_URLS=${DEBUGINFOD_URLS-unset} LC_ALL=$LC_ALL\"\n"
                "echo oops >&2\n");
  ScopedEnv debuginfod("DEBUGINFOD_URLS", "https://debuginfod.example");
  // The caller's stdin is not passed on, whatever it is: here a pipe.
  int in_pipe[2];
  ASSERT_EQ(::pipe(in_pipe), 0);
  const int saved_stdin = ::dup(STDIN_FILENO);
  ASSERT_GE(saved_stdin, 0);
  ::dup2(in_pipe[0], STDIN_FILENO);
  StackDump dump = collect_native_stacks(child.pid(), 30s);
  ::dup2(saved_stdin, STDIN_FILENO);
  for (int fd : {saved_stdin, in_pipe[0], in_pipe[1], leaky}) ::close(fd);
  ASSERT_EQ(dump.error, "");
  EXPECT_NE(dump.text.find("stdin=/dev/null\n"), std::string::npos) << dump.text;
  // stdout and stderr: one pipe.
  std::istringstream lines(dump.text);
  std::string line, out_target, err_target;
  while (std::getline(lines, line)) {
    if (line.rfind("stdout=", 0) == 0) {
      std::istringstream(line) >> out_target >> err_target;
    }
  }
  EXPECT_EQ(out_target.rfind("stdout=pipe:", 0), 0u) << dump.text;
  EXPECT_EQ(out_target.substr(7), err_target.substr(7)) << dump.text;
  EXPECT_NE(dump.text.find("oops\n"), std::string::npos) << dump.text;
  EXPECT_EQ(dump.text.find("leaked"), std::string::npos) << dump.text;
  std::string pgrp, pid;
  const auto at = dump.text.find("pgrp=");
  ASSERT_NE(at, std::string::npos);
  std::istringstream(dump.text.substr(at)) >> pgrp >> pid;
  EXPECT_EQ(pgrp.substr(5), pid.substr(4)) << dump.text;
  EXPECT_NE(dump.text.find("DEBUGINFOD_URLS=unset LC_ALL=C\n"), std::string::npos) << dump.text;

  // The signal state, as the tool finds it at exec: the agent blocks the
  // signals its signalfd reads and ignores SIGPIPE. (Perl, since the shell
  // clears its signal mask when it starts.)
  tools.add("eu-stack",
            "print \"#0  fake\\n\";\n"
            "open(my $f, '<', '/proc/self/status') or die;\n"
            "while (<$f>) { print if /^Sig(Blk|Ign):/ }\n",
            "/usr/bin/perl");
  sigset_t blocked, old_mask;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGUSR1);
  sigaddset(&blocked, SIGCHLD);
  ASSERT_EQ(::sigprocmask(SIG_BLOCK, &blocked, &old_mask), 0);
  auto old_pipe = ::signal(SIGPIPE, SIG_IGN);
  dump = collect_native_stacks(child.pid(), 30s);
  ::signal(SIGPIPE, old_pipe);
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  ASSERT_EQ(dump.error, "");
  EXPECT_NE(dump.text.find("SigBlk:\t0000000000000000\n"), std::string::npos) << dump.text;
  const auto ign = dump.text.find("SigIgn:\t");
  ASSERT_NE(ign, std::string::npos) << dump.text;
  const auto ignored = std::stoull(dump.text.substr(ign + 8, 16), nullptr, 16);
  EXPECT_EQ(ignored & (1ULL << (SIGPIPE - 1)), 0u) << dump.text;
  expect_no_other_child();
}

}  // namespace
}  // namespace ddp::agent
