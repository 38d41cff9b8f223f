// The etcd client's transport (store_etcd/src/etcd_http.h) against what a
// peer can send: base64 that is not padded (a heap overflow before: decode
// wrote past the string), replies over the size limit, endless bodies and
// watch messages, JSON nested too deep, hostile field types; a watch stream
// whose member froze (SIGSTOP: the stream stays open and says nothing); a
// watch stopped while it connects; and the add/append markers, which must
// not outlive their client in etcd.
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ddp/common/error.h"
#include "ddp/store_etcd/etcd_store.h"
#include "etcd_cluster.h"
#include "etcd_http.h"
#include "etcd_watch.h"
#include "net_util.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using etcd::BadReply;
using etcd::Connection;
using etcd::Json;
using ::testing::HasSubstr;
using SteadyClock = std::chrono::steady_clock;

double seconds_since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// ---------------------------------------------------------------------------
// base64

TEST(EtcdBase64, PaddedTextRoundTripsForEveryLength) {
  std::string bytes;
  for (int n = 0; n < 40; ++n) {
    const std::string text = etcd::base64_encode(bytes);
    EXPECT_TRUE(etcd::is_padded_base64(text)) << text;
    EXPECT_EQ(etcd::base64_decode(text), bytes) << text;
    bytes.push_back(static_cast<char>(n * 37 + 200));
  }
  EXPECT_EQ(etcd::base64_decode("aGVsbG8="), "hello");
}

TEST(EtcdBase64, UnpaddedOrMalformedTextIsRefusedNotDecodedPastTheEnd) {
  // Before: "aGVsbG8" decoded to "hel\0\0", the decoder writing two bytes past
  // its buffer (AddressSanitizer: heap-buffer-overflow).
  for (const char* text : {"aGVsbG8", "aGVsbA", "a", "ab=", "a===", "====", "ab=c",
                           "aGVs bG8=", "aGVs\nbG8=", "aGVsbG8*", "YQ==YQ=="}) {
    EXPECT_FALSE(etcd::is_padded_base64(text)) << text;
    EXPECT_THROW(etcd::base64_decode(text), ProtocolError) << text;
  }
}

// ---------------------------------------------------------------------------
// Replies

etcd::HttpReply ok_reply(std::string body) { return {200, std::move(body)}; }

TEST(EtcdReplies, AnUnpaddedValueIsABadReplyNamingTheEndpoint) {
  const std::string body =
      R"({"header":{"cluster_id":"1","revision":"5"},"kvs":[{"key":"aw==","value":"aGVsbG8"}],"count":"1"})";
  try {
    etcd::decode_reply("test", "10.0.0.9:2379", "/v3/kv/range", ok_reply(body));
    FAIL() << "accepted unpadded base64";
  } catch (const BadReply& e) {
    EXPECT_THAT(e.what(), HasSubstr("10.0.0.9:2379"));
    EXPECT_THAT(e.what(), HasSubstr("\"value\" that is not valid padded base64"));
  }
}

TEST(EtcdReplies, DeepWideOrOddlyTypedRepliesAreErrorsNotCrashes) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_THROW(etcd::decode_reply("t", "e:1", "/p", ok_reply(deep)), BadReply);
  EXPECT_THROW(etcd::decode_reply("t", "e:1", "/p", ok_reply("[1,2]")), BadReply);
  EXPECT_THROW(etcd::decode_reply("t", "e:1", "/p", ok_reply("not json")), BadReply);
  // An error reply whose fields have other types than etcd's.
  EXPECT_THROW(
      etcd::decode_reply("t", "e:1", "/p", ok_reply(R"({"error":7,"code":"x","message":[1]})")),
      Error);
  EXPECT_THROW(
      etcd::decode_reply("t", "e:1", "/p", ok_reply(R"({"error":{"grpc_code":"x","message":{}}})")),
      Error);
  // A fine reply passes, with its bytes decodable.
  Json good =
      etcd::decode_reply("t", "e:1", "/p", ok_reply(R"({"kvs":[{"key":"aw==","value":"dg=="}]})"));
  EXPECT_EQ(etcd::json_bytes(good["kvs"][0], "value"), "v");
  EXPECT_THROW(etcd::decode_stream_message("e:1", R"({"result":{"events":[{"kv":{"key":"a"}}]}})"),
               BadReply);
}

// ---------------------------------------------------------------------------
// A connection over a socket pair: this test writes the server's bytes.

struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    connection = Connection::adopt(fds[0], EtcdEndpoint{"peer", 1}, kLimit);
    peer = fds[1];
  }
  ~Pair() {
    if (writer.joinable()) writer.join();
    ::close(peer);
  }
  void send(const std::string& bytes) const {
    std::size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = ::send(peer, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;  // the client closed: it stopped reading
      sent += static_cast<std::size_t>(n);
    }
  }
  static constexpr std::size_t kLimit = 1 << 20;
  std::unique_ptr<Connection> connection;
  int peer = -1;
  std::thread writer;
};

TEST(EtcdConnection, AHugeContentLengthIsABadReplyNotAnAllocation) {
  // Before: the parser had no body limit and reserved the announced length:
  // std::bad_alloc, which was neither a ddp::Error nor retried.
  Pair pair;
  pair.send(
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
      "4611686018427387904\r\n\r\n{");
  try {
    pair.connection->post("/v3/kv/range", "{}", "", Deadline(5s), Deadline(5s));
    FAIL() << "took an endless reply";
  } catch (const BadReply& e) {
    EXPECT_THAT(e.what(), HasSubstr("more than 1048576 bytes"));
  }
}

TEST(EtcdConnection, AnEndlessChunkedBodyStopsAtTheLimit) {
  Pair pair;
  pair.writer = std::thread([&] {
    pair.send("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    const std::string chunk = "10000\r\n" + std::string(0x10000, 'A') + "\r\n";
    for (int i = 0; i < 64; ++i) pair.send(chunk);  // 4 MiB, four times the limit
  });
  EXPECT_THROW(pair.connection->post("/v3/kv/range", "{}", "", Deadline(5s), Deadline(10s)),
               BadReply);
}

TEST(EtcdConnection, AWatchMessageWithoutEndStopsAtTheLimit) {
  Pair pair;
  pair.writer = std::thread([&] {
    pair.send("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    pair.send("5\r\n{}\n{}\r\n");
    const std::string chunk = "10000\r\n" + std::string(0x10000, 'x') + "\r\n";
    for (int i = 0; i < 64; ++i) pair.send(chunk);
  });
  ASSERT_EQ(pair.connection->post_stream("/v3/watch", "{}", "", Deadline(5s), nullptr, true), 200);
  EXPECT_EQ(pair.connection->next_line(Deadline(5s)), "{}");
  EXPECT_THROW(
      {
        for (;;) pair.connection->next_line(Deadline(5s));
      },
      BadReply);
}

TEST(EtcdConnection, ASilentStreamOutlivesItsDeadline) {
  // A watch waits in slices and checks its member between them: a slice
  // that ends must not end the stream.
  Pair pair;
  pair.send("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
  ASSERT_EQ(pair.connection->post_stream("/v3/watch", "{}", "", Deadline(5s), nullptr, true), 200);
  pair.send("3\r\nab\n\r\n");
  EXPECT_EQ(pair.connection->next_line(Deadline(5s)), "ab");
  EXPECT_EQ(pair.connection->next_line(Deadline(50ms)), std::nullopt);
  EXPECT_TRUE(pair.connection->is_open());
  pair.send("3\r\ncd\n\r\n");
  EXPECT_EQ(pair.connection->next_line(Deadline(5s)), "cd");
  // A long stream: far more than the limit in total, each message small.
  pair.writer = std::thread([&] {
    const std::string message = std::string(1000, 'm') + "\n";
    const std::string chunk = fmt::format("{:x}\r\n{}\r\n", message.size(), message);
    for (int i = 0; i < 3000; ++i) pair.send(chunk);
  });
  for (int i = 0; i < 3000; ++i) ASSERT_EQ(pair.connection->next_line(Deadline(5s))->size(), 1000u);
}

TEST(EtcdConnection, ADeadlineInsideAPartialChunkHeaderReturnsInTime) {
  // Found by etcd_reply_fuzz: a cancel at the deadline missed the read that
  // Beast's composed read had just restarted after "5" (a chunk size without
  // its line end), and next_line waited for the peer forever.
  Pair pair;
  pair.send("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
  ASSERT_EQ(pair.connection->post_stream("/v3/watch", "{}", "", Deadline(5s), nullptr, true), 200);
  pair.send("5");
  for (auto slice : {0ms, 1ms, 20ms}) {
    const auto start = SteadyClock::now();
    EXPECT_EQ(pair.connection->next_line(Deadline(slice)), std::nullopt);
    EXPECT_LT(seconds_since(start), 2.0) << "a " << slice.count() << " ms deadline";
  }
  pair.send("\r\nab\ncd\r\n");
  EXPECT_EQ(pair.connection->next_line(Deadline(5s)), "ab");
}

TEST(EtcdConnection, AnEndlessChunkHeaderIsABadReplyNotUnboundedMemory) {
  // Beast bounds a reply's header and body, not a chunk header: a peer sending
  // "1;x=" and then endless bytes without a line end grew the buffer by
  // hundreds of MiB.
  Pair pair;
  pair.writer = std::thread([&] {
    pair.send("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;x=");
    const std::string junk(1 << 16, 'x');
    for (int i = 0; i < 64; ++i) pair.send(junk);  // 4 MiB of one chunk header
  });
  try {
    pair.connection->post("/v3/kv/range", "{}", "", Deadline(5s), Deadline(10s));
    FAIL() << "took an endless chunk header";
  } catch (const BadReply& e) {
    EXPECT_THAT(e.what(), HasSubstr("chunk header or trailer"));
  }
}

// ---------------------------------------------------------------------------
// Against real etcd members

EtcdStoreOptions options_for(std::vector<EtcdEndpoint> endpoints) {
  EtcdStoreOptions options;
  options.endpoints = std::move(endpoints);
  options.prefix = "t/";
  options.connect_timeout = 10s;
  options.request_timeout = 10s;
  options.timeout = 10s;
  return options;
}

TEST(EtcdWatchSilence, AFrozenMemberIsLeftAndTheWaitSeesTheKeyOnAnother) {
  // Before: a blocking get read its watch stream for its whole timeout; with
  // the member it watched on SIGSTOPped, get(key, 90 s) returned after 96 s
  // although the key was written through a healthy member 1 s after.
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster cluster(3);
  EtcdStore waiter(options_for(cluster.client_endpoints()));  // talks to member 0 first
  auto others = cluster.client_endpoints();
  EtcdStore writer(options_for({others[1], others[2]}));
  auto got = std::async(std::launch::async, [&] { return waiter.get("end", 60s); });
  std::this_thread::sleep_for(1s);  // the watch is on member 0
  cluster.freeze(0);
  std::this_thread::sleep_for(1s);
  const auto written = SteadyClock::now();
  writer.set("end", "restart 1 3");
  ASSERT_EQ(got.wait_for(30s), std::future_status::ready)
      << "the wait never left the frozen member";
  EXPECT_EQ(got.get(), "restart 1 3");
  const double took = seconds_since(written);
  // watch_check_interval (2 s) of silence, a check that gets no answer in as
  // long, then a read through the next member.
  EXPECT_LT(took, 7.0) << "the key was seen " << took << " s after it was written";
  cluster.thaw(0);
}

TEST(EtcdWatchSilence, APrefixWatchResumesFromItsMemberFreezingWithoutLosingEvents) {
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster cluster(3);
  EtcdStore store(options_for(cluster.client_endpoints()));
  auto others = cluster.client_endpoints();
  EtcdStore writer(options_for({others[1], others[2]}));
  std::mutex mutex;
  std::vector<std::string> seen;
  // From a revision read first: "from now" would be whenever the watch is
  // created, which may be after the writes when member 0 froze before it.
  auto watch = store.watch_prefix(
      "w/", store.revision() + 1,
      [&](const StoreEvent& e) {
        std::lock_guard lock(mutex);
        seen.push_back(e.key);
      },
      nullptr);
  writer.set("w/1", "a");
  cluster.freeze(0);
  writer.set("w/2", "b");
  writer.set("w/3", "c");
  const auto start = SteadyClock::now();
  while (seconds_since(start) < 20) {
    {
      std::lock_guard lock(mutex);
      if (seen.size() >= 3) break;
    }
    std::this_thread::sleep_for(20ms);
  }
  {
    std::lock_guard lock(mutex);
    EXPECT_EQ(seen, (std::vector<std::string>{"w/1", "w/2", "w/3"}));
  }
  EXPECT_LT(seconds_since(start), 7.0);
  cluster.thaw(0);
}

TEST(EtcdWatchStop, StoppingAWatchWhileItConnectsDoesNotBlameTheEndpoint) {
  // Before: the cancelled connection counted as the endpoint's failure, and
  // every later call started at the next endpoint.
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster cluster;
  std::uint16_t silent_port = 0;
  const int silent = test::listen_loopback(silent_port);  // connects, never answers
  auto options = options_for({{"127.0.0.1", silent_port}, cluster.client_endpoints()[0]});
  auto transport = std::make_shared<etcd::Transport>(options);
  auto watch = etcd::start_watch(
      transport, "t/a", "t/b", 2, 0, [](const StoreEvent&) {}, [](const std::string&) {});
  std::this_thread::sleep_for(300ms);  // connected, waiting for the status reply
  const auto stop = SteadyClock::now();
  watch.reset();
  EXPECT_LT(seconds_since(stop), 1.0);
  EXPECT_EQ(transport->current_endpoint().port, silent_port)
      << "the stopped watch blamed its endpoint";
  ::close(silent);
}

// The keys below `dir` in the whole etcd keyspace, each with its lease id.
std::vector<std::pair<std::string, std::int64_t>> keys_below(etcd::Transport& transport,
                                                             const std::string& dir) {
  Json body = {{"key", etcd::base64_encode(dir)},
               {"range_end", etcd::base64_encode(etcd::prefix_range_end(dir))}};
  Json reply = transport.call("test", "/v3/kv/range", body);
  std::vector<std::pair<std::string, std::int64_t>> keys;
  if (!reply.contains("kvs")) return keys;
  for (const auto& kv : reply["kvs"]) {
    keys.emplace_back(etcd::json_bytes(kv, "key"), etcd::json_int(kv, "lease"));
  }
  return keys;
}

TEST(EtcdMarkers, AClientsMarkerIsLeasedAndGoneWithTheClient) {
  // Before: ~EtcdStore deleted its marker, but ddprun leaves through _exit:
  // every node of every etcd job left __ddp_clients/<id> behind forever.
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster cluster;
  auto options = options_for(cluster.client_endpoints());
  etcd::Transport raw(options);
  {
    EtcdStore store(options);
    store.add("counter", 1);
    store.append("log", "x");
    auto markers = keys_below(raw, "__ddp_clients/");
    ASSERT_EQ(markers.size(), 1u);
    EXPECT_NE(markers[0].second, 0) << "the marker is not on a lease";
  }
  EXPECT_TRUE(keys_below(raw, "__ddp_clients/").empty()) << "the destructor left the marker";
  // A client that leaves through _exit (as ddprun does): its marker carries a
  // lease that expires by itself.
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      EtcdStore store(options);
      store.add("counter", 1);
      ::_exit(0);  // with the store alive: no destructor runs
    } catch (...) {
      ::_exit(2);
    }
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto markers = keys_below(raw, "__ddp_clients/");
  ASSERT_EQ(markers.size(), 1u);
  ASSERT_NE(markers[0].second, 0);
  Json ttl = raw.call("test", "/v3/lease/timetolive", {{"ID", std::to_string(markers[0].second)}});
  EXPECT_GT(etcd::json_int(ttl, "TTL"), 0);
  EXPECT_LE(etcd::json_int(ttl, "TTL"), 2 * 10 + 60) << "marker TTL: twice request_timeout + 60 s";
}

}  // namespace
}  // namespace ddp
