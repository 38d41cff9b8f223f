// The store server against hostile and broken clients (raw sockets speaking the
// wire protocol by hand), its timeouts and limits, shutdown, the TcpStore client's
// failure modes, and the ddp-rendezvous daemon binary.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "net_util.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/store/protocol.h"
#include "ddp/store/tcp_store.h"
#include "ddp/store_server/store_server.h"
#include "http_client.h"
#include "server_test_util.h"

extern char** environ;

namespace ddp {
namespace {

using namespace std::chrono_literals;
using namespace ddp::test;
using protocol::Op;
using protocol::Request;
using protocol::Status;
using Clock = std::chrono::steady_clock;

// ---- malformed input ---------------------------------------------------------------------

TEST(StoreServer, EmptyFrameIsMalformedAndClosesOnlyThatConnection) {
  auto server = start_server();
  TcpStore bystander(client_options(server->port()));
  bystander.set("a", "1");
  RawClient raw(server->port());
  raw.handshake();
  raw.send_bytes(std::string(4, '\0'));
  raw.expect_error_and_close(Status::kMalformed);
  EXPECT_EQ(bystander.get("a"), "1");
  expect_still_serving(server->port());
}

TEST(StoreServer, GarbledPayloadIsMalformed) {
  auto server = start_server();
  RawClient raw(server->port());
  raw.handshake();
  // A set whose key length points past the end of the frame.
  raw.send_bytes(std::string("\x06\x00\x00\x00\x10\xff\x00\x00\x00\x41", 10));
  raw.expect_error_and_close(Status::kMalformed);
  expect_still_serving(server->port());
}

TEST(StoreServer, OversizedFrameIsRejected) {
  StoreServerOptions options;
  options.max_frame_size = 1024;
  auto server = start_server(options);
  TcpStore bystander(client_options(server->port()));
  RawClient raw(server->port());
  raw.handshake();
  raw.send_bytes(std::string("\xd0\x07\x00\x00", 4));  // 2000 bytes announced
  raw.expect_error_and_close(Status::kFrameTooLarge);
  bystander.set("k", "v");
  EXPECT_EQ(bystander.get("k"), "v");
}

TEST(StoreServer, FourGiBLengthPrefixIsRejectedBeforeAndAfterTheHandshake) {
  auto server = start_server();
  {
    RawClient raw(server->port());
    raw.send_bytes(std::string("\xff\xff\xff\xff", 4));
    raw.expect_error_and_close(Status::kFrameTooLarge);
  }
  {
    RawClient raw(server->port());
    raw.handshake();
    raw.send_bytes(std::string("\xff\xff\xff\xff", 4));
    raw.expect_error_and_close(Status::kFrameTooLarge);
  }
  expect_still_serving(server->port());
}

TEST(StoreServer, StrangerSpeakingHttpIsTurnedAway) {
  auto server = start_server();
  RawClient raw(server->port());
  raw.send_bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  raw.expect_error_and_close(Status::kFrameTooLarge);
  expect_still_serving(server->port());
}

TEST(StoreServer, UnknownOperationIsRejected) {
  auto server = start_server();
  TcpStore bystander(client_options(server->port()));
  RawClient raw(server->port());
  raw.handshake();
  raw.send_bytes(std::string("\x01\x00\x00\x00\x7f", 5));
  raw.expect_error_and_close(Status::kUnknownOp);
  EXPECT_EQ(bystander.add("n", 2), 2);
}

TEST(StoreServer, WrongVersionIsRejected) {
  auto server = start_server();
  RawClient raw(server->port());
  Request hello = op_request(Op::kHello);
  hello.version = protocol::kVersion + 7;
  raw.send(hello);
  raw.expect_error_and_close(Status::kBadVersion, Op::kHello);
  expect_still_serving(server->port());
}

TEST(StoreServer, WrongMagicIsRejected) {
  auto server = start_server();
  RawClient raw(server->port());
  raw.send_bytes(std::string("\x07\x00\x00\x00\x01XXXX\x01\x00", 11));
  raw.expect_error_and_close(Status::kBadMagic, Op::kHello);
}

TEST(StoreServer, OperationBeforeHelloIsRejected) {
  auto server = start_server();
  RawClient raw(server->port());
  raw.send(op_request(Op::kNumKeys));
  raw.expect_error_and_close(Status::kUnexpected);
}

TEST(StoreServer, SecondHelloIsRejected) {
  auto server = start_server();
  RawClient raw(server->port());
  raw.handshake();
  raw.send(op_request(Op::kHello));
  raw.expect_error_and_close(Status::kUnexpected, Op::kHello);
}

TEST(StoreServer, KeyAboveTheLimitIsRejectedByTheServer) {
  StoreServerOptions options;
  options.max_key_size = 8;
  auto server = start_server(options);
  RawClient raw(server->port());
  raw.handshake();
  Request set = op_request(Op::kSet);
  set.key = "much-too-long-key";
  set.value = "v";
  raw.send(set);
  raw.expect_error_and_close(Status::kKeyTooLarge, Op::kSet);
}

TEST(StoreServer, TcpStoreChecksTheServerLimitsBeforeSending) {
  StoreServerOptions options;
  options.max_key_size = 8;
  options.max_value_size = 16;
  auto server = start_server(options);
  TcpStore store(client_options(server->port()));
  EXPECT_THROW(store.set("much-too-long-key", "v"), InvalidArgument);
  EXPECT_THROW(store.set("k", std::string(17, 'x')), InvalidArgument);
  // The connection is untouched.
  store.set("k", std::string(16, 'x'));
  EXPECT_EQ(store.get("k").size(), 16u);
}

TEST(StoreServer, PipelinedRequestsAreAnsweredInOrder) {
  auto server = start_server();
  RawClient raw(server->port());
  raw.handshake();
  std::string batch;
  Request set = op_request(Op::kSet);
  set.key = "p";
  set.value = "42";
  protocol::encode_request(batch, set);
  Request add = op_request(Op::kAdd);
  add.key = "p";
  add.delta = 8;
  protocol::encode_request(batch, add);
  Request get = op_request(Op::kGet);
  get.key = "p";
  get.timeout_ms = 1000;
  protocol::encode_request(batch, get);
  raw.send_bytes(batch);
  EXPECT_EQ(raw.read_reply(Op::kSet).status, Status::kOk);
  EXPECT_EQ(raw.read_reply(Op::kAdd).integer, 50);
  EXPECT_EQ(raw.read_reply(Op::kGet).value, "50");
}

TEST(StoreServer, FramesAfterAParkedGetWaitTheirTurn) {
  auto server = start_server();
  RawClient raw(server->port());
  raw.handshake();
  std::string batch;
  Request get = op_request(Op::kGet);
  get.key = "later";
  get.timeout_ms = 5000;
  protocol::encode_request(batch, get);
  protocol::encode_request(batch, op_request(Op::kNumKeys));
  raw.send_bytes(batch);
  EXPECT_FALSE(raw.read_payload(200ms).has_value()) << "the get must stay parked";
  TcpStore setter(client_options(server->port()));
  setter.set("later", "now");
  EXPECT_EQ(raw.read_reply(Op::kGet).value, "now");
  EXPECT_EQ(raw.read_reply(Op::kNumKeys).integer, 1);
}

TEST(StoreServer, ClientNotReadingItsRepliesIsPausedNotBuffered) {
  auto server = start_server();
  TcpStore setter(client_options(server->port()));
  const std::string big(1 << 20, 'b');
  setter.set("big", big);
  RawClient greedy(server->port());
  greedy.handshake();
  // 100 MiB of replies requested at once while nothing is read: the server stops
  // reading this client past its output bound and resumes as the replies drain.
  constexpr int kGets = 100;
  std::string batch;
  Request get = op_request(Op::kGet);
  get.key = "big";
  get.timeout_ms = 1000;
  for (int i = 0; i < kGets; ++i) protocol::encode_request(batch, get);
  auto sender = std::async(std::launch::async, [&] { greedy.send_bytes(batch); });
  std::this_thread::sleep_for(200ms);
  expect_still_serving(server->port());  // the single thread is not stuck
  for (int i = 0; i < kGets; ++i) {
    auto reply = greedy.read_reply(Op::kGet);
    ASSERT_EQ(reply.status, Status::kOk) << "reply " << i;
    ASSERT_EQ(reply.value.size(), big.size()) << "reply " << i;
  }
  sender.get();
}

TEST(StoreServer, PausedClientWhoseRepliesAreWrittenAtOnceIsServedToTheEnd) {
  // With a small output bound each pause's replies fit in the socket at once:
  // no write is left pending to end the pause, and the requests still waiting
  // in the backlog must be served without any further input from the client.
  StoreServerOptions options;
  options.max_pending_output = 64 * 1024;
  auto server = start_server(options);
  TcpStore setter(client_options(server->port()));
  const std::string value(16 * 1024, 'v');
  setter.set("v", value);
  RawClient greedy(server->port());
  greedy.handshake();
  constexpr int kGets = 200;
  std::string batch;
  Request get = op_request(Op::kGet);
  get.key = "v";
  get.timeout_ms = 1000;
  for (int i = 0; i < kGets; ++i) protocol::encode_request(batch, get);
  greedy.send_bytes(batch);
  for (int i = 0; i < kGets; ++i) {
    auto reply = greedy.read_reply(Op::kGet);
    ASSERT_EQ(reply.status, Status::kOk) << "reply " << i;
    ASSERT_EQ(reply.value.size(), value.size()) << "reply " << i;
  }
}

// ---- authentication ---------------------------------------------------------------------------

TEST(StoreServer, WrongTokenIsAuthFailed) {
  StoreServerOptions options;
  options.token = "s3cret";
  auto server = start_server(options);
  RawClient raw(server->port());
  raw.send(op_request(Op::kHello));
  auto hello = raw.read_reply(Op::kHello);
  ASSERT_EQ(hello.nonce.size(), protocol::kNonceSize);
  Request auth = op_request(Op::kAuth);
  auto mac = protocol::auth_mac(protocol::Direction::kClient, "wrong",
                                std::string(protocol::kNonceSize, '\0'), std::string(hello.nonce));
  auth.mac = mac;
  raw.send(auth);
  raw.expect_error_and_close(Status::kAuthFailed, Op::kAuth);
  expect_still_serving(server->port(), "s3cret");
}

TEST(StoreServer, MissingTokenIsAuthRequired) {
  StoreServerOptions options;
  options.token = "s3cret";
  auto server = start_server(options);
  RawClient raw(server->port());
  raw.send(op_request(Op::kHello));
  ASSERT_EQ(raw.read_reply(Op::kHello).status, Status::kOk);
  Request get = op_request(Op::kGet);
  get.key = "secret-key";
  raw.send(get);
  raw.expect_error_and_close(Status::kAuthRequired, Op::kGet);
}

TEST(StoreServer, TcpStoreAuthErrors) {
  StoreServerOptions options;
  options.token = "s3cret";
  auto server = start_server(options);
  EXPECT_THROW(TcpStore(client_options(server->port(), "wrong")), AuthError);
  EXPECT_THROW(TcpStore(client_options(server->port())), AuthError);
  TcpStore good(client_options(server->port(), "s3cret"));
  good.set("k", "v");
  EXPECT_EQ(good.get("k"), "v");
}

// ---- timeouts and limits -----------------------------------------------------------------------

TEST(StoreServer, IdleConnectionIsClosedButAParkedOneIsNot) {
  StoreServerOptions options;
  options.idle_timeout = 200ms;
  auto server = start_server(options);
  RawClient idle(server->port());
  idle.handshake();
  TcpStore waiting(client_options(server->port()));
  auto value = std::async(std::launch::async, [&] { return waiting.get("slow", 3s); });
  idle.expect_error_and_close(Status::kIdleTimeout);
  std::this_thread::sleep_for(400ms);  // twice the idle timeout, parked all along
  TcpStore setter(client_options(server->port()));
  setter.set("slow", "done");
  EXPECT_EQ(value.get(), "done");
}

TEST(StoreServer, SilentConnectionFailsTheHandshakeTimeout) {
  StoreServerOptions options;
  options.handshake_timeout = 200ms;
  auto server = start_server(options);
  RawClient silent(server->port());
  EXPECT_TRUE(eventually([&] { return server->num_clients() == 1; }));
  auto start = Clock::now();
  silent.expect_error_and_close(Status::kHandshakeTimeout, Op::kHello);
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_TRUE(eventually([&] { return server->num_clients() == 0; }));
}

TEST(StoreServer, SlowLorisFrameIsClosedByTheIdleTimeout) {
  StoreServerOptions options;
  options.idle_timeout = 300ms;
  auto server = start_server(options);
  RawClient raw(server->port());
  raw.handshake();
  // Two bytes of a header, then a byte every 100 ms: never a complete frame.
  raw.send_bytes(std::string("\x20\x00", 2));
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(100ms);
    raw.send_bytes(std::string(1, '\0'));
  }
  raw.expect_error_and_close(Status::kIdleTimeout);
}

TEST(StoreServer, MaxClientsTurnsAwayTheExcess) {
  StoreServerOptions options;
  options.max_clients = 2;
  auto server = start_server(options);
  auto a = std::make_unique<TcpStore>(client_options(server->port()));
  TcpStore b(client_options(server->port()));
  EXPECT_EQ(server->num_clients(), 2u);
  {
    RawClient excess(server->port());
    excess.expect_error_and_close(Status::kTooManyClients, Op::kHello);
  }
  auto options_c = client_options(server->port());
  options_c.connect_timeout = 300ms;
  EXPECT_THROW(TcpStore{options_c}, NetworkError);
  b.set("k", "v");  // the admitted ones are unaffected
  a.reset();
  EXPECT_TRUE(eventually([&] { return server->num_clients() == 1; }));
  TcpStore c(client_options(server->port()));
  EXPECT_EQ(c.get("k"), "v");
}

TEST(StoreServer, ServerSideTimeoutKeepsTheConnectionUsable) {
  auto server = start_server();
  TcpStore store(client_options(server->port()));
  auto start = Clock::now();
  try {
    store.get("never", 200ms);
    FAIL() << "get returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  auto took = Clock::now() - start;
  EXPECT_GE(took, 190ms);
  EXPECT_LT(took, 2s);
  EXPECT_THROW(store.wait({"a", "b"}, 0ms), TimeoutError);
  store.set("k", "v");
  EXPECT_EQ(store.get("k"), "v");
}

// ---- disconnects and shutdown
// ---------------------------------------------------------------------

TEST(StoreServer, ClientDisconnectingWhileParkedIsCleanedUp) {
  auto server = start_server();
  TcpStore observer(client_options(server->port()));
  {
    RawClient raw(server->port());
    raw.handshake();
    Request wait = op_request(Op::kWait);
    wait.keys = {"never-set"};
    wait.timeout_ms = protocol::kNoTimeout;
    raw.send(wait);
    EXPECT_FALSE(raw.read_payload(100ms).has_value());
    EXPECT_EQ(server->num_clients(), 2u);
  }
  EXPECT_TRUE(eventually([&] { return server->num_clients() == 1; }));
  // Waking the key whose waiter is gone must not touch the freed session.
  observer.set("never-set", "now");
  EXPECT_EQ(observer.get("never-set"), "now");
}

TEST(StoreServer, StopFailsParkedClientsQuickly) {
  auto server = start_server();
  constexpr int kWaiters = 8;
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < kWaiters; ++i) {
    clients.push_back(std::make_unique<TcpStore>(client_options(server->port())));
  }
  std::vector<std::future<ErrorKind>> results;
  for (auto& client : clients) {
    results.push_back(std::async(std::launch::async, [&client] {
      try {
        client->get("never", 60s);
      } catch (const Error& e) {
        return e.kind();
      }
      return ErrorKind::kInternal;
    }));
  }
  EXPECT_TRUE(eventually([&] { return server->num_clients() == kWaiters; }));
  std::this_thread::sleep_for(100ms);  // let every get park
  auto start = Clock::now();
  server->stop();
  for (auto& r : results) {
    ASSERT_EQ(r.wait_for(3s), std::future_status::ready);
    auto kind = r.get();
    EXPECT_TRUE(kind == ErrorKind::kShutdown || kind == ErrorKind::kNetwork) << to_string(kind);
  }
  EXPECT_LT(Clock::now() - start, 3s);
  // Later calls fail fast with NetworkError.
  EXPECT_THROW(clients[0]->set("k", "v"), NetworkError);
  server->stop();  // idempotent
}

TEST(StoreServer, StopBeforeStartAndDestructorWithoutStop) {
  StoreServerOptions options;
  options.port = 0;
  auto idle = std::make_unique<StoreServer>(options);
  idle->stop();
  auto running = start_server();
  TcpStore client(client_options(running->port()));
  running.reset();  // the destructor stops it
  EXPECT_THROW(client.get("x", 5s), NetworkError);
}

TEST(StoreServer, BindingATakenPortIsNetworkError) {
  auto server = start_server();
  StoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = server->port();
  try {
    StoreServer second(options);
    FAIL() << "bound a taken port";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(server->port())), std::string::npos);
  }
}

TEST(StoreServer, BadOptionsAreInvalidArgument) {
  StoreServerOptions options;
  options.max_clients = 0;
  EXPECT_THROW(StoreServer{options}, InvalidArgument);
  options = {};
  options.max_frame_size = 8;
  EXPECT_THROW(StoreServer{options}, InvalidArgument);
}

TEST(TcpStoreClient, DeadServerIsNetworkErrorWithinTheConnectTimeout) {
  auto options = client_options(test::free_port());
  options.connect_timeout = 500ms;
  auto start = Clock::now();
  try {
    TcpStore store(options);
    FAIL() << "connected to nothing";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1"), std::string::npos) << e.what();
  }
  auto took = Clock::now() - start;
  EXPECT_GE(took, 450ms);
  EXPECT_LT(took, 2s);
}

TEST(TcpStoreClient, UnresolvableHostIsNetworkError) {
  auto options = client_options(1);
  options.host = "no-such-host.invalid";
  options.connect_timeout = 200ms;
  EXPECT_THROW(TcpStore{options}, NetworkError);
}

// ---- the daemon ---------------------------------------------------------------------------------

// DDP_BUILD_BIN names the bin folder; without it, the folder of this test
// program (tests and binaries share build/bin).
std::string daemon_path() {
  const char* bin = std::getenv("DDP_BUILD_BIN");
  std::filesystem::path dir = bin != nullptr && *bin != '\0'
                                  ? std::filesystem::path(bin)
                                  : std::filesystem::read_symlink("/proc/self/exe").parent_path();
  return (dir / "ddp-rendezvous").string();
}

// A child process with its stdout and stderr on pipes; killed if still running.
class Child {
 public:
  explicit Child(std::vector<std::string> args) {
    int out[2], err[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int rc = ::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    EXPECT_EQ(rc, 0) << "spawn " << args[0] << ": " << std::strerror(rc);
    ::close(out[1]);
    ::close(err[1]);
    out_ = out[0];
    err_ = err[0];
    if (rc != 0) pid_ = -1;
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(out_);
    ::close(err_);
  }

  // The first line on stdout (without the newline), waiting at most `timeout`.
  std::optional<std::string> first_line(std::chrono::milliseconds timeout = 5s) {
    std::string line;
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char c;
      if (::read(out_, &c, 1) != 1) return std::nullopt;
      if (c == '\n') return line;
      line.push_back(c);
    }
    return std::nullopt;
  }

  // What the child wrote to stderr until a line holding `needle` arrived (or
  // `timeout` passed, or stderr closed); the rest is read by read_stderr().
  std::string stderr_until(const std::string& needle, std::chrono::milliseconds timeout = 10s) {
    std::string text;
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      const auto at = text.find(needle);
      if (at != std::string::npos && text.find('\n', at) != std::string::npos) break;
      pollfd p{err_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char c;
      if (::read(err_, &c, 1) != 1) break;
      text.push_back(c);
    }
    return text;
  }

  std::string read_stderr() {
    std::string text;
    char buf[1024];
    ssize_t n;
    while ((n = ::read(err_, buf, sizeof(buf))) > 0) text.append(buf, static_cast<std::size_t>(n));
    return text;
  }

  void signal(int sig) { ::kill(pid_, sig); }

  // The exit code (or 128 + signal), or nullopt when it is still running after `timeout`.
  std::optional<int> wait(std::chrono::milliseconds timeout = 5s) {
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        return 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(10ms);
    }
    return std::nullopt;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  int err_ = -1;
};

std::uint16_t parse_port(const std::optional<std::string>& line) {
  EXPECT_TRUE(line.has_value()) << "no first line on stdout";
  if (!line) return 0;
  int port = std::atoi(line->c_str());
  EXPECT_GT(port, 0) << "first line: '" << *line << "'";
  EXPECT_LT(port, 65536);
  return static_cast<std::uint16_t>(port);
}

TEST(Daemon, PortZeroPrintsThePortServesAndExitsZeroOnSigterm) {
  Child daemon({daemon_path(), "--host", "127.0.0.1", "--port", "0"});
  auto port = parse_port(daemon.first_line());
  ASSERT_NE(port, 0);
  TcpStore store(client_options(port));
  store.set("k", "v");
  EXPECT_EQ(store.get("k"), "v");
  TcpStore waiter(client_options(port));
  auto blocked = std::async(std::launch::async, [&] {
    try {
      waiter.get("never", 30s);
    } catch (const Error& e) {
      return std::string(to_string(e.kind())) + ": " + e.what();
    }
    return std::string("returned");
  });
  std::this_thread::sleep_for(100ms);
  daemon.signal(SIGTERM);
  EXPECT_EQ(daemon.wait(), 0);
  ASSERT_EQ(blocked.wait_for(3s), std::future_status::ready);
  auto text = blocked.get();
  EXPECT_EQ(text.rfind("ShutdownError", 0), 0u) << text;
  EXPECT_NE(text.find("shutting down"), std::string::npos) << text;
}

TEST(Daemon, SigintAlsoExitsZero) {
  Child daemon({daemon_path(), "--host", "127.0.0.1", "--port", "0"});
  ASSERT_NE(parse_port(daemon.first_line()), 0);
  daemon.signal(SIGINT);
  EXPECT_EQ(daemon.wait(), 0);
}

TEST(Daemon, KilledServerMakesABlockedCallFailPromptly) {
  Child daemon({daemon_path(), "--host", "127.0.0.1", "--port", "0"});
  auto port = parse_port(daemon.first_line());
  ASSERT_NE(port, 0);
  TcpStore store(client_options(port));
  auto blocked = std::async(std::launch::async, [&] {
    try {
      store.get("never", 60s);
    } catch (const NetworkError&) {
      return true;
    } catch (...) {
    }
    return false;
  });
  std::this_thread::sleep_for(100ms);
  daemon.signal(SIGKILL);
  EXPECT_EQ(daemon.wait(), 128 + SIGKILL);
  ASSERT_EQ(blocked.wait_for(3s), std::future_status::ready);
  EXPECT_TRUE(blocked.get());
  EXPECT_THROW(store.set("k", "v"), NetworkError);
}

TEST(Daemon, TokenFileIsRequiredFromClients) {
  auto path = std::filesystem::temp_directory_path() / ("ddp-token-" + std::to_string(::getpid()));
  { std::ofstream(path) << "tok3n\n"; }
  Child daemon(
      {daemon_path(), "--host", "127.0.0.1", "--port", "0", "--token-file", path.string()});
  auto port = parse_port(daemon.first_line());
  std::filesystem::remove(path);
  ASSERT_NE(port, 0);
  TcpStore good(client_options(port, "tok3n"));  // the newline is not part of the token
  good.set("k", "v");
  EXPECT_THROW(TcpStore(client_options(port, "tok3n\n")), AuthError);
  EXPECT_THROW(TcpStore(client_options(port)), AuthError);
  daemon.signal(SIGTERM);
  EXPECT_EQ(daemon.wait(), 0);
}

TEST(Daemon, BadFlagsExitTwoWithOneLine) {
  auto empty =
      std::filesystem::temp_directory_path() / ("ddp-empty-token-" + std::to_string(::getpid()));
  { std::ofstream touch(empty); }
  struct Case {
    std::vector<std::string> args;
    std::string mentions;
  };
  std::vector<Case> cases = {
      {{"--bogus"}, "--bogus"},
      {{"--port", "not-a-port"}, "--port"},
      {{"--port", "70000"}, "--port"},
      {{"--max-clients", "0"}, "max-clients"},
      {{"--max-store-mib", "0"}, "max-store-mib"},
      {{"--idle-timeout", "-1"}, "idle-timeout"},
      {{"--idle-timeout", "soon"}, "idle-timeout"},
      {{"--token-file", "/nonexistent/token"}, "/nonexistent/token"},
      {{"--token-file", empty.string()}, "empty"},
      {{"--status-port", "0", "--status-host", "0.0.0.0"}, "--status-allow-no-token"},
      {{"--status-port", "0", "--status-host", "10.1.2.3"}, "--status-host 10.1.2.3"},
  };
  for (auto& c : cases) {
    std::vector<std::string> args{daemon_path()};
    args.insert(args.end(), c.args.begin(), c.args.end());
    Child daemon(args);
    EXPECT_EQ(daemon.wait(), 2) << c.args[0];
    auto err = daemon.read_stderr();
    EXPECT_NE(err.find(c.mentions), std::string::npos) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
  std::filesystem::remove(empty);
}

// The port of the daemon's live view, from its line "live view at
// http://ADDRESS:PORT/" in `log`; 0 when there is none.
std::uint16_t live_view_port(const std::string& log) {
  const auto at = log.find("live view at http://");
  if (at == std::string::npos) return 0;
  const auto slash = log.find("/ ", at + 20);
  const auto colon = log.rfind(':', slash);
  if (slash == std::string::npos || colon == std::string::npos || colon < at) return 0;
  return static_cast<std::uint16_t>(std::atoi(log.substr(colon + 1, slash - colon - 1).c_str()));
}

TEST(Daemon, ALiveViewBeyondLoopbackWithoutATokenIsServedOnlyWhenAllowedWithAWarning) {
  // Refused: exit 2 with one line naming the flag and the way out (also in
  // BadFlagsExitTwoWithOneLine); nothing listens.
  {
    Child daemon({daemon_path(), "--host", "127.0.0.1", "--port", "0", "--status-port", "0",
                  "--status-host", "0.0.0.0"});
    EXPECT_EQ(daemon.wait(), 2);
    const std::string err = daemon.read_stderr();
    EXPECT_EQ(err,
              "ddp-rendezvous: --status-host 0.0.0.0: the live view would be served beyond "
              "loopback without a token; give --token-file (clients must then carry the token), "
              "listen on 127.0.0.1, or pass --status-allow-no-token to serve it to anyone who can "
              "reach the port\n");
  }
  // Allowed: served to anyone (here through 127.0.0.1, no token), with a warning.
  {
    Child daemon({daemon_path(), "--host", "127.0.0.1", "--port", "0", "--status-port", "0",
                  "--status-host", "0.0.0.0", "--status-allow-no-token"});
    ASSERT_NE(parse_port(daemon.first_line()), 0);
    const std::string log = daemon.stderr_until("live view at");
    EXPECT_NE(log.find("the live view listens on 0.0.0.0 beyond loopback without a token"),
              std::string::npos)
        << log;
    const std::uint16_t port = live_view_port(log);
    ASSERT_NE(port, 0) << log;
    const auto reply = http_request(port, "GET", "/livez", "", 5s);
    ASSERT_TRUE(reply.has_value());
    EXPECT_EQ(reply->rfind("HTTP/1.1 200 ", 0), 0u) << *reply;
    daemon.signal(SIGTERM);
    EXPECT_EQ(daemon.wait(), 0);
  }
  // With a token: served, the token asked of clients, no warning.
  auto path = std::filesystem::temp_directory_path() / ("ddp-token-" + std::to_string(::getpid()));
  { std::ofstream(path) << "tok3n\n"; }
  {
    Child daemon({daemon_path(), "--host", "127.0.0.1", "--port", "0", "--token-file",
                  path.string(), "--status-port", "0", "--status-host", "0.0.0.0"});
    ASSERT_NE(parse_port(daemon.first_line()), 0);
    const std::string log = daemon.stderr_until("live view at");
    EXPECT_EQ(log.find("without a token"), std::string::npos) << log;
    const std::uint16_t port = live_view_port(log);
    ASSERT_NE(port, 0) << log;
    const auto reply = http_request(port, "GET", "/livez", "", 5s);
    ASSERT_TRUE(reply.has_value());
    EXPECT_EQ(reply->rfind("HTTP/1.1 401 ", 0), 0u) << *reply;
    daemon.signal(SIGTERM);
    EXPECT_EQ(daemon.wait(), 0);
  }
  std::filesystem::remove(path);
}

TEST(Daemon, HelpExitsZero) {
  Child daemon({daemon_path(), "--help"});
  EXPECT_EQ(daemon.wait(), 0);
}

TEST(Daemon, TakenPortExitsOne) {
  auto server = start_server();
  Child daemon({daemon_path(), "--host", "127.0.0.1", "--port", std::to_string(server->port())});
  EXPECT_EQ(daemon.wait(), 1);
  EXPECT_NE(daemon.read_stderr().find("cannot listen"), std::string::npos);
}

}  // namespace
}  // namespace ddp
