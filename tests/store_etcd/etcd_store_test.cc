// EtcdStore against real etcd members (tests/support/etcd_cluster.h): a
// client that keeps working while the member it talks to is killed, adds
// applied exactly once, leases, prefix watches, errors (nothing listening, a
// stopped cluster, a server without the v3 gateway), endpoint parsing, user
// authentication and TLS. The conformance suite runs in
// etcd_conformance_test.cc.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ddp/common/error.h"
#include "ddp/store_etcd/etcd_store.h"
#include "etcd_cluster.h"
#include "net_util.h"
#include "temp_dir.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using SteadyClock = std::chrono::steady_clock;

double seconds_since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

EtcdStoreOptions options_for(const test::EtcdCluster& cluster, const std::string& prefix = "t/") {
  EtcdStoreOptions options;
  options.endpoints = cluster.client_endpoints();
  options.prefix = prefix;
  options.connect_timeout = 10s;
  options.request_timeout = 10s;
  options.timeout = 10s;
  return options;
}

// Polls `condition` until it holds or `timeout` passes.
bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  auto deadline = SteadyClock::now() + timeout;
  while (!condition()) {
    if (SteadyClock::now() >= deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

// Collects the events of a watch.
struct EventLog {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<StoreEvent> events;
  std::vector<std::string> errors;

  std::function<void(const StoreEvent&)> on_event() {
    return [this](const StoreEvent& event) {
      std::lock_guard lock(mutex);
      events.push_back(event);
      changed.notify_all();
    };
  }
  std::function<void(const std::string&)> on_error() {
    return [this](const std::string& reason) {
      std::lock_guard lock(mutex);
      errors.push_back(reason);
      changed.notify_all();
    };
  }
  // Waits until `count` events arrived; returns a copy of them.
  std::vector<StoreEvent> wait_for(std::size_t count, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex);
    changed.wait_for(lock, timeout, [&] { return events.size() >= count || !errors.empty(); });
    return events;
  }
};

// ---------------------------------------------------------------------------
// A three-member cluster losing the member the client talks to

TEST(EtcdStore, KeepsWorkingWhenItsMemberIsKilled) {
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster cluster(3);
  EtcdStore store(options_for(cluster));
  EtcdStore other(options_for(cluster));
  store.set("before", "1");
  EXPECT_EQ(store.add("n", 5), 5);
  EXPECT_EQ(store.compare_set("cas", "", "a"), "a");
  // A blocking get that waits across the kill (its watch is on member 0 too).
  auto blocked = std::async(std::launch::async, [&] { return store.get("late", 15s); });
  ASSERT_EQ(blocked.wait_for(300ms), std::future_status::timeout);

  cluster.kill(0);  // every client starts on the first endpoint
  auto start = SteadyClock::now();
  store.set("after", "2");
  EXPECT_EQ(store.get("before"), "1");
  EXPECT_EQ(store.get("after"), "2");
  EXPECT_EQ(store.add("n", 1), 6);
  EXPECT_EQ(store.compare_set("cas", "a", "b"), "b");
  EXPECT_EQ(store.compare_set("cas", "a", "c"), "b");
  EXPECT_TRUE(store.check({"before", "after"}));
  EXPECT_EQ(store.num_keys(), 4);
  other.set("late", "arrived");
  ASSERT_EQ(blocked.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(blocked.get(), "arrived");
  EXPECT_EQ(other.get("after"), "2");
  RecordProperty("failover_seconds", std::to_string(seconds_since(start)));
}

// Four clients of a 3-member cluster each call `step(client, i)` 100 times at
// once; member 0, which every client talks to, is SIGKILLed when a quarter is
// done. Returns every value the calls returned, sorted (empty after a failure,
// which the test has then reported).
std::vector<std::int64_t> race_across_a_kill(
    test::EtcdCluster& cluster, std::vector<std::unique_ptr<EtcdStore>>& clients,
    const std::function<std::int64_t(EtcdStore&, int)>& step) {
  constexpr int kCalls = 100;
  const int threads_n = static_cast<int>(clients.size());
  std::vector<std::vector<std::int64_t>> seen(clients.size());
  std::atomic<int> done{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_n; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int i = 0; i < kCalls; ++i) {
          seen[t].push_back(step(*clients[t], i));
          ++done;
        }
      } catch (const std::exception& e) {
        if (failures++ == 0) ADD_FAILURE() << "client " << t << ": " << e.what();
      }
    });
  }
  EXPECT_TRUE(
      eventually([&] { return done.load() >= threads_n * kCalls / 4 || failures > 0; }, 10s));
  cluster.kill(0);
  for (auto& thread : threads) thread.join();
  std::vector<std::int64_t> all;
  if (failures.load() > 0) return all;
  for (const auto& s : seen) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  return all;
}

std::vector<std::unique_ptr<EtcdStore>> clients_of(const test::EtcdCluster& cluster, int n) {
  std::vector<std::unique_ptr<EtcdStore>> clients;
  for (int t = 0; t < n; ++t) clients.push_back(std::make_unique<EtcdStore>(options_for(cluster)));
  return clients;
}

// first, first + 1, ..., first + n - 1
std::vector<std::int64_t> sequence(std::int64_t first, std::size_t n) {
  std::vector<std::int64_t> values(n);
  std::iota(values.begin(), values.end(), first);
  return values;
}

TEST(EtcdStore, AddsApplyExactlyOnceUnderContentionAndAcrossAMemberKill) {
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster cluster(3);
  auto clients = clients_of(cluster, 4);
  auto all =
      race_across_a_kill(cluster, clients, [](EtcdStore& c, int) { return c.add("counter", 1); });
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all, sequence(1, 400))
      << "an add was lost, doubled, or two adds returned the same value";
  EXPECT_EQ(clients[0]->get("counter"), "400");
  // The clients' markers are not keys of the store.
  EXPECT_EQ(clients[0]->num_keys(), 1);
}

TEST(EtcdStore, TicketsAreDistinctAndCountedOnceUnderContentionAndAcrossAMemberKill) {
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster cluster(3);
  auto clients = clients_of(cluster, 4);
  EXPECT_EQ(clients[0]->tickets_taken("arrivals"), 0);
  auto all = race_across_a_kill(cluster, clients, [](EtcdStore& c, int i) {
    const auto ticket = c.take_ticket("arrivals");
    if (i % 10 == 0) c.add("other", 1);  // an add of the same client moves its marker
    return ticket;
  });
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all, sequence(0, 400)) << "a ticket was lost, doubled, or given twice";
  EXPECT_EQ(clients[1]->tickets_taken("arrivals"), 400);
  clients[1]->delete_tickets("arrivals");
  EXPECT_EQ(clients[1]->tickets_taken("arrivals"), 0);
  EXPECT_EQ(clients[1]->take_ticket("arrivals"), 0) << "the count starts again";
}

TEST(EtcdStore, AMemberOfAnotherClusterIsAFailedEndpointNotAPlaceForKeys) {
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster mine;
  test::EtcdCluster other;  // e.g. another etcd that took over a dead member's port
  EtcdStoreOptions options = options_for(mine);
  options.endpoints.push_back(other.client_endpoints()[0]);
  options.request_timeout = 3s;
  EtcdStore store(options);
  store.set("k", "v");
  mine.stop(0);
  try {
    store.set("k", "w");
    FAIL() << "a write went to another cluster";
  } catch (const NetworkError& e) {
    EXPECT_THAT(e.what(), HasSubstr("belongs to another etcd cluster")) << e.what();
  }
  EtcdStore others(options_for(other));
  EXPECT_FALSE(others.check({"k"}));
}

TEST(EtcdStore, TakeOverDeletesAPrefixAndSetsTheKeyInOneStepOnlyWhenTheKeyHoldsWhatWasExpected) {
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster cluster;
  EtcdStore store(options_for(cluster));
  store.set("rdzv/j/config", "old job");
  store.set("rdzv/j/current", "3 2");
  store.set("rdzv/j/round_3/closed", "x");
  store.take_ticket("rdzv/j/round_4/arrivals");
  store.set("rdzv/jx/other", "another run id");
  EXPECT_FALSE(store.take_over("rdzv/j/config", "someone else", "new job", "rdzv/j/"));
  EXPECT_TRUE(store.check({"rdzv/j/current", "rdzv/j/round_3/closed"}))
      << "a failed take-over deletes nothing";
  EXPECT_TRUE(store.take_over("rdzv/j/config", "old job", "new job", "rdzv/j/"));
  EXPECT_EQ(store.get("rdzv/j/config", 1s), "new job");
  EXPECT_FALSE(store.check({"rdzv/j/current"}));
  EXPECT_FALSE(store.check({"rdzv/j/round_3/closed"}));
  EXPECT_EQ(store.tickets_taken("rdzv/j/round_4/arrivals"), 0);
  EXPECT_EQ(store.get("rdzv/jx/other", 1s), "another run id") << "outside the prefix";
  EXPECT_THROW(store.take_over("elsewhere", "", "x", "rdzv/j/"), InvalidArgument);
  EXPECT_TRUE(store.take_over("rdzv/k/config", "", "first", "rdzv/k/")) << "absent, as expected";
}

// ---------------------------------------------------------------------------
// Leases

TEST(EtcdStore, LeaseKeepsItsKeysWhileRefreshedAndDeletesThemAfterItsTtl) {
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster cluster;
  EtcdStore store(options_for(cluster));
  auto lease = store.grant_lease(2s);
  EXPECT_GT(lease, 0);
  store.set_with_lease("alive", "yes", lease);
  store.set("plain", "stays");
  EXPECT_GE(store.lease_time_left(lease), 1);
  // Refreshed for longer than its TTL: the key stays.
  auto until = SteadyClock::now() + 3500ms;
  while (SteadyClock::now() < until) {
    EXPECT_TRUE(store.refresh_lease(lease));
    std::this_thread::sleep_for(400ms);
  }
  EXPECT_TRUE(store.check({"alive"})) << "a refreshed lease expired";
  // No more refreshes: gone after about the TTL (etcd checks every 500 ms).
  auto stopped = SteadyClock::now();
  EXPECT_TRUE(eventually([&] { return !store.check({"alive"}); }, 10s))
      << "the key outlived its lease";
  EXPECT_LT(seconds_since(stopped), 8.0);
  EXPECT_FALSE(store.refresh_lease(lease));
  EXPECT_EQ(store.lease_time_left(lease), -1);
  EXPECT_EQ(store.get("plain"), "stays");
}

TEST(EtcdStore, RevokeDeletesTheKeysAndUnknownLeasesAreHandled) {
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster cluster;
  EtcdStore store(options_for(cluster));
  auto lease = store.grant_lease(30s);
  store.set_with_lease("a", "1", lease);
  store.set_with_lease("b", "2", lease);
  EXPECT_TRUE(store.check({"a", "b"}));
  store.revoke_lease(lease);
  EXPECT_FALSE(store.check({"a"}));
  EXPECT_FALSE(store.check({"b"}));
  store.revoke_lease(lease);  // unknown now: ignored
  EXPECT_FALSE(store.refresh_lease(lease));
  try {
    store.set_with_lease("c", "3", lease);
    FAIL() << "set_with_lease on a revoked lease returned";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr(std::to_string(lease)));
    EXPECT_THAT(e.what(), HasSubstr("lease not found"));
  }
  EXPECT_THROW(store.set_with_lease("c", "3", 12345), InvalidArgument);
  EXPECT_THROW(store.grant_lease(0s), InvalidArgument);
}

// ---------------------------------------------------------------------------
// Watches

TEST(EtcdStore, WatchPrefixDeliversPutsAndDeletesInOrderAndStopsPromptly) {
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster cluster;
  EtcdStore store(options_for(cluster));
  const std::int64_t start = store.revision();
  EventLog log;
  auto watch = store.watch_prefix("w/", 0, log.on_event(), log.on_error());
  std::this_thread::sleep_for(200ms);  // "from now": let the watch open first
  store.set("w/a", "1");
  store.set("other", "not watched");
  store.multi_set({"w/b", "w/c"}, {"2", "3"});
  ASSERT_TRUE(store.delete_key("w/a"));
  auto events = log.wait_for(4, 5s);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_TRUE(log.errors.empty());
  EXPECT_EQ(events[0].kind, StoreEvent::Kind::kPut);
  EXPECT_EQ(events[0].key, "w/a");
  EXPECT_EQ(events[0].value, "1");
  EXPECT_EQ(events[1].key, "w/b");
  EXPECT_EQ(events[2].key, "w/c");
  EXPECT_EQ(events[1].revision, events[2].revision) << "one multi_set, one revision";
  EXPECT_EQ(events[3].kind, StoreEvent::Kind::kDelete);
  EXPECT_EQ(events[3].key, "w/a");
  EXPECT_EQ(events[3].value, "");
  EXPECT_GT(events[0].revision, start);
  EXPECT_LT(events[0].revision, events[1].revision);
  EXPECT_LT(events[2].revision, events[3].revision);

  // A watch from a past revision replays the same history.
  EventLog replay;
  auto again = store.watch_prefix("w/", events[0].revision, replay.on_event(), replay.on_error());
  auto replayed = replay.wait_for(4, 5s);
  ASSERT_EQ(replayed.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(replayed[i].key, events[i].key);
    EXPECT_EQ(replayed[i].revision, events[i].revision);
  }

  auto stop = SteadyClock::now();
  watch.reset();
  again.reset();
  EXPECT_LT(seconds_since(stop), 1.0) << "destroying a watch took long";
}

TEST(EtcdStore, WatchResumesOnAnotherMemberWithoutLosingOrRepeatingEvents) {
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster cluster(3);
  EtcdStore store(options_for(cluster));
  EventLog log;
  auto watch = store.watch_prefix("", store.revision() + 1, log.on_event(), log.on_error());
  store.set("k0", "v0");
  ASSERT_EQ(log.wait_for(1, 5s).size(), 1u);
  cluster.kill(0);  // the member the watch (and the store) talk to
  constexpr int kMore = 10;
  for (int i = 1; i <= kMore; ++i) store.set("k" + std::to_string(i), "v" + std::to_string(i));
  auto events = log.wait_for(kMore + 1, 10s);
  ASSERT_EQ(events.size(), static_cast<std::size_t>(kMore + 1)) << "events lost";
  for (int i = 0; i <= kMore; ++i) {
    EXPECT_EQ(events[i].key, "k" + std::to_string(i));
    if (i > 0) {
      EXPECT_GT(events[i].revision, events[i - 1].revision);
    }
  }
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(log.wait_for(0, 0ms).size(), static_cast<std::size_t>(kMore + 1)) << "events repeated";
  EXPECT_TRUE(log.errors.empty()) << log.errors.front();
  auto stop = SteadyClock::now();
  watch.reset();
  EXPECT_LT(seconds_since(stop), 1.0);
}

// ---------------------------------------------------------------------------
// Errors

TEST(EtcdStore, NothingListeningIsNetworkErrorNamingTheEndpointAfterTheConnectTimeout) {
  const std::uint16_t port = test::free_port();
  EtcdStoreOptions options;
  options.endpoints = {{"127.0.0.1", port}};
  options.connect_timeout = 1s;
  auto start = SteadyClock::now();
  try {
    EtcdStore store(options);
    FAIL() << "connected to nothing";
  } catch (const NetworkError& e) {
    EXPECT_THAT(e.what(), HasSubstr("127.0.0.1:" + std::to_string(port)));
    EXPECT_THAT(e.what(), HasSubstr("refused"));
    EXPECT_THAT(e.what(), HasSubstr("within 1 s"));
  }
  double elapsed = seconds_since(start);
  EXPECT_GE(elapsed, 0.9);
  EXPECT_LT(elapsed, 3.0);
}

TEST(EtcdStore, AStoppedClusterIsNetworkErrorNamingTheEndpointsWithinTheRequestTimeout) {
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster cluster;
  auto options = options_for(cluster);
  options.request_timeout = 2s;
  EtcdStore store(options);
  store.set("k", "v");
  cluster.stop(0);
  auto start = SteadyClock::now();
  try {
    store.set("k", "w");
    FAIL() << "set on a stopped cluster returned";
  } catch (const NetworkError& e) {
    EXPECT_THAT(e.what(), HasSubstr(cluster.endpoints()));
    EXPECT_THAT(e.what(), HasSubstr("EtcdStore::set"));
  }
  double elapsed = seconds_since(start);
  EXPECT_GE(elapsed, 1.8);
  EXPECT_LT(elapsed, 6.0);
  // A blocking get fails the same way, not with a timeout much later.
  start = SteadyClock::now();
  EXPECT_THROW(store.get("missing", 30s), NetworkError);
  EXPECT_LT(seconds_since(start), 6.0);
}

TEST(EtcdStore, AServerWithoutTheV3GatewayIsProtocolErrorNamingIt) {
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster::Options cluster_options;
  cluster_options.grpc_gateway = false;
  test::EtcdCluster cluster(cluster_options);
  try {
    EtcdStore store(options_for(cluster));
    FAIL() << "accepted etcd without its gateway";
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), HasSubstr(cluster.endpoints()));
    EXPECT_THAT(e.what(), HasSubstr("not an etcd v3 HTTP gateway"));
    EXPECT_THAT(e.what(), HasSubstr("404"));
  }
}

TEST(EtcdStore, ParseEndpoints) {
  auto list = parse_etcd_endpoints("host1:2380,host2, [::1]:2381,[fe80::1],10.0.0.1");
  ASSERT_EQ(list.size(), 5u);
  EXPECT_EQ(list[0].host, "host1");
  EXPECT_EQ(list[0].port, 2380);
  EXPECT_EQ(list[1].host, "host2");
  EXPECT_EQ(list[1].port, 2379);
  EXPECT_EQ(list[2].host, "::1");
  EXPECT_EQ(list[2].port, 2381);
  EXPECT_EQ(list[3].host, "fe80::1");
  EXPECT_EQ(list[3].port, 2379);
  EXPECT_EQ(list[4].host, "10.0.0.1");
  for (const std::string bad : {"", " ", "a,,b", "a,", ":2379", "h:", "h:0", "h:65536", "h:12x",
                                "[::1", "[::1]x", "http://h:2379"}) {
    EXPECT_THROW(parse_etcd_endpoints(bad), InvalidArgument) << "'" << bad << "'";
  }
  try {
    parse_etcd_endpoints("good:1,bad:port");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("bad:port"));
  }
}

// ---------------------------------------------------------------------------
// Authentication and TLS

int run_quietly(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str());
}

TEST(EtcdStore, UserAuthenticationRightPasswordWorksWrongIsAuthError) {
  DDP_SKIP_WITHOUT_ETCD();
  if (run_quietly("command -v etcdctl") != 0) GTEST_SKIP() << "etcdctl is not installed";
  test::EtcdCluster cluster;
  const std::string etcdctl = "ETCDCTL_API=3 etcdctl --endpoints=" + cluster.urls();
  ASSERT_EQ(run_quietly(etcdctl + " user add root:s3cret"), 0);
  ASSERT_EQ(run_quietly(etcdctl + " auth enable"), 0);

  auto options = options_for(cluster);
  options.username = "root";
  options.password = "s3cret";
  EtcdStore store(options);
  EtcdStore other(options);
  store.set("k", "v");
  EXPECT_EQ(other.get("k"), "v");
  EXPECT_EQ(store.add("n", 2), 2);
  auto blocked = std::async(std::launch::async, [&] { return store.get("late", 10s); });
  ASSERT_EQ(blocked.wait_for(200ms), std::future_status::timeout);
  other.set("late", "ok");
  ASSERT_EQ(blocked.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(blocked.get(), "ok");

  options.password = "wrong";
  options.connect_timeout = 3s;
  EXPECT_THROW(EtcdStore{options}, AuthError);
  options.username.clear();
  options.password.clear();
  EXPECT_THROW(EtcdStore{options}, AuthError);
}

class TlsFiles {
 public:
  // A CA and a server certificate for 127.0.0.1 signed by it.
  bool make() {
    const std::string d = dir_.str();
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    return run_quietly("cd " + d + " && openssl req -x509" + ec +
                       " -keyout ca.key -out ca.crt -days 2 -subj /CN=ddp-test-ca") == 0 &&
           run_quietly("cd " + d + " && openssl req" + ec +
                       " -keyout server.key -out server.csr -subj /CN=127.0.0.1") == 0 &&
           run_quietly("cd " + d + " && printf 'subjectAltName=IP:127.0.0.1\\n' > ext.cnf && " +
                       "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial" +
                       " -out server.crt -days 2 -extfile ext.cnf") == 0;
  }
  std::string file(const char* name) const { return (dir_.path() / name).string(); }

 private:
  test::TempDir dir_{"ddp-etcd-tls"};
};

TEST(EtcdStore, TlsWithTheCaWorksWithoutItFailsVerification) {
  DDP_SKIP_WITHOUT_ETCD();
  if (run_quietly("command -v openssl") != 0)
    GTEST_SKIP() << "the openssl command is not installed";
  TlsFiles files;
  ASSERT_TRUE(files.make()) << "openssl could not make the test certificates";
  test::EtcdCluster::Options cluster_options;
  cluster_options.cert_file = files.file("server.crt");
  cluster_options.key_file = files.file("server.key");
  test::EtcdCluster cluster(cluster_options);

  auto options = options_for(cluster);
  options.tls = true;
  options.ca_file = files.file("ca.crt");
  EtcdStore store(options);
  store.set("k", "v");
  EXPECT_EQ(store.get("k"), "v");
  auto blocked = std::async(std::launch::async, [&] { return store.get("late", 10s); });
  ASSERT_EQ(blocked.wait_for(200ms), std::future_status::timeout);
  store.set("late", "over tls");
  ASSERT_EQ(blocked.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(blocked.get(), "over tls");

  options.ca_file.clear();  // the system's CAs do not know ours
  options.connect_timeout = 3s;
  auto start = SteadyClock::now();
  try {
    EtcdStore untrusted(options);
    FAIL() << "a certificate from an unknown CA was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(e.kind() == ErrorKind::kAuth || e.kind() == ErrorKind::kNetwork) << e.what();
    EXPECT_THAT(e.what(), HasSubstr("certificate"));
    EXPECT_THAT(e.what(), HasSubstr("verif"));
  }
  EXPECT_LT(seconds_since(start), 3.5);

  // Plain HTTP to an https endpoint: etcd never answers it.
  options.tls = false;
  options.connect_timeout = 1s;
  start = SteadyClock::now();
  EXPECT_THROW(EtcdStore{options}, NetworkError);
  EXPECT_LT(seconds_since(start), 3.0);
}

}  // namespace
}  // namespace ddp
