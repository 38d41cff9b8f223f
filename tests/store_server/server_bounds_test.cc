// The store server against the second round of hostile clients: a client
// that parks a get, floods more than the backlog bound behind it and closes
// (its session must still be released), and requests of many empty keys
// (a few bytes each on the wire, a lookup and a view each on the server),
// which must be refused by count before the server does work per key.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "ddp/common/error.h"
#include "server_test_util.h"

namespace ddp {
namespace {

using namespace ddp::test;

std::uint64_t resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// A wait/multi_get frame of `count` empty keys, encoded by hand: the codec's
// encoder would refuse nothing, but building millions of views here would
// measure the test, not the server.
std::string empty_keys_frame(Op op, std::uint32_t count, std::uint64_t timeout_ms) {
  std::string payload;
  payload.push_back(static_cast<char>(op));
  for (int i = 0; i < 8; ++i) payload.push_back(static_cast<char>((timeout_ms >> (8 * i)) & 0xff));
  for (int i = 0; i < 4; ++i) payload.push_back(static_cast<char>((count >> (8 * i)) & 0xff));
  payload.append(static_cast<std::size_t>(count) * 4, '\0');  // each key: length 0
  std::string frame;
  const auto length = static_cast<std::uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) frame.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  return frame + payload;
}

TEST(ServerBounds, AParkedClientThatFloodsPastTheBacklogAndClosesIsReleased) {
  // Before: the session stopped reading past 1 MiB of backlog, so its EOF was
  // never seen: 1,000 such clients left 928 sessions and 1.27 GiB behind.
  auto server = start_server();
  const std::string flood(1536 * 1024, 'x');  // 1.5 MiB behind the parked get
  for (int i = 0; i < 20; ++i) {
    RawClient raw(server->port());
    raw.handshake();
    Request get = op_request(Op::kGet);
    get.key = "never-set";
    get.timeout_ms = protocol::kNoTimeout;
    raw.send(get);
    raw.send_bytes(flood);
    raw.close();
  }
  EXPECT_TRUE(eventually([&] { return server->num_clients() == 0; }, 10s))
      << server->num_clients() << " session(s) of parked clients that left are still held";
  // A legitimate large set still fits (before: "store full").
  TcpStore store(client_options(server->port()));
  store.set("large", std::string(3 << 20, 'v'));
  EXPECT_EQ(store.get("large", 1s).size(), 3u << 20);
}

TEST(ServerBounds, AParkedClientPastTheBacklogIsToldAndClosed) {
  auto server = start_server();
  RawClient raw(server->port());
  raw.handshake();
  Request get = op_request(Op::kGet);
  get.key = "never-set";
  get.timeout_ms = protocol::kNoTimeout;
  raw.send(get);
  raw.send_bytes(std::string(1536 * 1024, 'x'));
  raw.expect_error_and_close(Status::kStoreFull, Op::kGet);
  expect_still_serving(server->port());
}

TEST(ServerBounds, AParkedClientThatLeavesQuietlyIsReleased) {
  auto server = start_server();
  {
    RawClient raw(server->port());
    raw.handshake();
    Request get = op_request(Op::kGet);
    get.key = "never-set";
    get.timeout_ms = protocol::kNoTimeout;
    raw.send(get);
    raw.send_bytes(std::string(4 * 1024, 'x'));  // under the bound
  }
  EXPECT_TRUE(eventually([&] { return server->num_clients() == 0; }, 10s));
}

TEST(ServerBounds, TooManyKeysInOneRequestIsInvalidArgumentAndTheConnectionGoesOn) {
  auto server = start_server();
  RawClient raw(server->port());
  raw.handshake();
  for (Op op : {Op::kWait, Op::kMultiGet}) {
    raw.send_bytes(empty_keys_frame(op, protocol::kMaxKeysPerRequest + 1, 0));
    auto reply = raw.read_reply(op);
    EXPECT_EQ(reply.status, Status::kInvalidArgument)
        << protocol::to_string(reply.status) << ": " << reply.message;
    EXPECT_NE(std::string(reply.message).find(std::to_string(protocol::kMaxKeysPerRequest)),
              std::string::npos)
        << reply.message;
  }
  // The connection is still usable.
  Request num = op_request(Op::kNumKeys);
  raw.send(num);
  EXPECT_EQ(raw.read_reply(Op::kNumKeys).status, Status::kOk);
}

TEST(ServerBounds, AHugeRequestOfEmptyKeysCostsNeitherMemoryNorTime) {
  // Before: a 191 MiB wait of empty keys with timeout 0 peaked at 3.8 GiB and
  // held the server's only thread for 31.6 s. Here 32 MiB (8 million keys),
  // refused from its first 13 bytes.
  auto server = start_server();
  TcpStore healthy(client_options(server->port()));
  healthy.set("k", "v");
  const std::string frame = empty_keys_frame(Op::kWait, 8u << 20, 0);
  const std::uint64_t before = resident_bytes();
  RawClient raw(server->port());
  raw.handshake();
  const auto start = Clock::now();
  raw.send_bytes(frame);
  auto reply = raw.read_reply(Op::kWait);
  const auto took = Clock::now() - start;
  EXPECT_EQ(reply.status, Status::kInvalidArgument) << std::string(reply.message);
  EXPECT_TRUE(raw.closed_by_server()) << "a frame refused by its head ends its connection";
  EXPECT_LT(took, 5s);
  // Refused from its first bytes: neither assembled nor read to its end.
  EXPECT_LT(resident_bytes() - std::min(resident_bytes(), before), 16ull << 20);
  const auto get_start = Clock::now();
  EXPECT_EQ(healthy.get("k", 1s), "v");
  EXPECT_LT(Clock::now() - get_start, 1s);
}

TEST(ServerBounds, ATimeoutNamingManyKeysStaysShort) {
  auto server = start_server();
  RawClient raw(server->port());
  raw.handshake();
  raw.send_bytes(empty_keys_frame(Op::kWait, protocol::kMaxKeysPerRequest, 0));
  auto reply = raw.read_reply(Op::kWait);
  EXPECT_EQ(reply.status, Status::kTimeout);
  EXPECT_LT(reply.message.size(), 8192u) << "the message names every key";
  EXPECT_NE(std::string(reply.message).find("more)"), std::string::npos) << reply.message;
}

TEST(ServerBounds, TheClientSplitsLongKeyListsIntoRequestsTheServerTakes) {
  auto server = start_server();
  TcpStore store(client_options(server->port()));
  const std::size_t n = 3 * protocol::kMaxKeysPerRequest + 7;
  std::vector<std::string> keys, values;
  for (std::size_t i = 0; i < n; ++i) {
    keys.push_back("k" + std::to_string(i));
    values.push_back("v" + std::to_string(i));
  }
  store.multi_set(keys, values);
  EXPECT_EQ(store.multi_get(keys, 1s), values);
  EXPECT_TRUE(store.check(keys));
  store.wait(keys, 1s);
  keys.push_back("missing");
  EXPECT_FALSE(store.check(keys));
  EXPECT_THROW(store.multi_get(keys, 100ms), TimeoutError);
}

TEST(ServerBounds, OneClientsPipelinedRequestsDoNotHoldTheServerFromOthers) {
  // Requests of the most keys, pipelined without reading the replies: each
  // turn of the server's thread serves a bounded part of them, so another
  // client's get is answered between turns, not after all of them.
  auto server = start_server();
  TcpStore healthy(client_options(server->port()));
  healthy.set("k", "v");
  RawClient raw(server->port());
  raw.handshake();
  std::string burst;
  for (int i = 0; i < 64; ++i) {
    Request wait = op_request(Op::kWait);
    wait.timeout_ms = 0;
    std::vector<std::string> names(protocol::kMaxKeysPerRequest, "absent");
    wait.keys.assign(names.begin(), names.end());
    protocol::encode_request(burst, wait);
  }
  std::thread sender([&] { raw.send_bytes(burst); });
  double worst = 0;
  for (int i = 0; i < 50; ++i) {
    const auto start = Clock::now();
    EXPECT_EQ(healthy.get("k", 1s), "v");
    worst = std::max(worst, std::chrono::duration<double>(Clock::now() - start).count());
  }
  sender.join();
  EXPECT_LT(worst, 0.5) << "a get waited behind another client's whole burst";
}

}  // namespace
}  // namespace ddp
