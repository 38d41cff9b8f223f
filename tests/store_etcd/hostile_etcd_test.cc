// EtcdStore against servers that are not quite etcd (hostile_etcd.h: a proxy
// in front of a real member that can answer like a broken or malicious one):
// unpadded base64, a Content-Length of 2^62, an endless body, a member of
// another cluster, a stalled (SIGSTOPped) member and a watch message that never
// ends. With the proxy as the only endpoint a call must fail with an error
// naming it within the request timeout, without a crash, a hang or unbounded
// memory; with the real member behind it the call must get the right value
// from that member. A test of the proxy in pass mode proves the proxy itself.
#include <cxxabi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ddp/common/error.h"
#include "ddp/store_etcd/etcd_store.h"
#include "etcd_cluster.h"
#include "hostile_etcd.h"
#include "process_state.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using Mode = test::HostileEtcd::Mode;
using SteadyClock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

constexpr Millis kRequestTimeout = 5s;
// How much later than its timeout a call may end: scheduling on a loaded
// 2-core machine, AddressSanitizer, the last attempt in flight.
constexpr Millis kSlack = 3s;
// How long the client waits for a reply to start before it tries the next
// endpoint (kReplyStart in etcd_http.cc): a stalled member costs this first.
constexpr Millis kReplyStart = 3s;
constexpr std::int64_t kMaxRssGrowth = std::int64_t{256} << 20;
// The reply limit of the memory tests (see store_on).
constexpr std::size_t kMemoryTestReplyBytes = 8u << 20;
// Blocking gets wait this long: far more than any limit below, so that only
// the client's own handling of the hostile server can end them in time.
constexpr Millis kLongWait = 60s;
// The value every test stores under "k" through the proxy (not "hello", the
// value of the proxy's made-up replies).
const std::string kValue = "the real value";

double seconds_between(SteadyClock::time_point from, SteadyClock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Polls `condition` until it holds or `timeout` passes.
bool eventually(const std::function<bool()>& condition, Millis timeout) {
  auto deadline = SteadyClock::now() + timeout;
  while (!condition()) {
    if (SteadyClock::now() >= deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// The process's resident memory (VmRSS), in bytes; 0 when unknown.
std::int64_t resident_bytes() {
  return static_cast<std::int64_t>(test::proc_status_kib(0, "VmRSS").value_or(0) * 1024);
}

// The peak of VmRSS over its lifetime, above what it was at the start,
// sampled every few milliseconds: a client that buffers a reply and drops it
// on failure shows no growth after the call, only during it.
class RssGrowth {
 public:
  RssGrowth() : baseline_(resident_bytes()), peak_(baseline_) {
    thread_ = std::thread([this] {
      while (!done_.load()) {
        std::int64_t now = resident_bytes();
        if (now > peak_.load()) peak_ = now;
        std::this_thread::sleep_for(5ms);
      }
    });
  }
  ~RssGrowth() { stop(); }
  RssGrowth(const RssGrowth&) = delete;
  RssGrowth& operator=(const RssGrowth&) = delete;

  // Stops sampling; the peak growth in bytes.
  std::int64_t stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
    return peak_.load() - baseline_;
  }

 private:
  const std::int64_t baseline_;
  std::atomic<std::int64_t> peak_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

std::string mib(std::int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// How a store call ended.
struct Outcome {
  bool in_time = false;  // it ended within the limit given to finish()
  SteadyClock::time_point started;
  SteadyClock::time_point ended;
  std::optional<std::string> value;  // what it returned
  std::optional<ErrorKind> kind;     // the kind of the ddp::Error it threw
  std::string error;                 // what it threw: "<type>: <what()>"

  double seconds() const { return seconds_between(started, ended); }
  std::string describe() const {
    std::string text = value ? "returned '" + *value + "'" : "threw " + error;
    return text + " after " + std::to_string(seconds()) + " s" + (in_time ? "" : " (too late)");
  }
};

std::string type_name(const std::exception& e) {
  int status = 0;
  char* name = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
  std::string text = status == 0 && name ? name : typeid(e).name();
  std::free(name);
  return text;
}

// A store call on a thread of its own, so that a client that hangs fails the
// test instead of hanging it.
class BackgroundCall {
 public:
  explicit BackgroundCall(std::function<std::string()> call) {
    outcome_.started = SteadyClock::now();
    thread_ = std::thread([this, call = std::move(call)] { run(call); });
  }
  ~BackgroundCall() {
    if (thread_.joinable()) thread_.join();
  }
  BackgroundCall(const BackgroundCall&) = delete;
  BackgroundCall& operator=(const BackgroundCall&) = delete;

  // Waits until the call ended or `limit` (from now) passed. A call still
  // running then gets `unblock`, which must make it end (shutting the hostile
  // server down does), and is waited for: the outcome says it was late.
  Outcome finish(Millis limit, const std::function<void()>& unblock) {
    bool in_time = false;
    {
      std::unique_lock lock(mutex_);
      in_time = ended_.wait_for(lock, limit, [&] { return done_; });
    }
    if (!in_time) unblock();
    thread_.join();
    std::lock_guard lock(mutex_);
    outcome_.in_time = in_time;
    return outcome_;
  }

 private:
  void run(const std::function<std::string()>& call) {
    std::optional<std::string> value;
    std::optional<ErrorKind> kind;
    std::string error;
    try {
      value = call();
    } catch (const Error& e) {
      kind = e.kind();
      error = type_name(e) + ": " + e.what();
    } catch (const std::exception& e) {  // std::bad_alloc and the like: a defect
      error = type_name(e) + ": " + e.what();
    } catch (...) {
      error = "an exception that is not a std::exception";
    }
    std::lock_guard lock(mutex_);
    outcome_.ended = SteadyClock::now();
    outcome_.value = std::move(value);
    outcome_.kind = kind;
    outcome_.error = std::move(error);
    done_ = true;
    ended_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable ended_;
  bool done_ = false;
  Outcome outcome_;
  std::thread thread_;
};

// What a client says when a reply is larger than it accepts (the wording is
// the client's; any of these says what was wrong).
::testing::Matcher<const std::string&> says_too_large() {
  return AnyOf(HasSubstr("max_reply_bytes"), HasSubstr("too large"), HasSubstr("too big"),
               HasSubstr("too long"), HasSubstr("larger than"), HasSubstr("exceeds"),
               HasSubstr("limit"));
}

// A one-member cluster and a proxy in front of it, in kPass. Stores are made
// while the proxy passes (their constructor probes) and get "k" = kValue.
class HostileEtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DDP_SKIP_WITHOUT_ETCD();
    cluster_ = std::make_unique<test::EtcdCluster>(1);
    proxy_ = std::make_unique<test::HostileEtcd>(real());
  }

  void TearDown() override {
    // Whatever its connections were doing (held, relaying, sending without
    // end), the proxy must stop at once: nothing of a test may outlive it.
    const auto start = SteadyClock::now();
    proxy_.reset();
    EXPECT_LT(seconds_between(start, SteadyClock::now()), 1.0) << "the proxy took long to stop";
  }

  EtcdEndpoint real() const { return cluster_->client_endpoints()[0]; }
  test::HostileEtcd& proxy() { return *proxy_; }

  // `max_reply_bytes`: the memory tests take 8 MiB, so that what they measure
  // is the bound, not the allocator (a message grown to 64 MiB by doubling
  // leaves its freed halves resident in AddressSanitizer's quarantine).
  std::unique_ptr<EtcdStore> store_on(
      std::vector<EtcdEndpoint> endpoints,
      std::size_t max_reply_bytes = EtcdStoreOptions{}.max_reply_bytes) {
    EtcdStoreOptions options;
    options.endpoints = std::move(endpoints);
    options.max_reply_bytes = max_reply_bytes;
    options.prefix = "h/";
    options.request_timeout = kRequestTimeout;
    options.connect_timeout = 5s;
    options.timeout = 10s;
    auto store = std::make_unique<EtcdStore>(options);
    store->set("k", kValue);
    return store;
  }

  // Runs `call`; a call late by `limit` is ended by shutting the proxy down.
  // The call's time is recorded as the test's property call_seconds.
  Outcome run_call(std::function<std::string()> call, Millis limit) {
    BackgroundCall background(std::move(call));
    Outcome outcome = background.finish(limit, [this] { proxy_->shutdown(); });
    RecordProperty("call_seconds", std::to_string(outcome.seconds()));
    return outcome;
  }

  // With the proxy as the only endpoint, in `mode`, get("k") ends within
  // `limit` in a ddp::Error (of `kind` when given) that names the proxy and
  // whose message matches `reason`; the store accepts replies of up to
  // `max_reply_bytes`.
  void expect_get_fails_naming_the_proxy(
      Mode mode, std::optional<ErrorKind> kind,
      const ::testing::Matcher<const std::string&>& reason, Millis limit = kRequestTimeout + kSlack,
      std::size_t max_reply_bytes = EtcdStoreOptions{}.max_reply_bytes) {
    auto store = store_on({proxy().endpoint()}, max_reply_bytes);
    proxy().set_mode(mode);
    Outcome outcome = run_call([&] { return store->get("k"); }, limit);
    EXPECT_GT(proxy().hits(mode), 0u) << "the proxy never answered in its hostile mode";
    EXPECT_TRUE(outcome.in_time) << outcome.describe();
    ASSERT_FALSE(outcome.value) << outcome.describe();
    ASSERT_TRUE(outcome.kind) << "not a ddp::Error: " << outcome.describe();
    if (kind) {
      EXPECT_EQ(*outcome.kind, *kind) << outcome.describe();
    }
    EXPECT_THAT(outcome.error, HasSubstr(proxy().where()));
    EXPECT_THAT(outcome.error, reason);
  }

  // With the proxy first and the real member second, in `mode`, get("k")
  // returns kValue (the real member's) within `limit`.
  void expect_get_moves_to_the_real_member(Mode mode, Millis limit = kRequestTimeout + kSlack) {
    auto store = store_on({proxy().endpoint(), real()});
    proxy().set_mode(mode);
    Outcome outcome = run_call([&] { return store->get("k"); }, limit);
    EXPECT_GT(proxy().hits(mode), 0u) << "the call never tried the proxy";
    EXPECT_TRUE(outcome.in_time) << outcome.describe();
    EXPECT_EQ(outcome.value, kValue) << outcome.describe();
  }

  // Declared in this order so that the proxy goes before its member.
  std::unique_ptr<test::EtcdCluster> cluster_;
  std::unique_ptr<test::HostileEtcd> proxy_;
};

// ---------------------------------------------------------------------------
// The proxy itself

TEST_F(HostileEtcdTest, PassModeServesSetGetAddTxnsAndABlockingGetWokenByASet) {
  auto store = store_on({proxy().endpoint()});
  store->set("a", "1");
  EXPECT_EQ(store->get("a"), "1");
  EXPECT_EQ(store->get("k"), kValue);
  EXPECT_EQ(store->add("n", 2), 2);
  EXPECT_EQ(store->add("n", 3), 5);
  EXPECT_EQ(store->multi_get({"a", "n"}), (std::vector<std::string>{"1", "5"}));
  EXPECT_EQ(store->compare_set("c", "", "x"), "x");

  auto blocked = std::async(std::launch::async, [&] { return store->get("late", 20s); });
  ASSERT_TRUE(eventually([&] { return proxy().relayed_watches() >= 1; }, 10s))
      << "the blocking get's watch never went through the proxy";
  ASSERT_EQ(blocked.wait_for(0ms), std::future_status::timeout);
  store->set("late", "arrived");
  ASSERT_EQ(blocked.wait_for(5s), std::future_status::ready) << "the watch relayed no event";
  EXPECT_EQ(blocked.get(), "arrived");

  EXPECT_GT(proxy().hits(Mode::kPass), 5u);
  // The data really is the real member's.
  EtcdStoreOptions direct;
  direct.endpoints = {real()};
  direct.prefix = "h/";
  direct.connect_timeout = 5s;
  EtcdStore on_real(direct);
  EXPECT_EQ(on_real.get("late"), "arrived");
  EXPECT_EQ(on_real.get("n"), "5");
}

// ---------------------------------------------------------------------------
// Values that are not etcd's base64 (etcd always pads)

TEST_F(HostileEtcdTest, UnpaddedBase64FromTheOnlyEndpointIsProtocolErrorNamingIt) {
  expect_get_fails_naming_the_proxy(Mode::kUnpaddedBase64, ErrorKind::kProtocol,
                                    HasSubstr("base64"));
}

TEST_F(HostileEtcdTest, UnpaddedBase64FromTheFirstEndpointMovesTheCallToTheNext) {
  expect_get_moves_to_the_real_member(Mode::kUnpaddedBase64);
}

// ---------------------------------------------------------------------------
// A reply that announces 2^62 bytes

TEST_F(HostileEtcdTest, HugeContentLengthFromTheOnlyEndpointIsProtocolErrorNamingIt) {
  expect_get_fails_naming_the_proxy(Mode::kHugeContentLength, ErrorKind::kProtocol,
                                    says_too_large());
}

TEST_F(HostileEtcdTest, HugeContentLengthFromTheFirstEndpointMovesTheCallToTheNext) {
  expect_get_moves_to_the_real_member(Mode::kHugeContentLength);
}

// ---------------------------------------------------------------------------
// A reply body that never ends

// With the memory tests' 8 MiB limit: with the default 64 MiB this failed once
// under ThreadSanitizer in CI (its output was cut; 64 MiB read through an
// instrumented client can outlast the 5 s request timeout). What is checked
// here is the error that names the proxy, not the bound's size.
TEST_F(HostileEtcdTest, EndlessBodyFromTheOnlyEndpointIsProtocolErrorNamingIt) {
  expect_get_fails_naming_the_proxy(Mode::kEndlessBody, ErrorKind::kProtocol, says_too_large(),
                                    kRequestTimeout + kSlack, kMemoryTestReplyBytes);
}

TEST_F(HostileEtcdTest, EndlessBodyFromTheFirstEndpointMovesTheCallToTheNext) {
  expect_get_moves_to_the_real_member(Mode::kEndlessBody);
}

TEST_F(HostileEtcdTest, EndlessBodyFromTheOnlyEndpointKeepsMemoryBounded) {
  auto store = store_on({proxy().endpoint()}, kMemoryTestReplyBytes);
  proxy().set_mode(Mode::kEndlessBody);
  RssGrowth rss;
  Outcome outcome = run_call([&] { return store->get("k"); }, kRequestTimeout + kSlack);
  const std::int64_t growth = rss.stop();
  EXPECT_GT(proxy().hits(Mode::kEndlessBody), 0u);
  EXPECT_LT(growth, kMaxRssGrowth) << "resident memory grew by " << mib(growth)
                                   << " reading an endless reply; the call " << outcome.describe();
  EXPECT_FALSE(outcome.value) << outcome.describe();
  EXPECT_TRUE(outcome.kind) << outcome.describe();
}

// ---------------------------------------------------------------------------
// A member of another cluster

TEST_F(HostileEtcdTest, OtherClusterAsTheOnlyEndpointIsAnErrorNamingIt) {
  expect_get_fails_naming_the_proxy(Mode::kOtherCluster, std::nullopt,
                                    HasSubstr("another etcd cluster"));
}

TEST_F(HostileEtcdTest, OtherClusterAsTheFirstEndpointMovesTheCallToTheNext) {
  expect_get_moves_to_the_real_member(Mode::kOtherCluster);
}

// ---------------------------------------------------------------------------
// A stalled member (SIGSTOP): connections accepted, nothing answered

TEST_F(HostileEtcdTest, StalledOnlyEndpointIsNetworkErrorNamingIt) {
  // The first failure comes when no reply started within kReplyStart; the
  // request timeout counts from there.
  expect_get_fails_naming_the_proxy(Mode::kStall, ErrorKind::kNetwork, HasSubstr("EtcdStore::get"),
                                    kReplyStart + kRequestTimeout + kSlack);
}

TEST_F(HostileEtcdTest, StalledFirstEndpointMovesTheCallToTheNext) {
  expect_get_moves_to_the_real_member(Mode::kStall);
}

TEST_F(HostileEtcdTest, AStalledWatchIsAbandonedAndTheWaitResumesOnAnotherMember) {
  auto store = store_on({proxy().endpoint(), real()});
  auto writer = store_on({real()});
  BackgroundCall blocked([&] { return store->get("missing", kLongWait); });
  ASSERT_TRUE(eventually([&] { return proxy().relayed_watches() >= 1; }, 10s))
      << "the blocking get's watch never went through the proxy";
  proxy().set_mode(Mode::kStall);
  writer->set("missing", "found");
  const auto set_at = SteadyClock::now();
  Outcome outcome = blocked.finish(8s, [this] { proxy().shutdown(); });
  EXPECT_TRUE(outcome.in_time) << "the get still waited on the stalled member's watch "
                               << seconds_between(set_at, SteadyClock::now())
                               << " s after the set; it " << outcome.describe();
  EXPECT_EQ(outcome.value, "found") << outcome.describe();
}

// ---------------------------------------------------------------------------
// A watch message that never ends (no newline, ever)

TEST_F(HostileEtcdTest, EndlessWatchLineFromTheOnlyEndpointIsProtocolErrorWithBoundedMemory) {
  auto store = store_on({proxy().endpoint()}, kMemoryTestReplyBytes);
  proxy().set_mode(Mode::kEndlessWatchLine);
  RssGrowth rss;
  Outcome outcome =
      run_call([&] { return store->get("missing", kLongWait); }, kRequestTimeout + kSlack);
  const std::int64_t growth = rss.stop();
  EXPECT_GT(proxy().hits(Mode::kEndlessWatchLine), 0u);
  EXPECT_LT(growth, kMaxRssGrowth)
      << "resident memory grew by " << mib(growth) << " reading an endless watch message";
  EXPECT_TRUE(outcome.in_time) << outcome.describe();
  ASSERT_FALSE(outcome.value) << outcome.describe();
  EXPECT_EQ(outcome.kind, ErrorKind::kProtocol) << outcome.describe();
  EXPECT_THAT(outcome.error, HasSubstr(proxy().where()));
  EXPECT_THAT(outcome.error, says_too_large());
}

TEST_F(HostileEtcdTest,
       EndlessWatchLineFromTheFirstEndpointMovesTheWaitToTheNextWithBoundedMemory) {
  auto store = store_on({proxy().endpoint(), real()}, kMemoryTestReplyBytes);
  auto writer = store_on({real()});
  proxy().set_mode(Mode::kEndlessWatchLine);
  RssGrowth rss;
  BackgroundCall blocked([&] { return store->get("missing", kLongWait); });
  ASSERT_TRUE(eventually([&] { return proxy().hits(Mode::kEndlessWatchLine) >= 1; }, 10s))
      << "the blocking get's watch never reached the proxy";
  // The set comes while the client is (or was) reading the endless message.
  std::this_thread::sleep_for(1s);
  writer->set("missing", "found");
  Outcome outcome = blocked.finish(kRequestTimeout + kSlack, [this] { proxy().shutdown(); });
  const std::int64_t growth = rss.stop();
  EXPECT_TRUE(outcome.in_time) << outcome.describe();
  EXPECT_EQ(outcome.value, "found") << outcome.describe();
  EXPECT_LT(growth, kMaxRssGrowth)
      << "resident memory grew by " << mib(growth) << " reading an endless watch message";
}

// ---------------------------------------------------------------------------
// Credentials

TEST_F(HostileEtcdTest, NoCredentialReachesAMemberOfAnotherCluster) {
  // Before: a fresh connection authenticated (or sent its token) before the
  // endpoint proved its cluster, and watch streams never checked it at all.
  if (std::system("command -v etcdctl >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "etcdctl is not installed";
  const std::string etcdctl =
      "ETCDCTL_API=3 etcdctl --endpoints=" + cluster_->urls() + " >/dev/null 2>&1 ";
  ASSERT_EQ(std::system((etcdctl + "user add root:s3cret-pw").c_str()), 0);
  ASSERT_EQ(std::system((etcdctl + "auth enable").c_str()), 0);
  EtcdStoreOptions options;
  options.endpoints = {real(), proxy().endpoint()};
  options.prefix = "h/";
  options.username = "root";
  options.password = "s3cret-pw";
  options.request_timeout = 2s;
  options.connect_timeout = 5s;
  EtcdStore store(options);  // authenticates with the real member
  store.set("k", kValue);
  proxy().set_mode(Mode::kOtherCluster);
  cluster_->kill(0);  // every call now reaches the proxy, a member of another cluster
  EXPECT_THROW(store.set("k", "after"), NetworkError);
  EXPECT_THROW(store.get("missing", 1s), Error);
  ASSERT_GT(proxy().requests().size(), 0u) << "the client never tried the other cluster";
  for (const auto& seen : proxy().requests()) {
    EXPECT_EQ(seen.path, "/v3/maintenance/status") << "sent to another cluster: " << seen.body;
    EXPECT_EQ(seen.authorization, "") << "a token went to another cluster (" << seen.path << ")";
    EXPECT_EQ(seen.body.find("s3cret-pw"), std::string::npos)
        << "the password went to another cluster";
  }
}

}  // namespace
}  // namespace ddp
