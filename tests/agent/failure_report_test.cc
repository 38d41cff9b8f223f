#include "ddp/agent/failure_report.h"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ddp/agent/worker_spec.h"

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
