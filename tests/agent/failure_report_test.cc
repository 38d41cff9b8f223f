#include "ddp/agent/failure_report.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <optional>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ddp/agent/worker_spec.h"
#include "temp_dir.h"

namespace ddp::agent {
namespace {

namespace fs = std::filesystem;
using std::chrono::system_clock;

class ErrorFile {
 public:
  explicit ErrorFile(const std::string& text) {
    path_ = fs::temp_directory_path() / ("ddp-error-" + std::to_string(::getpid()) + ".json");
    std::ofstream(path_) << text;
  }
  ~ErrorFile() { fs::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

TEST(FailureReport, ReadsPyTorchRecordErrorFile) {
  // What torch.distributed.elastic's @record writes.
  ErrorFile file(R"({"message": {"message": "RuntimeError: boom", "extraInfo": {
      "py_callstack": "Traceback (most recent call last):\n  File \"x.py\"\nRuntimeError: boom",
      "timestamp": "1700000000"}}})");
  auto f = make_failure(1, 5, 4242, 1, file.path(), system_clock::now());
  EXPECT_EQ(f.error_file, file.path());
  EXPECT_EQ(f.timestamp, 1700000000);
  EXPECT_EQ(f.message, "Traceback (most recent call last):\n  File \"x.py\"\nRuntimeError: boom");
}

TEST(FailureReport, ReadsStringMessageFormat) {
  ErrorFile file(R"({"message": "plain failure", "timestamp": 1600000000})");
  auto f = make_failure(0, 0, 1, 2, file.path(), system_clock::now());
  EXPECT_EQ(f.message, "plain failure");
  EXPECT_EQ(f.timestamp, 1600000000);
}

TEST(FailureReport, MessageWithoutTracebackFallsBackToMessage) {
  ErrorFile file(R"({"message": {"message": "ValueError: x", "extraInfo": {"timestamp": "5"}}})");
  auto f = make_failure(0, 0, 1, 2, file.path(), system_clock::now());
  EXPECT_EQ(f.message, "ValueError: x");
  EXPECT_EQ(f.timestamp, 5);
}

TEST(FailureReport, MalformedErrorFileIsNamedNotFatal) {
  ErrorFile file("{not json");
  auto f = make_failure(0, 0, 1, 2, file.path(), system_clock::now());
  EXPECT_NE(f.message.find("unreadable error file"), std::string::npos) << f.message;
}

// Error files are refused behind a symlink: TempDir resolves its path.
using test::TempDir;

// make_failure(path)'s message, computed in a child process that is killed
// after `timeout`: a make_failure that blocks fails the test instead of
// hanging it. Returns nullopt on a timeout.
std::optional<std::string> message_within(const std::string& path,
                                          std::chrono::milliseconds timeout) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return std::string("pipe failed");
  pid_t pid = ::fork();
  if (pid == 0) {
    auto f = make_failure(0, 0, 1, 2, path, system_clock::now());
    std::string text = f.error_file + "\n" + f.message;
    ssize_t ignored = ::write(p[1], text.data(), text.size());
    (void)ignored;
    ::_exit(0);
  }
  ::close(p[1]);
  pollfd poll_fd{p[0], POLLIN, 0};
  std::string text;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool done = false;
  while (!done) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || ::poll(&poll_fd, 1, static_cast<int>(left.count())) <= 0) break;
    char buffer[4096];
    ssize_t n = ::read(p[0], buffer, sizeof(buffer));
    if (n <= 0) done = true;
    else text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(p[0]);
  if (!done) ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  if (!done) return std::nullopt;
  return text;
}

TEST(FailureReport, FifoAsErrorFileDoesNotBlockAndIsNamed) {
  TempDir dir;
  const fs::path path = dir.path() / "error.json";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto text = message_within(path.string(), std::chrono::seconds(5));
  ASSERT_TRUE(text.has_value()) << "make_failure blocked on a FIFO error file";
  EXPECT_NE(text->find(path.string() + " is a FIFO, not a regular file"), std::string::npos) << *text;
}

TEST(FailureReport, SymlinkAsErrorFileIsNotFollowed) {
  TempDir dir;
  const fs::path victim = dir.path() / "secret.json";
  std::ofstream(victim) << R"({"message": "the secret"})";
  const fs::path path = dir.path() / "error.json";
  fs::create_symlink(victim, path);
  auto f = make_failure(0, 0, 1, 2, path.string(), system_clock::now());
  EXPECT_EQ(f.message.find("the secret"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("symbolic link"), std::string::npos) << f.message;
  EXPECT_EQ(f.error_file, path.string());
}

TEST(FailureReport, DirectoryOrHugeErrorFileIsRefused) {
  TempDir dir;
  const fs::path as_dir = dir.path() / "error.json";
  fs::create_directories(as_dir);
  auto f = make_failure(0, 0, 1, 2, as_dir.string(), system_clock::now());
  EXPECT_NE(f.message.find("is a directory, not a regular file"), std::string::npos) << f.message;

  // Valid JSON, but over the bound: not read into memory in full.
  const fs::path huge = dir.path() / "huge.json";
  {
    std::ofstream out(huge);
    out << R"({"message": ")" << std::string(kMaxErrorFileBytes, 'x') << R"("})";
  }
  auto g = make_failure(0, 0, 1, 2, huge.string(), system_clock::now());
  EXPECT_NE(g.message.find("larger than " + std::to_string(kMaxErrorFileBytes) + " bytes"),
            std::string::npos)
      << g.message.substr(0, 200);
}

TEST(FailureReport, NoErrorFile) {
  auto now = system_clock::now();
  auto f = make_failure(2, 7, 99, -SIGKILL, "/nonexistent/error.json", now);
  EXPECT_EQ(f.error_file, "<N/A>");
  EXPECT_EQ(f.message, "Signal 9 (SIGKILL) received by PID 99");
  EXPECT_EQ(f.timestamp, std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count());
  auto g = make_failure(2, 7, 99, 3, "", now);
  EXPECT_EQ(g.message, "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html");
}

TEST(FailureReport, RootCauseIsEarliest) {
  auto t = system_clock::now();
  auto a = make_failure(0, 0, 10, 1, "", t + std::chrono::milliseconds(5));
  auto b = make_failure(1, 1, 11, 2, "", t);
  b.timestamp = a.timestamp;  // same second: observation order decides
  EXPECT_EQ(root_cause({a, b}), 1u);
  a.timestamp -= 1;
  EXPECT_EQ(root_cause({a, b}), 0u);
}

TEST(FailureReport, FormatMatchesTorchrun) {
  auto t = system_clock::now();
  auto a = make_failure(0, 2, 100, 1, "", t);
  auto b = make_failure(1, 3, 101, -SIGSEGV, "", t + std::chrono::seconds(1));
  a.timestamp = 0;
  b.timestamp = 10;
  const std::string report = format_report("train.py", {b, a}, "node7");
  const std::string border(60, '=');
  const std::string section(60, '-');
  EXPECT_EQ(report.substr(0, border.size() + 2), "\n" + border + "\n");
  EXPECT_NE(report.find("\ntrain.py FAILED\n" + section + "\nFailures:\n[0]:\n"), std::string::npos)
      << report;
  EXPECT_NE(report.find("  host      : node7\n"), std::string::npos);
  EXPECT_NE(report.find("  rank      : 3 (local_rank: 1)\n  exitcode  : -11 (pid: 101)\n"
                        "  error_file: <N/A>\n  traceback : Signal 11 (SIGSEGV) received by PID 101\n" +
                        section + "\nRoot Cause (first observed failure):\n[1]:\n"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("  rank      : 2 (local_rank: 0)\n  exitcode  : 1 (pid: 100)\n"), std::string::npos);
  EXPECT_TRUE(report.ends_with(border + "\n"));
}

TEST(FailureReport, ExitCodeAndSignalNames) {
  EXPECT_EQ(exit_code_for(3), 3);
  EXPECT_EQ(exit_code_for(-SIGTERM), 143);
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(signal_name(SIGUSR1), "SIGUSR1");
}

TEST(WorkerSpec, Substitutions) {
  EXPECT_EQ(substitute_local_rank("a${local_rank}b${local_rank}", 3), "a3b3");
  EXPECT_EQ(substitute_local_rank("plain", 3), "plain");
  EXPECT_EQ(format_line_prefix("[${role_name}${local_rank}]:", "default", 1, 5), "[default1]:");
  EXPECT_EQ(format_line_prefix("${rank}|${local_rank}|${role_name} ", "t", 0, 9), "9|0|t ");
  StdSetting s;
  s.all = Std::kErr;
  s.per_rank[1] = Std::kAll;
  EXPECT_EQ(s.of(0), Std::kErr);
  EXPECT_EQ(s.of(1), Std::kAll);
  EXPECT_TRUE(has(Std::kAll, Std::kOut));
  EXPECT_FALSE(has(Std::kErr, Std::kOut));
}

}  // namespace
}  // namespace ddp::agent
