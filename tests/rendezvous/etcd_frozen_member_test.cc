// The etcd rendezvous when the member a node watches freezes (SIGSTOP: its
// sockets stay open and say nothing). Two handlers made by the real factory
// on a real 3-member cluster; node A lists member 0 first, node B lists it
// last, so only A talks to the frozen member. Before: A's round watch read its
// stream with the whole wait (an hour) and never learned that the round ended.
// The bound is the store's promise (a frozen member is left at most twice
// watch_check_interval after it froze) counted from the moment B's end was
// committed: when the frozen member was etcd's leader, the write itself waits
// for an election, and the CI run of 7ef5d88 failed here by counting that wait.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "ddp/rendezvous/rendezvous_factory.h"
#include "ddp/store_etcd/etcd_store.h"
#include "etcd_cluster.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

constexpr auto kKeepAliveInterval = 1s;
constexpr int kKeepAliveAttempts = 3;

std::unique_ptr<RendezvousHandler> node(const std::string& endpoints) {
  RendezvousConfig config;
  config.backend = "etcd";
  config.etcd.endpoints = endpoints;
  config.read_timeout = 10s;
  config.params.run_id = "frozen";
  config.params.min_nodes = 2;
  config.params.max_nodes = 2;
  config.params.node_rank = -1;
  config.params.local_addr = "127.0.0.1";
  config.params.join_timeout = 60s;
  config.params.keep_alive_interval = kKeepAliveInterval;
  config.params.keep_alive_max_attempt = kKeepAliveAttempts;
  return create_rendezvous(config);
}

TEST(EtcdFrozenMember, ARoundsEndIsSeenByTheNodeWhoseMemberFroze) {
  DDP_SKIP_WITHOUT_ETCD();
  test::EtcdCluster cluster(3);
  const auto m = cluster.client_endpoints();
  auto text = [](const EtcdEndpoint& e) { return e.host + ":" + std::to_string(e.port); };
  auto a = node(text(m[0]) + "," + text(m[1]) + "," + text(m[2]));
  auto b = node(text(m[1]) + "," + text(m[2]) + "," + text(m[0]));
  auto joined_a = std::async(std::launch::async, [&] { return a->join(); });
  auto joined_b = std::async(std::launch::async, [&] { return b->join(); });
  ASSERT_EQ(joined_a.wait_for(60s), std::future_status::ready);
  ASSERT_EQ(joined_b.wait_for(60s), std::future_status::ready);
  const auto round_a = joined_a.get();
  const auto round_b = joined_b.get();
  const RendezvousInfo& info_a = round_a->info();
  const RendezvousInfo& info_b = round_b->info();
  ASSERT_EQ(info_a.round_prefix, info_b.round_prefix);

  std::promise<void> woken;
  std::atomic<bool> once{false};
  auto watch = round_a->watch([&] {
    if (!once.exchange(true)) woken.set_value();
  });
  std::this_thread::sleep_for(1s);  // A's watch waits on member 0
  cluster.freeze(0);
  const auto frozen = SteadyClock::now();
  std::this_thread::sleep_for(1s);
  RoundEnd restart;
  restart.kind = RoundEnd::Kind::kRestart;
  restart.node = info_b.group_rank;
  restart.value = 3;
  const auto asked = SteadyClock::now();
  ASSERT_EQ(round_b->end(restart)->wait_until(SteadyClock::now() + 20s), "");
  const auto written = SteadyClock::now();
  // Twice the check interval after the freeze at most, and the freeze came
  // before the write: from the write, that and a margin for a loaded machine.
  const auto limit = 2 * EtcdStoreOptions{}.watch_check_interval + 3s;
  ASSERT_EQ(woken.get_future().wait_for(limit + 20s), std::future_status::ready)
      << "A never learned that its round ended";
  const auto seen = SteadyClock::now();
  auto seconds = [](SteadyClock::duration d) { return std::chrono::duration<double>(d).count(); };
  std::printf(
      "round end written in %.2f s; seen %.2f s after it was written, %.2f s after the freeze\n",
      seconds(written - asked), seconds(seen - written), seconds(seen - frozen));
  EXPECT_LE(seconds(seen - written), seconds(limit));
  auto end = watch->ended();
  ASSERT_TRUE(end);
  // B's end, or (if A's own lease lapsed while its member was frozen) B's
  // verdict that A was lost: either way A learned that the round ended.
  EXPECT_TRUE(end->kind == RoundEnd::Kind::kRestart || end->kind == RoundEnd::Kind::kNodeLost)
      << describe(*end);
  cluster.thaw(0);
  watch.reset();
  a->shutdown(5s);
  b->shutdown(5s);
}

}  // namespace
}  // namespace ddp
