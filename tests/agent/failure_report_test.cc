#include "ddp/agent/failure_report.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

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
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || ::poll(&poll_fd, 1, static_cast<int>(left.count())) <= 0) break;
    char buffer[4096];
    ssize_t n = ::read(p[0], buffer, sizeof(buffer));
    if (n <= 0)
      done = true;
    else
      text.append(buffer, static_cast<std::size_t>(n));
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
  EXPECT_NE(text->find(path.string() + " is a FIFO, not a regular file"), std::string::npos)
      << *text;
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
  EXPECT_EQ(f.timestamp,
            std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count());
  auto g = make_failure(2, 7, 99, 3, "", now);
  EXPECT_EQ(g.message,
            "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html");
}

TEST(FailureReport, RootCauseIsEarliest) {
  auto t = system_clock::now();
  auto a = make_failure(0, 0, 10, 1, "", t + std::chrono::milliseconds(5));
  auto b = make_failure(1, 1, 11, 2, "", t);
  b.timestamp = a.timestamp;  // same second: observation order decides
  EXPECT_EQ(root_cause({a, b}), 1u);
  // A worker-written timestamp no longer decides: b was still observed first.
  a.timestamp -= 1;
  EXPECT_EQ(root_cause({a, b}), 1u);
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
  EXPECT_NE(
      report.find("  rank      : 3 (local_rank: 1)\n  exitcode  : -11 (pid: 101)\n"
                  "  error_file: <N/A>\n  traceback : Signal 11 (SIGSEGV) received by PID 101\n" +
                  section + "\nRoot Cause (first observed failure):\n[1]:\n"),
      std::string::npos)
      << report;
  EXPECT_NE(report.find("  rank      : 2 (local_rank: 0)\n  exitcode  : 1 (pid: 100)\n"),
            std::string::npos);
  EXPECT_TRUE(report.ends_with(border + "\n"));
}

// ---- Error files written by a hostile or broken worker ----

std::int64_t seconds_of(system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

// The report's "time" line for `seconds` (local time, as torchrun).
std::string time_line(std::int64_t seconds) {
  std::time_t t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buffer[64] = {};
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%d_%H:%M:%S", &tm);
  return std::string("  time      : ") + buffer + "\n";
}

// `depth` nested objects around `inner`, about 17 bytes a level.
std::string nested(int depth, const std::string& inner = "1") {
  std::string text;
  text.reserve(static_cast<std::size_t>(depth) * 17 + inner.size());
  for (int i = 0; i < depth; ++i) text += R"({"nested": [0, )";
  text += inner;
  for (int i = 0; i < depth; ++i) text += "]}";
  return text;
}

// make_failure and format_report on `path`, run in a child process: a stack
// overflow fails the test (and says so) instead of killing the test binary.
struct ChildOutcome {
  std::string crash;  // how the child died, empty when it exited normally
  std::string message;
  std::string report;
};

ChildOutcome failure_in_child(const std::string& path, system_clock::time_point observed) {
  fs::path out = fs::temp_directory_path() / ("ddp-child-" + std::to_string(::getpid()) + ".txt");
  pid_t pid = ::fork();
  if (pid == 0) {
    auto f = make_failure(0, 3, 77, 1, path, observed);
    std::string report = format_report("train.py", {f}, "node1");
    std::ofstream(out) << f.message.size() << "\n" << f.message << report;
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ChildOutcome outcome;
  if (WIFSIGNALED(status)) {
    outcome.crash = "killed by signal " + std::to_string(WTERMSIG(status));
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    outcome.crash = "exit status " + std::to_string(WEXITSTATUS(status));
  } else {
    std::ifstream in(out);
    std::size_t size = 0;
    in >> size;
    in.get();
    outcome.message.resize(size);
    in.read(outcome.message.data(), static_cast<std::streamsize>(size));
    outcome.report.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  fs::remove(out);
  return outcome;
}

TEST(FailureReport, HundredThousandLevelsDeepErrorFileDoesNotCrash) {
  // About 1.7 MB, under kMaxErrorFileBytes: the traceback at a normal depth
  // is reported beside the deep value, which is dropped.
  const std::string deep = nested(100000);
  ASSERT_LT(deep.size(), kMaxErrorFileBytes);
  ErrorFile file(R"({"message": {"message": "RuntimeError: deep", "extraInfo": {)"
                 R"("py_callstack": "Traceback (most recent call last):\nRuntimeError: deep", )"
                 R"("timestamp": "1700000000", "nested": )" +
                 deep + "}}}");
  auto outcome = failure_in_child(file.path(), system_clock::now());
  ASSERT_EQ(outcome.crash, "") << "make_failure/format_report died on a 100,000-deep error file";
  EXPECT_EQ(outcome.message, "Traceback (most recent call last):\nRuntimeError: deep");
  EXPECT_NE(
      outcome.report.find("traceback : Traceback (most recent call last):\n  RuntimeError: deep"),
      std::string::npos)
      << outcome.report;
}

TEST(FailureReport, DeepExtraInfoKeepsTheMessage) {
  // No py_callstack: the inner message is reported; extraInfo itself is the
  // deep value (@record's copy of it used to recurse once per level).
  ErrorFile file(R"({"message": {"message": "ValueError: kept", "extraInfo": )" + nested(100000) +
                 "}}");
  auto outcome = failure_in_child(file.path(), system_clock::now());
  ASSERT_EQ(outcome.crash, "");
  EXPECT_EQ(outcome.message, "ValueError: kept");

  // The string form, with a deep sibling and a deep array.
  ErrorFile plain(R"({"junk": )" + nested(100000) +
                  R"(, "message": "plain failure", )"
                  R"("timestamp": 1600000000, "more": )" +
                  std::string(100000, '[') + std::string(100000, ']') + "}");
  auto f = make_failure(0, 0, 1, 2, plain.path(), system_clock::now());
  EXPECT_EQ(f.message, "plain failure");
  EXPECT_EQ(f.timestamp, 1600000000);
}

TEST(FailureReport, DeepDocumentWithoutAReadableMessageIsNamed) {
  // The whole file one deep array, then a deep "message": nothing to report
  // but that, and no crash.
  ErrorFile arrays(std::string(100000, '[') + std::string(100000, ']'));
  auto a = failure_in_child(arrays.path(), system_clock::now());
  ASSERT_EQ(a.crash, "");
  EXPECT_NE(a.message.find("unreadable error file: a JSON array, not an object"), std::string::npos)
      << a.message;

  ErrorFile deep_message(R"({"message": )" + nested(100000) + "}");
  auto b = failure_in_child(deep_message.path(), system_clock::now());
  ASSERT_EQ(b.crash, "");
  EXPECT_EQ(b.message, "<N/A>") << "an object message without message or py_callstack";

  // Unclosed: not JSON, said without building anything.
  ErrorFile unclosed(R"({"message": )" + std::string(100000, '['));
  auto c = failure_in_child(unclosed.path(), system_clock::now());
  ASSERT_EQ(c.crash, "");
  EXPECT_NE(c.message.find("unreadable error file: not valid JSON"), std::string::npos)
      << c.message;
}

TEST(FailureReport, OddTimestampsAreIgnoredAndTheTracebackKept) {
  const auto now = system_clock::now();
  const std::vector<std::string> odd = {R"("abc")",
                                        R"("12abc")",
                                        R"("")",
                                        R"(" 12")",
                                        R"("+12")",
                                        R"("-12")",
                                        R"("1.5")",
                                        R"("0x10")",
                                        R"("99999999999999999999")",
                                        R"("9223372036854775808")",
                                        R"({"t": 1})",
                                        R"([1700000000])",
                                        "1.5",
                                        "1e9",
                                        "99999999999999999999",
                                        "-5",
                                        "-9223372036854775808",
                                        "true",
                                        "null"};
  for (const auto& timestamp : odd) {
    SCOPED_TRACE("timestamp " + timestamp);
    ErrorFile record(R"({"message": {"message": "RuntimeError: m", "extraInfo": {)"
                     R"("py_callstack": "Traceback: tb", "timestamp": )" +
                     timestamp + "}}}");
    auto f = make_failure(0, 0, 1, 2, record.path(), now);
    EXPECT_EQ(f.message, "Traceback: tb");
    EXPECT_EQ(f.timestamp, seconds_of(now));

    ErrorFile plain(R"({"message": "plain failure", "timestamp": )" + timestamp + "}");
    auto g = make_failure(0, 0, 1, 2, plain.path(), now);
    EXPECT_EQ(g.message, "plain failure");
    EXPECT_EQ(g.timestamp, seconds_of(now));
  }
  // The largest plain one is still read (and only shown when plausible).
  ErrorFile max(R"({"message": "m", "timestamp": "9223372036854775807"})");
  EXPECT_EQ(make_failure(0, 0, 1, 2, max.path(), now).timestamp,
            std::numeric_limits<std::int64_t>::max());
  ErrorFile zeros(R"({"message": "m", "timestamp": "0001700000000"})");
  EXPECT_EQ(make_failure(0, 0, 1, 2, zeros.path(), now).timestamp, 1700000000);
}

TEST(FailureReport, HostileTimestampDoesNotPickTheRootCause) {
  const auto t = system_clock::now();
  // Rank 0 fails first with an honest file; rank 1 fails 2 s later and claims
  // 1970 to be blamed first, rank 2 claims the far future.
  ErrorFile honest(R"({"message": "first", "timestamp": )" + std::to_string(seconds_of(t)) + "}");
  auto a = make_failure(0, 0, 100, 1, honest.path(), t);
  ErrorFile early(R"({"message": {"message": "liar", "extraInfo": {"timestamp": "1"}}})");
  auto b = make_failure(1, 1, 101, 1, early.path(), t + std::chrono::seconds(2));
  ErrorFile future(R"({"message": "later", "timestamp": 9223372036854775807})");
  auto c = make_failure(2, 2, 102, 1, future.path(), t + std::chrono::seconds(3));
  EXPECT_EQ(b.timestamp, 1) << "read as written";
  EXPECT_EQ(root_cause({b, a, c}), 1u);
  EXPECT_EQ(root_cause({c, b, a}), 2u);
  EXPECT_EQ(root_cause({a, b, c}), 0u);

  const std::string report = format_report("train.py", {b, c, a}, "node1");
  const auto root = report.find("Root Cause (first observed failure):\n[2]:\n" +
                                time_line(seconds_of(t)) + "  host      : node1\n  rank      : 0 ");
  EXPECT_NE(root, std::string::npos) << report;
  // The implausible times are replaced by when the agent saw the exits.
  EXPECT_NE(report.find("[0]:\n" + time_line(seconds_of(t + std::chrono::seconds(2)))),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("[1]:\n" + time_line(seconds_of(t + std::chrono::seconds(3)))),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("1970-01-01"), std::string::npos) << report;
}

TEST(FailureReport, PlausibleTimestampIsShownAsTorchrunDoes) {
  const auto t = system_clock::now();
  const std::int64_t now = seconds_of(t);
  auto shown = [&](std::int64_t timestamp) {
    ErrorFile file(R"({"message": "m", "timestamp": )" + std::to_string(timestamp) + "}");
    auto f = make_failure(0, 0, 1, 2, file.path(), t);
    EXPECT_EQ(f.timestamp, timestamp);
    return format_report("x", {f}, "h");
  };
  EXPECT_NE(shown(now - 3600).find(time_line(now - 3600)), std::string::npos);
  EXPECT_NE(shown(now + 86400).find(time_line(now + 86400)), std::string::npos);  // a day ahead
  EXPECT_NE(shown(now + 86401).find(time_line(now)), std::string::npos);
  EXPECT_NE(shown(946684800).find(time_line(946684800)), std::string::npos);  // 2000-01-01
  EXPECT_NE(shown(946684799).find(time_line(now)), std::string::npos);
  EXPECT_NE(shown(5).find(time_line(now)), std::string::npos);
}

TEST(FailureReport, FieldsOfUnexpectedTypesAreNeverFatal) {
  const auto now = system_clock::now();
  struct Case {
    std::string text;
    std::string message;  // exact, or a part of it when `part`
    bool part = false;
  };
  const std::string hint =
      "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";
  const std::vector<Case> cases = {
      {R"({"message": 42})", R"(unreadable error file: its "message" is a number)", true},
      {R"({"message": -1.5})", R"(its "message" is a number)", true},
      {R"({"message": [1, "a"]})", R"(its "message" is an array)", true},
      {R"({"message": true})", R"(its "message" is a boolean)", true},
      {R"({"message": null})", R"(its "message" is null)", true},
      {R"({"msg": "x"})", R"(unreadable error file: no "message")", true},
      {R"({})", R"(no "message")", true},
      {R"([1, 2])", "unreadable error file: a JSON array, not an object", true},
      {R"("a string")", "a JSON string, not an object", true},
      {R"(17)", "a JSON number, not an object", true},
      {R"(null)", "a JSON null, not an object", true},
      {R"({"message": {"message": "m", "extraInfo": [1, 2]}})", "m"},
      {R"({"message": {"message": "m", "extraInfo": "text"}})", "m"},
      {R"({"message": {"message": "m", "extraInfo": null}})", "m"},
      {R"({"message": {"message": "m", "extraInfo": {"py_callstack": {"a": 1}}}})", "m"},
      {R"({"message": {"message": "m", "extraInfo": {"py_callstack": ["tb"]}}})", "m"},
      {R"({"message": {"message": "m", "extraInfo": {"py_callstack": ""}}})", "m"},
      {R"({"message": {"message": 7, "extraInfo": {"py_callstack": 8}}})", "<N/A>"},
      {R"({"message": {"message": {"deeper": "x"}}})", "<N/A>"},
      {R"({"message": {"message": ""}})", "<N/A>"},
      {R"({"message": {}})", "<N/A>"},
      {R"({"message": {"extraInfo": {"py_callstack": "tb", "timestamp": {"t": 1}}}})", "tb"},
      {R"({"message": ""})", hint},
      {R"({"message": "m", "timestamp": [1]})", "m"},
      {"{not json", "unreadable error file: not valid JSON (error at byte 3)", true},
      {"", "not valid JSON", true},
      {R"({"message": "m"} trailing)", "not valid JSON", true},
      {"{\"message\": \"\xff\xfe\"}", "not valid JSON", true},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    ProcessFailure f;
    ASSERT_NO_THROW(f = make_failure(0, 0, 1, 2, ErrorFile(c.text).path(), now));
    if (c.part) {
      EXPECT_NE(f.message.find(c.message), std::string::npos) << f.message;
    } else {
      EXPECT_EQ(f.message, c.message);
    }
    EXPECT_EQ(f.timestamp, seconds_of(now));
    EXPECT_NO_THROW(format_report("x", {f}, "h"));
  }
}

TEST(FailureReport, ParseErrorFileIsPure) {
  ProcessFailure f;
  f.message = "generated";
  f.timestamp = 7;
  parse_error_file(R"({"message": ""})", f);
  EXPECT_EQ(f.message, "generated") << "an empty message keeps the generated one";
  EXPECT_EQ(f.timestamp, 7);
  parse_error_file(R"({"message": "m", "timestamp": "1700000000"})", f);
  EXPECT_EQ(f.message, "m");
  EXPECT_EQ(f.timestamp, 1700000000);
  parse_error_file(R"({"message": "n", "timestamp": "later"})", f);
  EXPECT_EQ(f.message, "n");
  EXPECT_EQ(f.timestamp, 1700000000) << "an odd timestamp leaves it as it was";
  // Bounded: the message is never longer than the text, or a short diagnostic.
  const std::string garbage(100000, '{');
  parse_error_file(garbage, f);
  EXPECT_LE(f.message.size(), 256u) << f.message;
  EXPECT_NE(f.message.find("not valid JSON"), std::string::npos);
}

TEST(FailureReport, ReportTimestampRule) {
  ProcessFailure f;
  f.observed = system_clock::time_point(std::chrono::seconds(1700000000));
  f.timestamp = 1699990000;
  EXPECT_EQ(report_timestamp(f), 1699990000);
  f.timestamp = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(report_timestamp(f), 1700000000);
  f.timestamp = std::numeric_limits<std::int64_t>::min();
  EXPECT_EQ(report_timestamp(f), 1700000000);
  f.timestamp = kEarliestPlausibleTimestamp - 1;
  EXPECT_EQ(report_timestamp(f), 1700000000);
  f.timestamp = 1700000000 + kMaxTimestampAheadSeconds;
  EXPECT_EQ(report_timestamp(f), f.timestamp);
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
