// StoreServer::stats(): the figures the daemon's live view serves, read on the
// serving thread, and the timeout when that thread does not answer.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/store/tcp_store.h"
#include "ddp/store_server/store_server.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;

TEST(StoreServerStats, CountClientsKeysBytesParkedRequestsAndOperations) {
  StoreServerOptions options;
  options.token = "s3cret";
  StoreServer server(options);
  server.start();
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < 3; ++i) {
    TcpStoreOptions o;
    o.port = server.port();
    o.token = "s3cret";
    clients.push_back(std::make_unique<TcpStore>(o));
  }
  clients[0]->set("a", "12345");
  clients[0]->set("b", "x");
  clients[1]->get("a");
  clients[2]->add("n", 1);
  // A fourth client with a wrong token fails its handshake (the server's
  // proof does not check out for it, or its own proof for the server).
  TcpStoreOptions wrong;
  wrong.port = server.port();
  wrong.token = "nope";
  wrong.connect_timeout = 2s;
  EXPECT_THROW(TcpStore{wrong}, AuthError);
  // One get parks on a missing key.
  std::thread parked([&] { clients[1]->get("later", 30s); });
  StoreServerStats s;
  for (int i = 0; i < 500; ++i) {
    s = server.stats(1s);
    if (s.parked_requests == 1 && s.clients == 3) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(s.clients, 3u);
  EXPECT_GE(s.connections_total, 4u);
  EXPECT_EQ(s.failed_handshakes, 1u);
  EXPECT_EQ(s.refused_total, 0u);
  EXPECT_EQ(s.keys, 3u);
  EXPECT_EQ(s.parked_requests, 1u);
  EXPECT_GT(s.stored_bytes, 0u);
  EXPECT_EQ(s.operations["set"], 2u);
  EXPECT_EQ(s.operations["get"], 2u);
  EXPECT_EQ(s.operations["add"], 1u);
  EXPECT_EQ(s.operations.count("hello"), 0u);  // the handshake is not counted
  clients[0]->set("later", "now");
  parked.join();
  EXPECT_EQ(server.stats(1s).parked_requests, 0u);
  server.stop();
}

TEST(StoreServerStats, AServerThatDoesNotServeTimesOut) {
  StoreServer server(StoreServerOptions{});  // never started
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(server.stats(200ms), TimeoutError);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms);
}

}  // namespace
}  // namespace ddp
