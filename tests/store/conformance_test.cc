// One conformance suite for every Store implementation (c10d's approach; the
// typed tests are in conformance_suite.h): it runs here against MemoryStore,
// PrefixStore over MemoryStore, TcpStore against an in-process StoreServer on
// port 0, and PrefixStore over TcpStore. TcpStore-only behaviour (1,000 connections, a client killed while
// waiting, the server stopped under waiting clients, the token) follows in
// plain TESTs at the end of the file.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "conformance_suite.h"
#include "ddp/common/error.h"
#include "ddp/store/memory_store.h"
#include "ddp/store/prefix_store.h"
#include "ddp/store/store.h"
#include "ddp/store/tcp_store.h"
#include "ddp/store_server/store_server.h"

namespace ddp::conformance {
namespace {

// ---------------------------------------------------------------------------
// Environments: each owns "a store" and hands out clients of it. Two clients
// of one environment see the same keys; for TcpStore every client is its own
// connection, so blocking tests really cross connections.

struct MemoryEnv {
  static constexpr const char* kName = "MemoryStore";
  // What the client's keys look like in the unprefixed store below it.
  static constexpr const char* kKeyPrefix = "";

  std::shared_ptr<MemoryStore> base = std::make_shared<MemoryStore>(kTestTimeout);

  std::shared_ptr<Store> client() { return base; }
  std::shared_ptr<Store> raw_client() { return base; }
};

struct PrefixMemoryEnv {
  static constexpr const char* kName = "PrefixStoreOverMemoryStore";
  static constexpr const char* kKeyPrefix = "job/round0/";

  std::shared_ptr<MemoryStore> base = std::make_shared<MemoryStore>(kTestTimeout);

  std::shared_ptr<Store> client() { return std::make_shared<PrefixStore>("job/round0", base); }
  std::shared_ptr<Store> raw_client() { return base; }
};

std::shared_ptr<TcpStore> connect(std::uint16_t port, const std::string& token = "",
                                  Store::Duration connect_timeout = 5s) {
  TcpStoreOptions options;
  options.port = port;
  options.token = token;
  options.connect_timeout = connect_timeout;
  options.timeout = kTestTimeout;
  return std::make_shared<TcpStore>(options);
}

std::unique_ptr<StoreServer> start_server(const std::string& token = "") {
  StoreServerOptions options;
  options.port = 0;
  options.token = token;
  auto server = std::make_unique<StoreServer>(options);
  server->start();
  return server;
}

struct TcpEnv {
  static constexpr const char* kName = "TcpStore";
  static constexpr const char* kKeyPrefix = "";

  std::unique_ptr<StoreServer> server = start_server();

  std::shared_ptr<Store> client() { return connect(server->port()); }
  std::shared_ptr<Store> raw_client() { return connect(server->port()); }
};

struct PrefixTcpEnv {
  static constexpr const char* kName = "PrefixStoreOverTcpStore";
  static constexpr const char* kKeyPrefix = "job/round0/";

  std::unique_ptr<StoreServer> server = start_server();

  std::shared_ptr<Store> client() {
    return std::make_shared<PrefixStore>("job/round0", connect(server->port()));
  }
  std::shared_ptr<Store> raw_client() { return connect(server->port()); }
};

using Envs = ::testing::Types<MemoryEnv, PrefixMemoryEnv, TcpEnv, PrefixTcpEnv>;

}  // namespace
}  // namespace ddp::conformance

#include "conformance_suite_tests.h"

namespace ddp::conformance {
namespace {

// ---------------------------------------------------------------------------
// TcpStore and StoreServer only.

void raise_fd_limit(rlim_t wanted) {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_cur >= wanted) return;
  if (limit.rlim_max < wanted) {
    GTEST_SKIP() << "RLIMIT_NOFILE hard limit " << limit.rlim_max << " < " << wanted;
  }
  limit.rlim_cur = wanted;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &limit), 0);
}

// Polls `condition` until it holds or `timeout` passes.
bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  auto deadline = SteadyClock::now() + timeout;
  while (!condition()) {
    if (SteadyClock::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

TEST(TcpStore, ServerBindsAPortAndCountsClients) {
  auto server = start_server();
  EXPECT_NE(server->port(), 0);
  EXPECT_EQ(server->options().host, "127.0.0.1");
  EXPECT_EQ(server->num_clients(), 0u);
  {
    auto a = connect(server->port());
    auto b = connect(server->port());
    EXPECT_TRUE(eventually([&] { return server->num_clients() == 2; }, 2s))
        << "num_clients=" << server->num_clients();
    EXPECT_EQ(a->options().port, server->port());
  }
  EXPECT_TRUE(eventually([&] { return server->num_clients() == 0; }, 2s))
      << "closed clients still counted: " << server->num_clients();
}

TEST(TcpStore, ThousandConcurrentClients) {
  constexpr int kClients = 1000;
  constexpr int kConnectThreads = 4;
  raise_fd_limit(4 * kClients + 256);
  if (testing::Test::IsSkipped()) return;
  auto server = start_server();
  auto start = SteadyClock::now();

  // Connect from several threads at once: the server must admit a burst.
  std::vector<std::shared_ptr<TcpStore>> clients(kClients);
  {
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (int t = 0; t < kConnectThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = t; i < kClients; i += kConnectThreads) {
          try {
            clients[i] = connect(server->port(), "", 20s);
          } catch (const std::exception& e) {
            if (failures++ == 0) ADD_FAILURE() << "client " << i << ": " << e.what();
          }
        }
      });
    }
    for (auto& thread : threads) thread.join();
    ASSERT_EQ(failures.load(), 0);
  }
  double connect_seconds = seconds_since(start);
  EXPECT_TRUE(eventually([&] { return server->num_clients() == kClients; }, 5s))
      << "num_clients=" << server->num_clients();

  // Every client blocks at once on a barrier (a thread each: TcpStore calls
  // are synchronous), so the server holds 1,000 parked waits.
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  threads.reserve(kClients);
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        auto& store = *clients[i];
        store.set("client/" + std::to_string(i), std::to_string(i * 7));
        if (store.add("arrived", 1) == kClients) store.set("go", "1");
        store.wait({"go"}, 20s);
        int neighbour = (i + 1) % kClients;
        if (store.get("client/" + std::to_string(neighbour)) != std::to_string(neighbour * 7)) {
          ++errors;
        }
      } catch (const std::exception& e) {
        if (errors++ == 0) ADD_FAILURE() << "client " << i << ": " << e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(clients[0]->add("arrived", 0), kClients);
  EXPECT_EQ(clients[0]->num_keys(), kClients + 2);
  double total_seconds = seconds_since(start);
  EXPECT_LT(total_seconds, 30.0);
  RecordProperty("connect_seconds", std::to_string(connect_seconds));
  RecordProperty("total_seconds", std::to_string(total_seconds));

  clients.clear();
  EXPECT_TRUE(eventually([&] { return server->num_clients() == 0; }, 5s))
      << "num_clients=" << server->num_clients();
}

// Reads exactly one byte; false on EOF or error.
bool read_byte(int fd, char& byte) {
  for (;;) {
    ssize_t n = ::read(fd, &byte, 1);
    if (n == 1) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

TEST(TcpStore, ClientKilledWhileWaitingIsCleanedUp) {
  // Fork before the server exists so the child starts with only this thread;
  // it learns the port through a pipe.
  int to_child[2];
  int to_parent[2];
  ASSERT_EQ(pipe2(to_child, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(to_parent, O_CLOEXEC), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(to_child[1]);
    ::close(to_parent[0]);
    std::uint16_t port = 0;
    if (::read(to_child[0], &port, sizeof port) != static_cast<ssize_t>(sizeof port)) _exit(2);
    try {
      auto store = connect(port);
      store->set("child/ready", "1");
      char ready = 'r';
      if (::write(to_parent[1], &ready, 1) != 1) _exit(3);
      store->get("never-set", 60s);  // blocks until killed
    } catch (...) {
      _exit(4);
    }
    _exit(5);
  }
  ::close(to_child[0]);
  ::close(to_parent[1]);
  auto cleanup = [&] {
    if (child > 0) {
      ::kill(child, SIGKILL);
      ::waitpid(child, nullptr, 0);
      child = -1;
    }
  };

  auto server = start_server();
  std::uint16_t port = server->port();
  ASSERT_EQ(::write(to_child[1], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  char ready = 0;
  bool got = read_byte(to_parent[0], ready);
  ::close(to_child[1]);
  ::close(to_parent[0]);
  if (!got) cleanup();
  ASSERT_TRUE(got) << "child did not connect";

  auto observer = connect(port);
  EXPECT_EQ(observer->get("child/ready"), "1");
  EXPECT_TRUE(eventually([&] { return server->num_clients() == 2; }, 2s));
  // Give the child time to send its get and have it parked.
  std::this_thread::sleep_for(100ms);
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, WNOHANG), 0) << "child left get early, status " << status;

  ASSERT_EQ(::kill(child, SIGKILL), 0);
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  child = -1;
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  EXPECT_TRUE(eventually([&] { return server->num_clients() == 1; }, 3s))
      << "dead client still counted: num_clients=" << server->num_clients();
  // The server goes on serving, including the key the dead client waited for.
  auto waiter = connect(port);
  auto reader = std::async(std::launch::async, [&] { return waiter->get("never-set", 10s); });
  ASSERT_EQ(reader.wait_for(kStillBlocked), std::future_status::timeout);
  observer->set("never-set", "now set");
  ASSERT_EQ(reader.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(reader.get(), "now set");
  EXPECT_EQ(observer->add("n", 1), 1);
}

TEST(TcpStore, ServerStoppedWhileClientsWaitFailsThemQuickly) {
  auto server = start_server();
  constexpr int kWaiters = 4;
  std::vector<std::shared_ptr<TcpStore>> clients;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(connect(server->port()));
  auto idle = connect(server->port());

  struct Outcome {
    std::optional<ErrorKind> kind;
    std::string what;
    SteadyClock::time_point at;
  };
  std::vector<std::future<Outcome>> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(std::async(std::launch::async, [&, i] {
      Outcome outcome;
      try {
        if (i % 2 == 0) {
          clients[i]->get("never", 30s);
        } else {
          clients[i]->wait({"never", "nor-this"}, 30s);
        }
      } catch (const Error& e) {
        outcome.kind = e.kind();
        outcome.what = e.what();
      } catch (const std::exception& e) {
        outcome.what = std::string("not a ddp::Error: ") + e.what();
      }
      outcome.at = SteadyClock::now();
      return outcome;
    }));
  }
  for (auto& w : waiters) ASSERT_EQ(w.wait_for(kStillBlocked), std::future_status::timeout);

  auto stop_at = SteadyClock::now();
  server->stop();
  EXPECT_LT(seconds_since(stop_at), 1.0) << "stop() took long";
  for (int i = 0; i < kWaiters; ++i) {
    ASSERT_EQ(waiters[i].wait_for(2s), std::future_status::ready)
        << "waiter " << i << " still blocked 2 s after stop()";
    Outcome outcome = waiters[i].get();
    ASSERT_TRUE(outcome.kind.has_value()) << "waiter " << i << ": " << outcome.what;
    EXPECT_TRUE(*outcome.kind == ErrorKind::kNetwork || *outcome.kind == ErrorKind::kShutdown)
        << "waiter " << i << " got " << to_string(*outcome.kind) << ": " << outcome.what;
    EXPECT_LT(std::chrono::duration<double>(outcome.at - stop_at).count(), 1.0)
        << "waiter " << i << " failed late";
  }
  // A client that was idle at stop() fails promptly on its next call.
  auto call_at = SteadyClock::now();
  try {
    idle->set("k", "v");
    idle->get("k", 5s);
    ADD_FAILURE() << "a call on a stopped server succeeded";
  } catch (const Error& e) {
    EXPECT_TRUE(e.kind() == ErrorKind::kNetwork || e.kind() == ErrorKind::kShutdown)
        << to_string(e.kind()) << ": " << e.what();
  }
  EXPECT_LT(seconds_since(call_at), 1.0);
  server->stop();  // idempotent
}

TEST(TcpStore, ConnectingToNothingFailsAfterTheConnectTimeout) {
  std::uint16_t port = 0;
  {
    auto server = start_server();
    port = server->port();
  }
  auto start = SteadyClock::now();
  try {
    connect(port, "", 300ms);
    FAIL() << "connected to a stopped server";
  } catch (const Error& e) {
    EXPECT_TRUE(e.kind() == ErrorKind::kNetwork || e.kind() == ErrorKind::kTimeout)
        << to_string(e.kind()) << ": " << e.what();
    EXPECT_THAT(e.what(), HasSubstr(std::to_string(port)));
  }
  double elapsed = seconds_since(start);
  EXPECT_GE(elapsed, 0.25) << "gave up before the connect timeout";
  EXPECT_LT(elapsed, 2.0);
}

TEST(TcpStore, ConnectRetriesUntilTheServerComesUp) {
  std::uint16_t port = 0;
  {
    auto probe = start_server();
    port = probe->port();
  }
  auto client = std::async(std::launch::async, [&] { return connect(port, "", 5s); });
  std::this_thread::sleep_for(200ms);
  StoreServerOptions options;
  options.port = port;
  std::unique_ptr<StoreServer> server;
  try {
    server = std::make_unique<StoreServer>(options);
  } catch (const NetworkError& e) {
    client.wait();
    GTEST_SKIP() << "port " << port << " was taken meanwhile: " << e.what();
  }
  server->start();
  ASSERT_EQ(client.wait_for(5s), std::future_status::ready);
  auto store = client.get();
  store->set("k", "v");
  EXPECT_EQ(store->get("k"), "v");
}

TEST(TcpStore, ServerRunsOnTheCallingThreadUntilStopped) {
  StoreServerOptions options;
  StoreServer server(options);
  std::thread serving([&] { server.run(); });
  {
    auto client = connect(server.port());
    client->set("k", "v");
    EXPECT_EQ(client->get("k"), "v");
  }
  server.stop();
  serving.join();  // run() returned
  EXPECT_THROW(connect(server.port(), "", 200ms), Error);
}

TEST(TcpStore, BindingAPortInUseIsNetworkErrorNamingTheAddress) {
  auto first = start_server();
  StoreServerOptions options;
  options.port = first->port();
  try {
    StoreServer second(options);
    FAIL() << "bound a port that is in use";
  } catch (const NetworkError& e) {
    EXPECT_THAT(e.what(), HasSubstr(std::to_string(first->port())));
  }
}

TEST(TcpStore, OversizedKeyOrValueIsInvalidArgumentAndTheConnectionGoesOn) {
  StoreServerOptions options;
  options.max_key_size = 16;
  options.max_value_size = 1024;
  StoreServer server(options);
  server.start();
  auto client = connect(server.port());
  EXPECT_THROW(client->set(std::string(17, 'k'), "v"), InvalidArgument);
  EXPECT_THROW(client->set("k", std::string(1025, 'v')), InvalidArgument);
  EXPECT_THROW(client->get(std::string(17, 'k'), 1s), InvalidArgument);
  client->set(std::string(16, 'k'), std::string(1024, 'v'));
  EXPECT_EQ(client->get(std::string(16, 'k')), std::string(1024, 'v'));
}

TEST(TcpStore, ClientsBeyondMaxClientsAreRefused) {
  StoreServerOptions options;
  options.max_clients = 2;
  StoreServer server(options);
  server.start();
  auto a = connect(server.port());
  auto b = connect(server.port());
  try {
    connect(server.port(), "", 300ms);
    ADD_FAILURE() << "a third client was admitted with max_clients=2";
  } catch (const Error& e) {
    EXPECT_TRUE(e.kind() == ErrorKind::kNetwork || e.kind() == ErrorKind::kTimeout)
        << to_string(e.kind()) << ": " << e.what();
  }
  a->set("k", "v");
  EXPECT_EQ(b->get("k"), "v");
  a.reset();
  EXPECT_TRUE(eventually([&] { return server.num_clients() == 1; }, 2s));
  auto c = connect(server.port(), "", 2s);
  EXPECT_EQ(c->get("k"), "v");
}

TEST(TcpStore, IdleConnectionsAreClosedButBlockedOnesAreNotAndClientsReconnect) {
  StoreServerOptions options;
  options.idle_timeout = 400ms;
  StoreServer server(options);
  server.start();
  auto idle = connect(server.port());
  auto blocked = connect(server.port());
  auto setter = connect(server.port());
  auto reader = std::async(std::launch::async, [&] { return blocked->get("late", 5s); });
  // setter stays busy, idle sends nothing, blocked waits past the idle timeout.
  for (int i = 0; i < 14; ++i) {
    std::this_thread::sleep_for(50ms);
    setter->add("ticks", 1);
  }
  setter->set("late", "v");
  ASSERT_EQ(reader.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(reader.get(), "v") << "a client blocked in get was closed as idle";
  EXPECT_EQ(setter->add("ticks", 0), 14);
  EXPECT_TRUE(eventually([&] { return server.num_clients() == 2; }, 2s))
      << "idle client not closed: num_clients=" << server.num_clients();
  // The server closed the idle connection; the client's next calls reconnect
  // (handshake again) and work, as a long-lived agent's or worker's must.
  idle->set("k", "v");
  EXPECT_EQ(idle->get("k", 5s), "v");
  EXPECT_EQ(idle->add("after-reconnect", 5), 5);
  EXPECT_EQ(server.num_clients(), 3u);
}

TEST(TcpStore, TokenRightWorksWrongOrMissingIsAuthError) {
  auto server = start_server("s3cret-token");
  auto good = connect(server->port(), "s3cret-token");
  good->set("k", "v");
  EXPECT_EQ(good->get("k"), "v");

  try {
    connect(server->port(), "wrong-token", 2s);
    ADD_FAILURE() << "a wrong token was accepted";
  } catch (const AuthError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kAuth);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong token: expected AuthError, got " << e.what();
  }
  try {
    connect(server->port(), "", 2s);
    ADD_FAILURE() << "a missing token was accepted";
  } catch (const AuthError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kAuth);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "missing token: expected AuthError, got " << e.what();
  }
  // Rejected clients are gone and the authenticated one goes on.
  EXPECT_TRUE(eventually([&] { return server->num_clients() == 1; }, 2s))
      << "num_clients=" << server->num_clients();
  EXPECT_EQ(good->add("n", 1), 1);
  auto second = connect(server->port(), "s3cret-token");
  EXPECT_EQ(second->get("k"), "v");
}

}  // namespace
}  // namespace ddp::conformance
