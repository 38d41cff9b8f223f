// The retry record (store_server/src/client_registry.h): a retried add,
// compare_set, append or delete_key is answered from the record, never applied
// twice, however many other clients come and go. The record's rules are
// tested with explicit time points (no real clock); the server tests lose a
// reply on purpose (DroppingProxy) and let other clients mutate before the
// retry arrives.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>

#include "client_registry.h"
#include "ddp/common/error.h"
#include "server_test_util.h"

namespace ddp {
namespace {

using namespace ddp::test;
using server::ClientRegistry;
using TimePoint = ClientRegistry::Clock::time_point;

constexpr std::uint64_t kRetry = protocol::kRetryFlag;

// The status of the one reply frame in `out`.
Status reply_status(const std::string& out, std::string* message = nullptr) {
  std::string_view input = out;
  protocol::FrameParser parser(1 << 20);
  EXPECT_EQ(parser.consume(input), protocol::FrameParser::State::kGood);
  protocol::Reply reply;
  EXPECT_TRUE(protocol::decode_reply(Op::kAdd, parser.payload(), reply).ok());
  if (message) *message = std::string(reply.message);
  return reply.status;
}

ClientRegistry::Options small(std::size_t max_idle, std::chrono::milliseconds window) {
  ClientRegistry::Options options;
  options.max_idle = max_idle;
  options.idle_window = window;
  return options;
}

TEST(ClientRegistry, ReplaysTheLastReplyAndRefusesOlderRequests) {
  ClientRegistry registry;
  const TimePoint t0{};
  registry.connected("client-a", 1, t0);
  std::string out;
  EXPECT_FALSE(registry.replay("client-a", 1, 1, out));
  registry.record("client-a", 1, "reply-1");
  EXPECT_TRUE(registry.replay("client-a", 1, 1 | kRetry, out));
  EXPECT_EQ(out, "reply-1");
  EXPECT_FALSE(registry.replay("client-a", 1, 2, out)) << "a new request is applied";
  registry.record("client-a", 2, "reply-2");
  out.clear();
  EXPECT_TRUE(registry.replay("client-a", 1, 1, out));
  EXPECT_EQ(reply_status(out), Status::kStaleRequest);
  // Too large to keep: a retry is told it was applied and its reply is lost.
  registry.connected("client-b", 2, t0);
  registry.record("client-b", 1, std::string(ClientRegistry::kMaxReplayBytes + 1, 'r'));
  out.clear();
  EXPECT_TRUE(registry.replay("client-b", 2, 1 | kRetry, out));
  EXPECT_NE(out.find("too large to replay"), std::string::npos);
}

TEST(ClientRegistry, AConnectedClientIsNeverForgottenWhateverOthersDo) {
  // The old record kept 16,384 clients, least recently used out: that many
  // other clients made it apply a retry twice.
  ClientRegistry registry(small(2, std::chrono::minutes(10)));
  TimePoint now{};
  registry.connected("steady", 1, now);
  registry.record("steady", 7, "reply-7");
  for (int i = 0; i < 100; ++i) {
    const std::string other = "other-" + std::to_string(i);
    now += std::chrono::milliseconds(1);
    registry.connected(other, 100 + i, now);
    registry.record(other, 1, "x");
    registry.disconnected(other, now);
  }
  EXPECT_EQ(registry.idle(), 2u) << "idle records are bounded";
  std::string out;
  EXPECT_TRUE(registry.replay("steady", 1, 7 | kRetry, out));
  EXPECT_EQ(out, "reply-7");
}

TEST(ClientRegistry, AnIdleClientIsRememberedWithinTheWindow) {
  const auto window = std::chrono::seconds(60);
  ClientRegistry registry(small(16, window));
  const TimePoint t0{};
  registry.connected("c", 1, t0);
  registry.record("c", 3, "reply-3");
  registry.disconnected("c", t0);
  registry.connected("c", 2, t0 + window - std::chrono::milliseconds(1));
  std::string out;
  EXPECT_TRUE(registry.replay("c", 2, 3 | kRetry, out)) << "the lost reply is replayed";
  EXPECT_EQ(out, "reply-3");
  // A retry of a request the server never received: known history, applied.
  EXPECT_FALSE(registry.replay("c", 2, 4 | kRetry, out));
}

TEST(ClientRegistry, ARetryOfAForgottenClientIsRefusedNotApplied) {
  const auto window = std::chrono::seconds(60);
  ClientRegistry registry(small(16, window));
  const TimePoint t0{};
  registry.connected("c", 1, t0);
  registry.record("c", 3, "reply-3");
  registry.disconnected("c", t0);
  // Back after the window: a new record, made by this connection.
  registry.connected("c", 2, t0 + window + std::chrono::milliseconds(1));
  std::string out, message;
  EXPECT_TRUE(registry.replay("c", 2, 3 | kRetry, out)) << "the retry must not be applied";
  EXPECT_EQ(reply_status(out, &message), Status::kStaleRequest);
  EXPECT_NE(message.find("not applied again"), std::string::npos) << message;
  // A new request (no retry flag) is applied as usual.
  EXPECT_FALSE(registry.replay("c", 2, 4, out));
}

TEST(ClientRegistry, IdleRecordsAreBoundedOldestFirst) {
  ClientRegistry registry(small(3, std::chrono::minutes(10)));
  TimePoint now{};
  for (int i = 0; i < 5; ++i) {
    const std::string id = "c" + std::to_string(i);
    registry.connected(id, static_cast<std::uint64_t>(i + 1), now);
    registry.record(id, 1, "r");
    registry.disconnected(id, now);
    now += std::chrono::milliseconds(1);
  }
  EXPECT_EQ(registry.size(), 3u);
  // c0 was forgotten: on a new connection its retry is refused.
  registry.connected("c0", 10, now);
  std::string out;
  EXPECT_TRUE(registry.replay("c0", 10, 1 | kRetry, out));
  EXPECT_EQ(reply_status(out), Status::kStaleRequest);
  // c4 is still known: its retry is answered from the record.
  registry.connected("c4", 11, now);
  out.clear();
  EXPECT_TRUE(registry.replay("c4", 11, 1 | kRetry, out));
  EXPECT_EQ(out, "r");
}

TEST(ClientRegistry, AClientWithSeveralConnectionsStaysUntilTheLastCloses) {
  ClientRegistry registry(small(0, std::chrono::milliseconds(0)));
  const TimePoint t0{};
  registry.connected("c", 1, t0);
  registry.connected("c", 2, t0);
  registry.record("c", 1, "r");
  registry.disconnected("c", t0);
  EXPECT_EQ(registry.size(), 1u);
  registry.disconnected("c", t0 + std::chrono::seconds(1));
  EXPECT_EQ(registry.size(), 0u) << "no idle record is kept with max_idle 0";
}

// Raw clients, each with a client id of its own, that add once and leave.
void mutate_as_other_clients(std::uint16_t port, int count) {
  for (int i = 0; i < count; ++i) {
    RawClient raw(port);
    Request hello = op_request(Op::kHello);
    const std::string nonce = protocol::make_nonce();
    const std::string id = protocol::make_client_id();
    hello.nonce = nonce;
    hello.client_id = id;
    raw.send(hello);
    ASSERT_EQ(raw.read_reply(Op::kHello).status, Status::kOk);
    Request add = op_request(Op::kAdd);
    add.request_id = 1;
    add.key = "others";
    add.delta = 1;
    raw.send(add);
    ASSERT_EQ(raw.read_reply(Op::kAdd).status, Status::kOk);
  }
}

StoreServerOptions small_record(std::size_t clients) {
  StoreServerOptions options;
  options.retry_record_clients = clients;
  return options;
}

TEST(ClientRegistry, ARetryAfterOtherClientsComeAndGoIsAnsweredFromTheRecord) {
  auto server = start_server(small_record(64));
  DroppingProxy proxy(server->port());
  TcpStoreOptions options = client_options(proxy.port());
  options.timeout = 60s;
  TcpStore store(options);
  TcpStore direct(client_options(server->port()));
  proxy.hold_after_drop();
  proxy.drop_reply_of(Op::kAdd);
  auto added = std::async(std::launch::async, [&] { return store.add("counter", 1); });
  ASSERT_TRUE(eventually([&] { return proxy.drops() == 1; }, 10s));
  mutate_as_other_clients(server->port(), 40);  // fewer than the record holds
  proxy.release();
  EXPECT_EQ(added.get(), 1) << "the retried add was applied twice";
  EXPECT_EQ(direct.get("counter", 1s), "1");
}

TEST(ClientRegistry, ARetryOfAClientForgottenUnderAFloodIsRefusedNotAppliedTwice) {
  // Before: 16,384 records, least recently used out; a flood of new clients
  // pushed out the one whose reply was lost, and its retry was applied again.
  auto server = start_server(small_record(64));
  DroppingProxy proxy(server->port());
  TcpStoreOptions options = client_options(proxy.port());
  options.timeout = 60s;
  TcpStore store(options);
  TcpStore direct(client_options(server->port()));
  proxy.hold_after_drop();
  proxy.drop_reply_of(Op::kAdd);
  auto added = std::async(std::launch::async, [&] { return store.add("counter", 1); });
  ASSERT_TRUE(eventually([&] { return proxy.drops() == 1; }, 10s));
  mutate_as_other_clients(server->port(), 100);  // more than the record holds
  proxy.release();
  try {
    added.get();
    ADD_FAILURE() << "a retry the server cannot check was applied";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("not applied again"), std::string::npos) << e.what();
  }
  EXPECT_EQ(direct.get("counter", 1s), "1") << "the add was applied twice";
  EXPECT_EQ(direct.get("others", 1s), "100");
}

}  // namespace
}  // namespace ddp
