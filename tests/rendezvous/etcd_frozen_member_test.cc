// The etcd rendezvous when the member a node watches freezes (SIGSTOP: its
// sockets stay open and say nothing). Two handlers made by the real factory
// on a real 3-member cluster; node A lists member 0 first, node B lists it
// last, so only A talks to the frozen member. Before: A's round watch read its
// stream with the whole wait (an hour) and never learned that the round ended.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "ddp/rendezvous/rendezvous_factory.h"
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
  const auto ended = SteadyClock::now();
  ASSERT_EQ(round_b->end(restart)->wait_until(SteadyClock::now() + 20s), "");
  const auto limit = kKeepAliveInterval * kKeepAliveAttempts + 2s;
  ASSERT_EQ(woken.get_future().wait_for(limit + 20s), std::future_status::ready)
      << "A never learned that its round ended";
  const auto seen = SteadyClock::now();
  const double after_end = std::chrono::duration<double>(seen - ended).count();
  const double after_freeze = std::chrono::duration<double>(seen - frozen).count();
  std::printf("round end seen %.2f s after it was written, %.2f s after the freeze\n", after_end,
              after_freeze);
  EXPECT_LE(after_end, std::chrono::duration<double>(limit).count());
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
