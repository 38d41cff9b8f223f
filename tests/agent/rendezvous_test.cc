// The static and c10d rendezvous handlers against MemoryStore.
#include "ddp/rendezvous/rendezvous.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "ddp/common/error.h"
#include "ddp/rendezvous/memory_store.h"

namespace ddp {
namespace {

RendezvousParams params(int nodes, int node_rank, int nproc) {
  RendezvousParams p;
  p.run_id = "r";
  p.min_nodes = p.max_nodes = nodes;
  p.node_rank = node_rank;
  p.local_world_size = nproc;
  p.local_addr = "node" + std::to_string(node_rank);
  p.join_timeout = std::chrono::seconds(5);
  return p;
}

RendezvousStore with(std::shared_ptr<Store> store) {
  RendezvousStore rs;
  rs.store = std::move(store);
  rs.host = "h";
  rs.port = 1;
  return rs;
}

TEST(StaticRendezvous, RanksFollowGroupRankWithDifferentLocalSizes) {
  auto store = std::make_shared<MemoryStore>();
  const std::vector<int> sizes = {2, 1, 3};
  std::vector<RendezvousInfo> infos(3);
  std::vector<std::thread> threads;
  // Join in reverse order: ranks must not depend on arrival.
  for (int node = 2; node >= 0; --node) {
    threads.emplace_back([&, node] {
      auto handler = make_static_rendezvous(params(3, node, sizes[static_cast<std::size_t>(node)]), with(store));
      infos[static_cast<std::size_t>(node)] = handler->next_rendezvous();
    });
  }
  for (auto& t : threads) t.join();
  const std::vector<int> base = {0, 2, 3};
  for (int node = 0; node < 3; ++node) {
    const auto& info = infos[static_cast<std::size_t>(node)];
    EXPECT_EQ(info.group_rank, node);
    EXPECT_EQ(info.group_world_size, 3);
    EXPECT_EQ(info.world_size, 6);
    EXPECT_EQ(info.base_rank, base[static_cast<std::size_t>(node)]);
    EXPECT_EQ(info.local_world_sizes, sizes);
    EXPECT_EQ(info.master_addr, "node0");
    EXPECT_EQ(info.master_port, infos[0].master_port);
    EXPECT_GT(info.master_port, 0);
    EXPECT_EQ(info.round_prefix, "rdzv/r/round_0");
    EXPECT_EQ(info.worker_prefix, "rdzv/r/round_0/workers");
  }
}

TEST(StaticRendezvous, EachRoundHasItsOwnPrefix) {
  auto store = std::make_shared<MemoryStore>();
  auto handler = make_static_rendezvous(params(1, 0, 1), with(store));
  auto first = handler->next_rendezvous();
  auto second = handler->next_rendezvous();
  EXPECT_EQ(first.round, 0);
  EXPECT_EQ(second.round, 1);
  EXPECT_EQ(second.worker_prefix, "rdzv/r/round_1/workers");
}

TEST(StaticRendezvous, DuplicateNodeRankIsRejected) {
  auto store = std::make_shared<MemoryStore>();
  auto p = params(2, 1, 1);
  p.join_timeout = std::chrono::milliseconds(300);
  // The first node 1 waits for node 0, which never comes.
  std::thread t([&] { EXPECT_THROW(make_static_rendezvous(p, with(store))->next_rendezvous(), TimeoutError); });
  while (!store->check({"rdzv/r/round_0/node_1"})) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  try {
    make_static_rendezvous(p, with(store))->next_rendezvous();
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("node rank 1 already joined round 0"), std::string::npos)
        << e.what();
  }
  t.join();
}

TEST(StaticRendezvous, TimeoutNamesMissingNodes) {
  auto store = std::make_shared<MemoryStore>();
  auto p = params(3, 1, 1);
  p.join_timeout = std::chrono::milliseconds(100);
  auto handler = make_static_rendezvous(p, with(store));
  try {
    handler->next_rendezvous();
    ADD_FAILURE() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("missing: node_0, node_2"), std::string::npos) << e.what();
  }
}

TEST(StaticRendezvous, BadParams) {
  auto store = std::make_shared<MemoryStore>();
  EXPECT_THROW(make_static_rendezvous(params(2, 2, 1), with(store)), InvalidArgument);
  EXPECT_THROW(make_static_rendezvous(params(2, 0, 0), with(store)), InvalidArgument);
  EXPECT_THROW(make_static_rendezvous(params(1, 0, 1), RendezvousStore{}), InvalidArgument);
  auto range = params(2, 0, 1);
  range.min_nodes = 1;
  EXPECT_THROW(make_static_rendezvous(range, with(store)), InvalidArgument);
}

TEST(C10dRendezvous, RanksFollowArrivalOrder) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<RendezvousInfo> infos(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30 * i));
      auto p = params(3, 0, i + 1);
      infos[static_cast<std::size_t>(i)] = make_c10d_rendezvous(p, with(store))->next_rendezvous();
    });
  }
  for (auto& t : threads) t.join();
  std::set<int> ranks;
  for (const auto& info : infos) {
    ranks.insert(info.group_rank);
    EXPECT_EQ(info.world_size, 6);
    EXPECT_EQ(info.group_world_size, 3);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(infos[0].group_rank, 0);  // arrived first
}

TEST(C10dRendezvous, RangeClosesAfterLastCall) {
  auto store = std::make_shared<MemoryStore>();
  auto p = params(1, 0, 2);
  p.max_nodes = 4;
  p.last_call_timeout = std::chrono::milliseconds(50);
  auto info = make_c10d_rendezvous(p, with(store))->next_rendezvous();
  EXPECT_EQ(info.group_world_size, 1);
  EXPECT_EQ(info.world_size, 2);
  // A late joiner of the closed round is told so.
  auto late = make_c10d_rendezvous(p, with(store));
  EXPECT_THROW(late->next_rendezvous(), InvalidArgument);
}

TEST(Rendezvous, FindFreePort) {
  EXPECT_GT(find_free_port("127.0.0.1"), 0);
}

}  // namespace
}  // namespace ddp
