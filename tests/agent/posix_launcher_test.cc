// The real launcher with real processes: exits as events, process groups,
// signals through the signalfd, wake() from another thread, exec failures.
#include "ddp/agent/process_launcher.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <thread>

#include "ddp/common/error.h"

namespace ddp::agent {
namespace {

ProcessSpec shell(const std::string& script) {
  ProcessSpec spec;
  spec.argv = {"/bin/sh", "-c", script};
  spec.env = {"PATH=/usr/bin:/bin"};
  spec.prefix = "[t]:";
  return spec;
}

LauncherEvent next(ProcessLauncher& launcher, int ms = 5000) {
  return launcher.next_event(Clock::now() + std::chrono::milliseconds(ms));
}

TEST(PosixLauncher, ExitCodesAndSignalsAreEvents) {
  auto launcher = make_posix_launcher({SIGUSR2});
  int a = launcher->launch(shell("exit 3"));
  auto e = next(*launcher);
  ASSERT_EQ(e.kind, LauncherEvent::Kind::kExited);
  EXPECT_EQ(e.pid, a);
  EXPECT_EQ(e.status, 3);
  int b = launcher->launch(shell("kill -TERM $$"));
  e = next(*launcher);
  ASSERT_EQ(e.kind, LauncherEvent::Kind::kExited);
  EXPECT_EQ(e.pid, b);
  EXPECT_EQ(e.status, -SIGTERM);
}

TEST(PosixLauncher, WorkerRunsInItsOwnProcessGroup) {
  auto launcher = make_posix_launcher({});
  int pid = launcher->launch(shell("sleep 30"));
  EXPECT_EQ(::getpgid(pid), pid);
  launcher->signal_group(pid, SIGKILL);
  auto e = next(*launcher);
  ASSERT_EQ(e.kind, LauncherEvent::Kind::kExited);
  EXPECT_EQ(e.status, -SIGKILL);
}

TEST(PosixLauncher, HandledSignalBecomesAnEventAndWorkersStartClean) {
  auto launcher = make_posix_launcher({SIGUSR1});
  // The worker must not inherit the agent's blocked mask: SIGUSR1 kills it.
  int pid = launcher->launch(shell("sleep 30"));
  ::kill(::getpid(), SIGUSR1);
  auto e = next(*launcher);
  ASSERT_EQ(e.kind, LauncherEvent::Kind::kSignal);
  EXPECT_EQ(e.signo, SIGUSR1);
  launcher->signal_group(pid, SIGUSR1);
  e = next(*launcher);
  ASSERT_EQ(e.kind, LauncherEvent::Kind::kExited);
  EXPECT_EQ(e.status, -SIGUSR1);
}

TEST(PosixLauncher, WakeFromAnotherThreadAndTimeout) {
  auto launcher = make_posix_launcher({});
  auto start = Clock::now();
  auto e = launcher->next_event(start + std::chrono::milliseconds(30));
  EXPECT_EQ(e.kind, LauncherEvent::Kind::kTimeout);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(30));
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    launcher->wake();
  });
  e = launcher->next_event(Clock::time_point::max());
  EXPECT_EQ(e.kind, LauncherEvent::Kind::kWake);
  t.join();
}

TEST(PosixLauncher, ExecFailureIsAnErrorNamingTheProgram) {
  auto launcher = make_posix_launcher({});
  ProcessSpec spec;
  spec.argv = {"/nonexistent/program"};
  try {
    launcher->launch(spec);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot execute /nonexistent/program"), std::string::npos);
  }
}

TEST(PosixLauncher, OutputIsPrefixedLineByLineAndFlushedBeforeTheExit) {
  auto launcher = make_posix_launcher({});
  ::testing::internal::CaptureStdout();
  launcher->launch(shell("printf 'one\\ntw'; sleep 0.05; printf 'o\\nlast-without-newline'"));
  auto e = next(*launcher);
  std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(e.kind, LauncherEvent::Kind::kExited);
  EXPECT_EQ(out, "[t]:one\n[t]:two\n[t]:last-without-newline\n");
}

TEST(PosixLauncher, ResolveProgram) {
  EXPECT_EQ(resolve_program("sh", "/nonexistent:/bin"), "/bin/sh");
  EXPECT_EQ(resolve_program("no-such-program-xyz", "/bin:/usr/bin"), "");
  EXPECT_EQ(resolve_program("/bin/sh", ""), "/bin/sh");
  EXPECT_EQ(resolve_program("/etc/passwd", ""), "") << "not executable";
}

}  // namespace
}  // namespace ddp::agent
