// The server side of torch's file-based timer protocol (agent/src/file_timer.h):
// the exact lines torch's FileTimerClient writes, acquire and release,
// expiry order, garbage and over-long lines, requests for other processes,
// bounds, the FIFO's creation and removal, and torch's real client end to end.
//
// The header is private to ddp::agent and tests/agent/CMakeLists.txt adds no
// include directory for agent/src, hence the relative include.
#include "file_timer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/error.h"
#include "process_util.h"
#include "temp_dir.h"

namespace ddp::agent {
namespace {

namespace fs = std::filesystem;
using std::chrono::system_clock;
using test::TempDir;

system_clock::time_point at_seconds(double seconds) {
  return system_clock::time_point(
      std::chrono::duration_cast<system_clock::duration>(std::chrono::duration<double>(seconds)));
}

// A request line in the byte format of torch's FileTimerRequest.to_json
// (json.dumps with its default ", " and ": " separators) and the newline
// FileTimerClient adds.
std::string line(int pid, const std::string& scope, double expiration, int signal) {
  char number[64];
  std::snprintf(number, sizeof(number), "%.17g", expiration);
  return "{\"version\": 1, \"pid\": " + std::to_string(pid) + ", \"scope_id\": \"" + scope +
         "\", \"expiration_time\": " + number + ", \"signal\": " + std::to_string(signal) + "}\n";
}

// Writes `bytes` into the server's FIFO the way a client does (a
// non-blocking open), draining whenever the pipe is full, then drains once.
void send(FileTimerServer& server, const std::set<int>& pids, std::string_view bytes) {
  const int fd = ::open(server.path().c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      server.drain(pids);
    } else {
      ::close(fd);
      FAIL() << "write: " << std::strerror(errno);
    }
  }
  ::close(fd);
  server.drain(pids);
}

std::vector<std::string> scopes_of(const std::vector<ExpiredTimer>& timers) {
  std::vector<std::string> scopes;
  for (const auto& t : timers) scopes.push_back(t.scope_id);
  return scopes;
}

const auto kFarFuture = at_seconds(4e9);

// ---- parse_timer_request ----

TEST(ParseTimerRequest, Torch113ExactLines) {
  // Byte for byte what torch 1.13's FileTimerClient writes (without the
  // newline): acquire(..., SIGKILL), then release().
  std::string why;
  auto acquire = parse_timer_request(
      R"({"version": 1, "pid": 1234, "scope_id": "step", "expiration_time": 1700000000.25, "signal": 9})",
      &why);
  ASSERT_TRUE(acquire.has_value()) << why;
  EXPECT_EQ(acquire->pid, 1234);
  EXPECT_EQ(acquire->scope_id, "step");
  EXPECT_DOUBLE_EQ(acquire->expiration_time, 1700000000.25);
  EXPECT_EQ(acquire->signal, 9);

  auto release = parse_timer_request(
      R"({"version": 1, "pid": 1234, "scope_id": "step", "expiration_time": -1, "signal": 0})",
      &why);
  ASSERT_TRUE(release.has_value()) << why;
  EXPECT_EQ(release->pid, 1234);
  EXPECT_LT(release->expiration_time, 0);
  EXPECT_EQ(release->signal, 0);

  // expires()'s default scope is "<file>#<line>"; json.dumps escapes
  // non-ASCII as \uXXXX, which arrives as UTF-8.
  auto escaped = parse_timer_request(
      R"({"version": 1, "pid": 7, "scope_id": "/x/train.py#12 \u00e9", "expiration_time": 5, "signal": 9})",
      &why);
  ASSERT_TRUE(escaped.has_value()) << why;
  EXPECT_EQ(escaped->scope_id, "/x/train.py#12 \xc3\xa9");
}

TEST(ParseTimerRequest, OtherSpellingsOfTheSameFormat) {
  std::string why;
  // Compact separators, other key order, an unknown field, a trailing \r.
  auto compact = parse_timer_request(
      R"({"signal":15,"scope_id":"s","pid":42,"expiration_time":10,"extra":{"a":[1]},"version":1})"
      "\r",
      &why);
  ASSERT_TRUE(compact.has_value()) << why;
  EXPECT_EQ(compact->pid, 42);
  EXPECT_EQ(compact->signal, 15);
  EXPECT_DOUBLE_EQ(compact->expiration_time, 10);

  // No "version": torch's server never reads it, so it is accepted.
  auto unversioned = parse_timer_request(
      R"({"pid": 42, "scope_id": "s", "expiration_time": 10.5, "signal": 9})", &why);
  ASSERT_TRUE(unversioned.has_value()) << why;
  EXPECT_DOUBLE_EQ(unversioned->expiration_time, 10.5);

  // A signal of 0 or less means "do not signal" (torch's client docs).
  auto negative = parse_timer_request(
      R"({"version": 1, "pid": 42, "scope_id": "s", "expiration_time": 10, "signal": -3})", &why);
  ASSERT_TRUE(negative.has_value()) << why;
  EXPECT_EQ(negative->signal, 0);
}

TEST(ParseTimerRequest, RejectsInvalidRequests) {
  const std::string scope_1025(1025, 's');
  const std::string scope_1024(1024, 's');
  const std::vector<std::string> bad = {
      "",
      "not json",
      "[1, 2, 3]",
      "\"a string\"",
      R"({"version": 1, "pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 9)",  // cut
      R"({"version": 2, "pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 9})",
      R"({"version": "1", "pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 9})",
      R"({"version": 1, "scope_id": "s", "expiration_time": 1, "signal": 9})",
      R"({"version": 1, "pid": 1, "expiration_time": 1, "signal": 9})",
      R"({"version": 1, "pid": 1, "scope_id": "s", "signal": 9})",
      R"({"version": 1, "pid": 1, "scope_id": "s", "expiration_time": 1})",
      R"({"version": 1, "pid": "1", "scope_id": "s", "expiration_time": 1, "signal": 9})",
      R"({"version": 1, "pid": 1.5, "scope_id": "s", "expiration_time": 1, "signal": 9})",
      R"({"version": 1, "pid": true, "scope_id": "s", "expiration_time": 1, "signal": 9})",
      R"({"version": 1, "pid": 0, "scope_id": "s", "expiration_time": 1, "signal": 9})",
      R"({"version": 1, "pid": -5, "scope_id": "s", "expiration_time": 1, "signal": 9})",
      R"({"version": 1, "pid": 2147483648, "scope_id": "s", "expiration_time": 1, "signal": 9})",
      R"({"version": 1, "pid": 1, "scope_id": 5, "expiration_time": 1, "signal": 9})",
      R"({"version": 1, "pid": 1, "scope_id": ["s"], "expiration_time": 1, "signal": 9})",
      R"({"version": 1, "pid": 1, "scope_id": "s", "expiration_time": "1", "signal": 9})",
      R"({"version": 1, "pid": 1, "scope_id": "s", "expiration_time": Infinity, "signal": 9})",
      R"({"version": 1, "pid": 1, "scope_id": "s", "expiration_time": NaN, "signal": 9})",
      R"({"version": 1, "pid": 1, "scope_id": "s", "expiration_time": 1e999, "signal": 9})",
      R"({"version": 1, "pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 65})",
      R"({"version": 1, "pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 9.0})",
      R"({"version": 1, "pid": 1, "scope_id": "s", "expiration_time": 1, "signal": null})",
      R"({"version": 1, "pid": 1, "scope_id": ")" + scope_1025 +
          R"(", "expiration_time": 1, "signal": 9})",
      std::string(100000, '[') + std::string(100000, ']'),
      R"({"version": 1, "pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 9, "x": )" +
          std::string(70000, '1') + "}",  // over 64 KiB
  };
  for (const auto& text : bad) {
    std::string why;
    EXPECT_FALSE(parse_timer_request(text, &why).has_value()) << text.substr(0, 120);
    EXPECT_FALSE(why.empty()) << text.substr(0, 120);
  }
  // The bounds themselves are accepted.
  std::string why;
  EXPECT_TRUE(parse_timer_request(R"({"version": 1, "pid": 2147483647, "scope_id": ")" +
                                      scope_1024 + R"(", "expiration_time": 1, "signal": 64})",
                                  &why)
                  .has_value())
      << why;
  // why may be null.
  EXPECT_FALSE(parse_timer_request("garbage", nullptr).has_value());
}

// ---- FileTimerServer ----

TEST(FileTimerServer, CreatesAPrivateFifoThatClientsOpenWithoutBlocking) {
  TempDir dir("file-timer");
  const std::string path = (dir.path() / "timer").string();
  FileTimerServer server(path, true);
  EXPECT_EQ(server.path(), path);
  EXPECT_GE(server.fd(), 0);
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(::fcntl(server.fd(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_NE(::fcntl(server.fd(), F_GETFL) & O_NONBLOCK, 0);

  // A blocking write-only open returns at once: the server holds a reader.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ::close(fd);
  // Nothing to read, and every writer gone: drain returns (no block, no EOF
  // trouble) and counts nothing.
  server.drain({1});
  server.drain({1});
  EXPECT_EQ(server.active_timers(), 0u);
  EXPECT_EQ(server.bad_messages(), 0u);
  EXPECT_EQ(server.ignored_messages(), 0u);
}

TEST(FileTimerServer, AcquireThenRelease) {
  TempDir dir("file-timer");
  FileTimerServer server((dir.path() / "timer").string(), true);
  const std::set<int> pids = {100, 200};
  send(server, pids, line(100, "step", 1000, 9));
  send(server, pids, line(200, "step", 1000, 9));
  EXPECT_EQ(server.active_timers(), 2u);
  // torch's release line: expiration_time -1, signal 0.
  send(server, pids,
       R"({"version": 1, "pid": 100, "scope_id": "step", "expiration_time": -1, "signal": 0})"
       "\n");
  EXPECT_EQ(server.active_timers(), 1u);
  // Releasing what is not held does nothing.
  send(server, pids, line(100, "never-acquired", -1, 0));
  EXPECT_EQ(server.active_timers(), 1u);
  auto expired = server.take_expired(kFarFuture);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].pid, 200);
  EXPECT_EQ(server.active_timers(), 0u);
  EXPECT_EQ(server.bad_messages(), 0u);
  EXPECT_EQ(server.ignored_messages(), 0u);
}

TEST(FileTimerServer, AcquiringAgainReplacesTheTimer) {
  TempDir dir("file-timer");
  FileTimerServer server((dir.path() / "timer").string(), true);
  send(server, {7}, line(7, "step", 1000, 9) + line(7, "step", 3000, 15));
  EXPECT_EQ(server.active_timers(), 1u);
  EXPECT_TRUE(server.take_expired(at_seconds(2000)).empty());
  auto expired = server.take_expired(at_seconds(3000));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].signal, 15);
  EXPECT_DOUBLE_EQ(expired[0].expiration_time, 3000);
}

TEST(FileTimerServer, ExpiresInOrderOfExpirationAndRemovesWhatExpired) {
  TempDir dir("file-timer");
  FileTimerServer server((dir.path() / "timer").string(), true);
  const std::set<int> pids = {1, 2};
  send(server, pids,
       line(1, "c", 30, 9) + line(2, "a", 10, 15) + line(1, "b", 20, 0) + line(1, "d", 40, 9));
  EXPECT_TRUE(server.take_expired(at_seconds(9.5)).empty());
  auto first = server.take_expired(at_seconds(25));
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].pid, 2);
  EXPECT_EQ(first[0].scope_id, "a");
  EXPECT_EQ(first[0].signal, 15);
  EXPECT_EQ(first[1].pid, 1);
  EXPECT_EQ(first[1].scope_id, "b");
  EXPECT_EQ(first[1].signal, 0);  // report only
  EXPECT_EQ(server.active_timers(), 2u);
  // Taken timers do not come back; expiration_time == now expires.
  auto second = server.take_expired(at_seconds(30));
  EXPECT_EQ(scopes_of(second), std::vector<std::string>{"c"});
  EXPECT_EQ(scopes_of(server.take_expired(at_seconds(39))), std::vector<std::string>{});
  EXPECT_EQ(scopes_of(server.take_expired(at_seconds(40))), std::vector<std::string>{"d"});
  EXPECT_EQ(server.active_timers(), 0u);
}

TEST(FileTimerServer, APartialLineWaitsForItsNewline) {
  TempDir dir("file-timer");
  FileTimerServer server((dir.path() / "timer").string(), true);
  const std::string full = line(5, "step", 100, 9);
  send(server, {5}, full.substr(0, 20));
  EXPECT_EQ(server.active_timers(), 0u);
  EXPECT_EQ(server.bad_messages(), 0u);
  send(server, {5}, full.substr(20));
  EXPECT_EQ(server.active_timers(), 1u);
  EXPECT_EQ(server.bad_messages(), 0u);
}

TEST(FileTimerServer, GarbageIsCountedAndValidLinesAroundItApply) {
  TempDir dir("file-timer");
  FileTimerServer server((dir.path() / "timer").string(), true);
  std::string bytes = "garbage\n";
  bytes += line(5, "one", 100, 9);
  bytes += "{\"pid\": 5}\n";
  bytes += "\n";
  bytes += std::string("\0\xff\x01", 3) + "\n";
  bytes += line(5, "two", 100, 9);
  bytes += R"({"version": 3, "pid": 5, "scope_id": "v3", "expiration_time": 1, "signal": 9})"
           "\n";
  send(server, {5}, bytes);
  EXPECT_EQ(server.active_timers(), 2u);
  EXPECT_EQ(server.bad_messages(), 5u);
  EXPECT_EQ(server.ignored_messages(), 0u);
  EXPECT_EQ(scopes_of(server.take_expired(kFarFuture)), (std::vector<std::string>{"one", "two"}));
}

TEST(FileTimerServer, AnOverlongLineIsDroppedThroughItsNewline) {
  TempDir dir("file-timer");
  FileTimerServer server((dir.path() / "timer").string(), true);
  // 1 MiB of spaces and then a well-formed request, all one line: a server
  // that resynchronised in the middle of the line would apply "tail".
  std::string bytes(1024 * 1024, ' ');
  bytes += line(5, "tail", 100, 9);  // ends the long line
  bytes += line(5, "after", 100, 9);
  send(server, {5}, bytes);
  EXPECT_EQ(server.bad_messages(), 1u);
  EXPECT_EQ(server.active_timers(), 1u);
  EXPECT_EQ(scopes_of(server.take_expired(kFarFuture)), std::vector<std::string>{"after"});

  // A line of exactly 64 KiB (padding is JSON whitespace) still applies.
  std::string exact = line(5, "exact", 100, 9);
  exact.pop_back();
  exact = std::string(kMaxTimerLine - exact.size(), ' ') + exact + "\n";
  send(server, {5}, exact);
  EXPECT_EQ(server.bad_messages(), 1u);
  EXPECT_EQ(scopes_of(server.take_expired(kFarFuture)), std::vector<std::string>{"exact"});
}

TEST(FileTimerServer, RequestsForAnotherPidAreIgnored) {
  TempDir dir("file-timer");
  FileTimerServer server((dir.path() / "timer").string(), true);
  const int stranger = 99999;
  send(server, {5}, line(stranger, "step", 1, 9));
  send(server, {5}, line(stranger, "step", -1, 0));
  EXPECT_EQ(server.active_timers(), 0u);
  EXPECT_EQ(server.ignored_messages(), 2u);
  EXPECT_EQ(server.bad_messages(), 0u);
  EXPECT_TRUE(server.take_expired(kFarFuture).empty());
  // The same line applies once the pid is the caller's.
  send(server, {5, stranger}, line(stranger, "step", 1, 9));
  EXPECT_EQ(server.take_expired(kFarFuture).size(), 1u);
}

TEST(FileTimerServer, ForgetPidDropsOnlyThatPidsTimers) {
  TempDir dir("file-timer");
  FileTimerServer server((dir.path() / "timer").string(), true);
  const std::set<int> pids = {5, 6};
  send(server, pids, line(5, "a", 100, 9) + line(5, "b", 100, 9) + line(6, "a", 100, 9));
  server.forget_pid(5);
  EXPECT_EQ(server.active_timers(), 1u);
  auto expired = server.take_expired(kFarFuture);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].pid, 6);
  // The per-pid count went with them: pid 5 may hold a full set again.
  std::string bytes;
  for (std::size_t i = 0; i < kMaxTimersPerPid; ++i) bytes += line(5, std::to_string(i), 100, 9);
  send(server, pids, bytes);
  EXPECT_EQ(server.active_timers(), kMaxTimersPerPid);
  EXPECT_EQ(server.ignored_messages(), 0u);
}

TEST(FileTimerServer, TheNumberOfTimersIsBounded) {
  TempDir dir("file-timer");
  FileTimerServer server((dir.path() / "timer").string(), true);
  std::set<int> pids;
  const int full_pids = static_cast<int>(kMaxTimersTotal / kMaxTimersPerPid);
  for (int pid = 1; pid <= full_pids + 1; ++pid) pids.insert(pid);

  // One pid: kMaxTimersPerPid scopes, then one more is ignored; replacing
  // and releasing a held scope still work at the bound.
  std::string bytes;
  for (std::size_t i = 0; i <= kMaxTimersPerPid; ++i) bytes += line(1, std::to_string(i), 100, 9);
  send(server, pids, bytes);
  EXPECT_EQ(server.active_timers(), kMaxTimersPerPid);
  EXPECT_EQ(server.ignored_messages(), 1u);
  send(server, pids, line(1, "0", 50, 9) + line(1, "1", -1, 0) + line(1, "new", 100, 9));
  EXPECT_EQ(server.active_timers(), kMaxTimersPerPid);
  EXPECT_EQ(server.ignored_messages(), 1u);

  // Every pid full: the total bound; one more pid gets nothing.
  for (int pid = 2; pid <= full_pids + 1; ++pid) {
    bytes.clear();
    for (std::size_t i = 0; i < kMaxTimersPerPid; ++i) {
      bytes += line(pid, std::to_string(i), 100, 9);
    }
    send(server, pids, bytes);
  }
  EXPECT_EQ(server.active_timers(), kMaxTimersTotal);
  EXPECT_EQ(server.ignored_messages(), 1u + kMaxTimersPerPid);
  server.forget_pid(full_pids + 1);  // held nothing
  EXPECT_EQ(server.active_timers(), kMaxTimersTotal);
  server.forget_pid(2);
  send(server, pids, line(full_pids + 1, "finally", 100, 9));
  EXPECT_EQ(server.active_timers(), kMaxTimersTotal - kMaxTimersPerPid + 1);
}

TEST(FileTimerServer, RefusesASymbolicLink) {
  TempDir dir("file-timer");
  const fs::path target = dir.path() / "target";
  const fs::path fifo = dir.path() / "real-fifo";
  { std::ofstream(target) << "keep me"; }
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const fs::path& pointee : {target, fifo, dir.path() / "dangling"}) {
    const fs::path link = dir.path() / "link";
    fs::remove(link);
    fs::create_symlink(pointee, link);
    try {
      FileTimerServer server(link.string(), true);
      ADD_FAILURE() << "a symbolic link to " << pointee << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(link.string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("symbolic link"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(fs::is_symlink(link)) << pointee;
  }
  EXPECT_EQ(test::read_text(target), "keep me");
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_FALSE(fs::exists(dir.path() / "dangling"));
}

TEST(FileTimerServer, RefusesARegularFileOrADirectory) {
  TempDir dir("file-timer");
  const fs::path file = dir.path() / "file";
  { std::ofstream(file) << "keep me"; }
  EXPECT_THROW(FileTimerServer(file.string(), true), InvalidArgument);
  EXPECT_EQ(test::read_text(file), "keep me");
  fs::create_directory(dir.path() / "dir");
  try {
    FileTimerServer server((dir.path() / "dir").string(), true);
    ADD_FAILURE() << "a directory was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("not a FIFO"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_directory(dir.path() / "dir"));
  EXPECT_THROW(FileTimerServer("", true), InvalidArgument);
  EXPECT_THROW(FileTimerServer((dir.path() / "missing" / "timer").string(), true), InvalidArgument);
}

TEST(FileTimerServer, ReplacesAnExistingFifoWithAPrivateOne) {
  TempDir dir("file-timer");
  const fs::path path = dir.path() / "timer";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  ASSERT_EQ(::chmod(path.c_str(), 0666), 0);
  // A reader of the old FIFO (a stale server) must not get the new requests.
  const int stale = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(stale, 0);
  FileTimerServer server(path.string(), true);
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  send(server, {5}, line(5, "step", 100, 9));
  EXPECT_EQ(server.active_timers(), 1u);
  char byte;
  EXPECT_EQ(::read(stale, &byte, 1), -1);
  EXPECT_EQ(errno, EAGAIN);
  ::close(stale);
}

TEST(FileTimerServer, RemovesItsFifoOnDestruction) {
  TempDir dir("file-timer");
  const fs::path path = dir.path() / "timer";
  { FileTimerServer server(path.string(), true); }
  EXPECT_FALSE(fs::exists(fs::symlink_status(path)));

  { FileTimerServer server(path.string(), false); }
  EXPECT_TRUE(fs::is_fifo(path));

  // Whatever replaced the FIFO since is not the server's to remove.
  {
    FileTimerServer server(path.string(), true);
    fs::remove(path);
    std::ofstream(path) << "someone else's";
  }
  EXPECT_EQ(test::read_text(path), "someone else's");
}

// torch's own FileTimerClient (and timer.expires) against the server: the
// released scope never expires, the hung one expires with SIGKILL, the
// signal reaps the worker the way torch's server does.
TEST(FileTimerServer, TorchFileTimerClientEndToEnd) {
  TempDir dir("file-timer");
  const std::string python = "/usr/bin/python3";
  const std::map<std::string, std::string> env = {{"PATH", "/usr/bin:/bin"}, {"HOME", dir.str()}};
  if (::access(python.c_str(), X_OK) != 0) GTEST_SKIP() << python << " is missing";
  auto probe = test::run({python, "-c", "import torch.distributed.elastic.timer"}, env, dir.path(),
                         std::chrono::seconds(20));
  if (probe.code != 0) GTEST_SKIP() << python << " cannot import torch: " << probe.err;

  FileTimerServer server((dir.path() / "timer").string(), true);
  const std::string script = R"(
import sys, time
import torch.distributed.elastic.timer as timer
client = timer.FileTimerClient(sys.argv[1])
timer.configure(client)
with timer.expires(after=60, scope="released"):
    pass
client.acquire("held", time.time() + 3600)
with timer.expires(after=0.3, scope="hung"):
    print("hanging", flush=True)
    time.sleep(60)
print("not killed", flush=True)
)";
  test::Child child = test::spawn({python, "-c", script, server.path()}, env, dir.path(), "client");
  const std::set<int> pids = {child.pid};
  std::vector<ExpiredTimer> expired;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (expired.empty() && std::chrono::steady_clock::now() < deadline) {
    server.drain(pids);
    expired = server.take_expired(system_clock::now());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(expired.size(), 1u) << test::read_text(child.err);
  EXPECT_EQ(expired[0].pid, child.pid);
  EXPECT_EQ(expired[0].scope_id, "hung");
  EXPECT_EQ(expired[0].signal, SIGKILL);
  EXPECT_EQ(server.active_timers(), 1u);  // "held"; "released" went
  EXPECT_EQ(server.bad_messages(), 0u);
  EXPECT_EQ(server.ignored_messages(), 0u);
  ASSERT_EQ(::kill(child.pid, expired[0].signal), 0);
  EXPECT_EQ(test::wait_child(child.pid), 128 + SIGKILL);
  EXPECT_EQ(test::read_text(child.out), "hanging\n");
  server.forget_pid(child.pid);
  EXPECT_EQ(server.active_timers(), 0u);
}

}  // namespace
}  // namespace ddp::agent

namespace ddp::agent {
namespace {

TEST(PlanReaps, PerPidEveryScopeAndTheEarliestTimerWithASignal) {
  // As take_expired returns them: by expiration time.
  std::vector<ExpiredTimer> expired = {{7, "load", 0, 10.0},
                                       {9, "step", 9, 11.0},
                                       {7, "step", 15, 12.0},
                                       {7, "save", 9, 13.0},
                                       {8, "eval", 0, 14.0}};
  auto reaps = plan_reaps(expired);
  ASSERT_EQ(reaps.size(), 3u);
  EXPECT_EQ(reaps[0].pid, 7);  // the earliest timer of all is pid 7's
  EXPECT_EQ(reaps[0].scopes, (std::vector<std::string>{"load", "step", "save"}));
  ASSERT_TRUE(reaps[0].signal_from);
  EXPECT_EQ(reaps[0].signal_from->scope_id, "step");  // "load" has no signal
  EXPECT_EQ(reaps[0].signal_from->signal, 15);
  EXPECT_EQ(reaps[1].pid, 9);
  EXPECT_EQ(reaps[1].signal_from->signal, 9);
  EXPECT_EQ(reaps[2].pid, 8);
  EXPECT_FALSE(reaps[2].signal_from);  // report only
  EXPECT_TRUE(plan_reaps({}).empty());
}

}  // namespace
}  // namespace ddp::agent
