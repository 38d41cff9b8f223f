// The real launcher with real processes: exits as events, process groups,
// signals through the signalfd, wake() from another thread, exec failures.
#include "ddp/agent/worker_event_loop.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "ddp/common/error.h"
#include "process_state.h"
#include "temp_dir.h"

namespace ddp::agent {
namespace {

namespace fs = std::filesystem;
using test::process_dead;

// Log paths are refused behind a symlink: TempDir resolves its path.
using test::TempDir;

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool eventually_dead(pid_t pid, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  auto deadline = Clock::now() + timeout;
  while (!process_dead(pid)) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// The pid a worker's shell wrote for its background child.
pid_t read_pid(const fs::path& path) {
  for (int i = 0; i < 1000 && slurp(path).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return static_cast<pid_t>(std::stol(slurp(path)));
}

ProcessSpec shell(const std::string& script) {
  ProcessSpec spec;
  spec.argv = {"/bin/sh", "-c", script};
  spec.env = {"PATH=/usr/bin:/bin"};
  spec.prefix = "[t]:";
  return spec;
}

LoopEvent next(WorkerEventLoop& launcher, int ms = 5000) {
  return launcher.next_event(Clock::now() + std::chrono::milliseconds(ms));
}

TEST(PosixLauncher, ExitCodesAndSignalsAreEvents) {
  auto launcher = make_posix_event_loop({SIGUSR2});
  int a = launcher->launch(shell("exit 3"));
  auto e = next(*launcher);
  ASSERT_EQ(e.kind, LoopEvent::Kind::kExited);
  EXPECT_EQ(e.pid, a);
  EXPECT_EQ(e.status, 3);
  int b = launcher->launch(shell("kill -TERM $$"));
  e = next(*launcher);
  ASSERT_EQ(e.kind, LoopEvent::Kind::kExited);
  EXPECT_EQ(e.pid, b);
  EXPECT_EQ(e.status, -SIGTERM);
}

TEST(PosixLauncher, WorkerRunsInItsOwnProcessGroup) {
  auto launcher = make_posix_event_loop({});
  int pid = launcher->launch(shell("sleep 30"));
  EXPECT_EQ(::getpgid(pid), pid);
  launcher->signal_group(pid, SIGKILL);
  auto e = next(*launcher);
  ASSERT_EQ(e.kind, LoopEvent::Kind::kExited);
  EXPECT_EQ(e.status, -SIGKILL);
}

TEST(PosixLauncher, HandledSignalBecomesAnEventAndWorkersStartClean) {
  auto launcher = make_posix_event_loop({SIGUSR1});
  // The worker must not inherit the agent's blocked mask: SIGUSR1 kills it.
  int pid = launcher->launch(shell("sleep 30"));
  ::kill(::getpid(), SIGUSR1);
  auto e = next(*launcher);
  ASSERT_EQ(e.kind, LoopEvent::Kind::kSignal);
  EXPECT_EQ(e.signo, SIGUSR1);
  launcher->signal_group(pid, SIGUSR1);
  e = next(*launcher);
  ASSERT_EQ(e.kind, LoopEvent::Kind::kExited);
  EXPECT_EQ(e.status, -SIGUSR1);
}

TEST(PosixLauncher, WakeFromAnotherThreadAndTimeout) {
  auto launcher = make_posix_event_loop({});
  auto start = Clock::now();
  auto e = launcher->next_event(start + std::chrono::milliseconds(30));
  EXPECT_EQ(e.kind, LoopEvent::Kind::kTimeout);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(30));
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    launcher->wake();
  });
  e = launcher->next_event(Clock::time_point::max());
  EXPECT_EQ(e.kind, LoopEvent::Kind::kWake);
  t.join();
}

TEST(PosixLauncher, ExecFailureIsAnErrorNamingTheProgram) {
  auto launcher = make_posix_event_loop({});
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
  auto launcher = make_posix_event_loop({});
  ::testing::internal::CaptureStdout();
  launcher->launch(shell("printf 'one\\ntw'; sleep 0.05; printf 'o\\nlast-without-newline'"));
  auto e = next(*launcher);
  std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(e.kind, LoopEvent::Kind::kExited);
  EXPECT_EQ(out, "[t]:one\n[t]:two\n[t]:last-without-newline\n");
}

// ---------------------------------------------------------- process groups

// A worker whose shell starts a background child (in the worker's process
// group: sh without job control does not make new groups) and then ends as
// `ending` says. The child must be gone once the exit has been reported.
void expect_child_dies_with_worker(const std::string& ending, int expected_status,
                                   bool term_worker) {
  TempDir dir;
  const fs::path child_file = dir.path() / "child";
  auto launcher = make_posix_event_loop({});
  // The child ignores SIGTERM: only the group's SIGKILL ends it.
  int pid = launcher->launch(
      shell("(trap '' TERM; exec sleep 300) & echo $! > " + child_file.string() + "; " + ending));
  const pid_t child = read_pid(child_file);
  ASSERT_FALSE(process_dead(child));
  if (term_worker) launcher->signal_group(pid, SIGTERM);
  auto e = next(*launcher, 10000);
  ASSERT_EQ(e.kind, LoopEvent::Kind::kExited);
  EXPECT_EQ(e.pid, pid);
  EXPECT_EQ(e.status, expected_status);
  EXPECT_TRUE(eventually_dead(child)) << "the worker's child " << child << " outlived it";
  if (!process_dead(child)) ::kill(child, SIGKILL);
}

TEST(PosixLauncher, WorkersChildrenDieWhenItSucceeds) {
  expect_child_dies_with_worker("exit 0", 0, false);
}

TEST(PosixLauncher, WorkersChildrenDieWhenItFails) {
  expect_child_dies_with_worker("exit 3", 3, false);
}

TEST(PosixLauncher, WorkersChildrenDieWhenItIsStopped) {
  // The worker leaves on SIGTERM; its child ignores SIGTERM.
  expect_child_dies_with_worker("trap 'exit 5' TERM; while true; do sleep 0.01; done", 5, true);
}

TEST(PosixLauncher, ReapedWorkerIsNeverSignalledAgain) {
  auto launcher = make_posix_event_loop({});
  int pid = launcher->launch(shell("exit 0"));
  auto e = next(*launcher);
  ASSERT_EQ(e.kind, LoopEvent::Kind::kExited);
  // The pid (and group id) may be reused by now; a signal must not reach the
  // new owner. Nothing observable is left to check but that this is a no-op
  // and does not throw; the launcher keeps working afterwards.
  launcher->signal_group(pid, SIGKILL);
  int again = launcher->launch(shell("exit 4"));
  e = next(*launcher);
  ASSERT_EQ(e.kind, LoopEvent::Kind::kExited);
  EXPECT_EQ(e.pid, again);
  EXPECT_EQ(e.status, 4);
}

// ---------------------------------------------------------- descriptors

TEST(PosixLauncher, WorkerInheritsNoDescriptorButItsStreams) {
  TempDir dir;
  // A descriptor of the agent that is NOT close-on-exec (as a library might
  // open one): the worker must not get it all the same.
  // Far above what the shell and ls open themselves (F_DUPFD leaves
  // close-on-exec off).
  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(null_fd, 0);
  int leaky = ::fcntl(null_fd, F_DUPFD, 200);
  ::close(null_fd);
  ASSERT_GE(leaky, 200);
  auto launcher = make_posix_event_loop({});
  const fs::path listing = dir.path() / "fds";
  launcher->launch(shell("ls /proc/self/fd > " + listing.string() + ".tmp; mv " + listing.string() +
                         ".tmp " + listing.string()));
  auto e = next(*launcher);
  ::close(leaky);
  ASSERT_EQ(e.kind, LoopEvent::Kind::kExited);
  ASSERT_EQ(e.status, 0);
  // ls also lists its own directory descriptor, a low number: only
  // descriptors from 3 up to what ls could have opened are expected.
  std::set<int> fds;
  std::istringstream in(slurp(listing));
  for (int fd; in >> fd;) fds.insert(fd);
  EXPECT_EQ(fds.count(leaky), 0u) << "descriptor " << leaky
                                  << " leaked into the worker: " << slurp(listing);
  for (int fd : fds) EXPECT_LT(fd, 10) << "the worker inherited descriptor " << fd;
}

// ---------------------------------------------------------- log files

ProcessSpec logging(const std::string& file) {
  ProcessSpec spec = shell("echo written");
  spec.out.file = file;
  spec.out.console = false;
  return spec;
}

// A worker printing two lines, one of them kept by the filters.
ProcessSpec duplicating(const std::string& name, const fs::path& file) {
  ProcessSpec spec = shell("echo 'keep " + name + "'; echo drop; printf 'keep last'");
  spec.prefix = "[" + name + "]:";
  spec.out.duplicate_file = file.string();
  spec.out.duplicate_filters = {"nothing", "keep"};
  return spec;
}

std::string launch_error(WorkerEventLoop& launcher, const ProcessSpec& spec) {
  try {
    launcher.launch(spec);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(PosixLauncher, LogFileIsCreatedOrTruncated) {
  TempDir dir;
  const fs::path log = dir.path() / "stdout.log";
  std::ofstream(log) << "an earlier run's much longer output\n";
  auto launcher = make_posix_event_loop({});
  launcher->launch(logging(log.string()));
  ASSERT_EQ(next(*launcher).kind, LoopEvent::Kind::kExited);
  EXPECT_EQ(slurp(log), "written\n");
}

TEST(PosixLauncher, SymlinkPlantedAsLogFileIsRefusedAndItsTargetUntouched) {
  TempDir dir;
  const fs::path victim = dir.path() / "victim";
  std::ofstream(victim) << "precious";
  const fs::path log = dir.path() / "stdout.log";
  fs::create_symlink(victim, log);
  auto launcher = make_posix_event_loop({});
  std::string error = launch_error(*launcher, logging(log.string()));
  EXPECT_NE(error.find("cannot open log file " + log.string()), std::string::npos) << error;
  EXPECT_NE(error.find("symbolic link"), std::string::npos) << error;
  EXPECT_EQ(slurp(victim), "precious");
  // The duplicate filters' shared file is opened with the same refusals.
  error = launch_error(*launcher, duplicating("a", log));
  EXPECT_NE(error.find("cannot open log file " + log.string()), std::string::npos) << error;
  EXPECT_EQ(slurp(victim), "precious");
}

TEST(PosixLauncher, SymlinkedLogDirectoryIsRefused) {
  TempDir dir;
  const fs::path elsewhere = dir.path() / "elsewhere";
  fs::create_directories(elsewhere);
  std::ofstream(elsewhere / "stdout.log") << "precious";
  fs::create_directory_symlink(elsewhere, dir.path() / "0");
  const fs::path log = dir.path() / "0" / "stdout.log";
  auto launcher = make_posix_event_loop({});
  std::string error = launch_error(*launcher, logging(log.string()));
  EXPECT_NE(error.find("symbolic link"), std::string::npos) << error;
  EXPECT_EQ(slurp(elsewhere / "stdout.log"), "precious");
}

TEST(PosixLauncher, HardLinkPlantedAsLogFileIsRefused) {
  TempDir dir;
  const fs::path victim = dir.path() / "victim";
  std::ofstream(victim) << "precious";
  const fs::path log = dir.path() / "stdout.log";
  fs::create_hard_link(victim, log);
  auto launcher = make_posix_event_loop({});
  std::string error = launch_error(*launcher, logging(log.string()));
  EXPECT_NE(error.find("2 hard links"), std::string::npos) << error;
  EXPECT_EQ(slurp(victim), "precious");
}

TEST(PosixLauncher, FifoPlantedAsLogFileIsRefusedWithoutBlocking) {
  TempDir dir;
  const fs::path log = dir.path() / "stdout.log";
  ASSERT_EQ(::mkfifo(log.c_str(), 0600), 0);
  // A reader, so that a launcher that opens the FIFO does not block forever
  // (this test would hang instead of failing) but gets it and writes to it.
  int reader = ::open(log.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  auto launcher = make_posix_event_loop({});
  std::string error = launch_error(*launcher, logging(log.string()));
  ::close(reader);
  EXPECT_NE(error.find("cannot open log file " + log.string()), std::string::npos) << error;
  // Without a reader: refused at open, never blocked. Only tried when the
  // FIFO was refused above: a launcher that opens FIFOs would block here.
  if (error.find("FIFO") == std::string::npos) {
    ADD_FAILURE() << "FIFO accepted as a log file: " << error;
    return;
  }
  error = launch_error(*launcher, logging(log.string()));
  EXPECT_NE(error.find("FIFO"), std::string::npos) << error;
}

#if defined(__x86_64__)
constexpr __u32 kAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr __u32 kAuditArch = AUDIT_ARCH_AARCH64;
#else
constexpr __u32 kAuditArch = 0;  // the test skips
#endif

// A seccomp filter under which prctl(PR_SET_PTRACER, pid) kills the caller
// (SIGSYS) and every other call goes through. Inherited by children, kept
// through exec. False when the kernel refuses it.
bool kill_whoever_allows_tracer(pid_t pid) {
  // The arguments are 64-bit: the low half first (little-endian), then the high.
  constexpr std::size_t arg0 = offsetof(seccomp_data, args[0]);
  constexpr std::size_t arg1 = offsetof(seccomp_data, args[1]);
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kAuditArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_prctl, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, arg0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PR_SET_PTRACER, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, arg1),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<__u32>(pid), 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, arg1 + 4),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

// The status of a worker running `script`, launched by a child process of the
// test acting as the agent under kill_whoever_allows_tracer(<its own pid>):
// -SIGSYS when the worker allowed exactly its agent to trace it. Exit codes
// of that child over 100 are its own failures.
int worker_status_under_tracer_filter(const std::string& script) {
  const pid_t agent = ::fork();
  if (agent < 0) return 200;
  if (agent == 0) {
    if (!kill_whoever_allows_tracer(::getpid())) ::_exit(101);
    auto launcher = make_posix_event_loop({});
    const int pid = launcher->launch(shell(script));
    const LoopEvent e = next(*launcher, 20000);
    if (e.kind != LoopEvent::Kind::kExited || e.pid != pid) ::_exit(102);
    ::_exit(e.status == -SIGSYS ? 0 : e.status >= 0 && e.status < 100 ? 1 + e.status : 103);
  }
  int status = 0;
  if (::waitpid(agent, &status, 0) != agent || !WIFEXITED(status)) return 201;
  return WEXITSTATUS(status);
}

// Under Yama's ptrace_scope=1 a process may trace only its descendants, and
// the agent's stack collector (eu-stack or gdb) is the worker's sibling: the
// worker must allow its agent (and so the agent's children) with
// prctl(PR_SET_PTRACER, agent pid). This kernel may have no Yama, so the call
// itself is caught: by a seccomp filter in a child acting as the agent.
TEST(PosixLauncher, WorkerAllowsItsAgentToTraceIt) {
  if (kAuditArch == 0) GTEST_SKIP() << "no seccomp architecture known for this machine";
  const int status = worker_status_under_tracer_filter("exit 7");
  if (status == 101) GTEST_SKIP() << "the kernel refused the seccomp filter (no seccomp here)";
  EXPECT_EQ(status, 0) << (status == 8 ? "the worker ran without calling "
                                         "prctl(PR_SET_PTRACER, <its agent's pid>)"
                                       : "unexpected status " + std::to_string(status));
}

// ------------------------------------- torchrun's duplicate filters, NUMA binding

TEST(PosixLauncher, MatchingConsoleLinesOfWorkersGoToOneSharedFile) {
  TempDir dir;
  const fs::path file = dir.path() / "filtered_stdout.log";
  auto launcher = make_posix_event_loop({});
  ::testing::internal::CaptureStdout();
  launcher->launch(duplicating("a", file));
  ASSERT_EQ(next(*launcher).kind, LoopEvent::Kind::kExited);
  launcher->launch(duplicating("b", file));  // a new stream, the same file: appended
  ASSERT_EQ(next(*launcher).kind, LoopEvent::Kind::kExited);
  ProcessSpec quiet = duplicating("c", file);
  quiet.out.console = false;  // not on the console: not copied
  launcher->launch(quiet);
  ASSERT_EQ(next(*launcher).kind, LoopEvent::Kind::kExited);
  const std::string console = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(console, "[a]:keep a\n[a]:drop\n[a]:keep last\n[b]:keep b\n[b]:drop\n[b]:keep last\n");
  EXPECT_EQ(slurp(file), "[a]:keep a\n[a]:keep last\n[b]:keep b\n[b]:keep last\n");
}

TEST(PosixLauncher, WorkerIsBoundToItsCpusBeforeExec) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(mine), &mine), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &mine)) ++cpu;
  TempDir dir;
  const fs::path status = dir.path() / "status";
  ProcessSpec spec = shell("grep Cpus_allowed_list /proc/self/status > " + status.string());
  spec.cpus = {cpu};
  auto launcher = make_posix_event_loop({});
  launcher->launch(spec);
  ASSERT_EQ(next(*launcher).kind, LoopEvent::Kind::kExited);
  EXPECT_EQ(slurp(status), "Cpus_allowed_list:\t" + std::to_string(cpu) + "\n");
  // A CPU the kernel refuses (none of them online): an error naming them.
  spec.cpus = {100000};
  const std::string error = launch_error(*launcher, spec);
  EXPECT_NE(error.find("cannot bind /bin/sh to CPUs 100000: "), std::string::npos) << error;
}

TEST(PosixLauncher, ResolveProgram) {
  EXPECT_EQ(resolve_program("sh", "/nonexistent:/bin"), "/bin/sh");
  EXPECT_EQ(resolve_program("no-such-program-xyz", "/bin:/usr/bin"), "");
  EXPECT_EQ(resolve_program("/bin/sh", ""), "/bin/sh");
  EXPECT_EQ(resolve_program("/etc/passwd", ""), "") << "not executable";
}

}  // namespace
}  // namespace ddp::agent
