// The tests' /proc readers (tests/support/process_state.h) while processes
// come and go: DdprunTest.SigtermLeavesNoDescendant failed under ctest -j2
// beside the hang tests with "basic_filebuf::underflow error reading the
// file: No such process". live_members_of_group() reads every process's
// /proc/<pid>/stat; one that ended between the open and the read made the
// read fail with ESRCH, which std::ifstream's buffer throws (libstdc++).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "process_state.h"
#include "process_util.h"

namespace ddp::test {
namespace {

// A child that sleeps until killed.
pid_t sleeping_child() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (;;) ::pause();
  }
  return pid;
}

void kill_and_reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

// The read of the race, made deterministic: the file is opened while the
// process lives, read after it was reaped.
TEST(ProcessState, AProcFileWhoseProcessEndedReadsAsGoneWithoutThrowing) {
  const pid_t pid = sleeping_child();
  ASSERT_GT(pid, 0);
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  kill_and_reap(pid);
  std::optional<std::string> text;
  EXPECT_NO_THROW(text = read_proc_fd(fd));
  EXPECT_FALSE(text.has_value());
  ::close(fd);
  EXPECT_FALSE(proc_stat(pid).has_value());
  EXPECT_TRUE(process_dead(pid));
  EXPECT_FALSE(proc_status_kib(pid, "VmRSS").has_value());
}

// What the readers did before (std::ifstream), in the same order: it throws.
// This pins the cause; the readers above must never take that path again.
TEST(ProcessState, AnIfstreamOnAProcFileWhoseProcessEndedThrows) {
  const pid_t pid = sleeping_child();
  ASSERT_GT(pid, 0);
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  ASSERT_TRUE(in);
  kill_and_reap(pid);
  EXPECT_ANY_THROW(std::string((std::istreambuf_iterator<char>(in)), {}));
}

TEST(ProcessState, ALiveProcessIsRead) {
  const pid_t pid = sleeping_child();
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(eventually([&] {
    auto stat = proc_stat(pid);
    return stat && stat->state == 'S';
  }));
  auto stat = proc_stat(pid);
  ASSERT_TRUE(stat);
  EXPECT_EQ(stat->ppid, ::getpid());
  EXPECT_EQ(stat->pgrp, ::getpgrp());
  EXPECT_FALSE(process_dead(pid));
  EXPECT_TRUE(proc_status_kib(pid, "VmRSS").has_value());
  EXPECT_FALSE(live_members_of_group(::getpgrp()).empty());
  kill_and_reap(pid);
  EXPECT_TRUE(process_dead(pid));
}

}  // namespace
}  // namespace ddp::test
