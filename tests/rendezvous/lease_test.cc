// The dynamic rendezvous on a store with leases (the etcd backend's liveness),
// with a fake clock: FakeLeaseStore (tests/support/fake_lease_store.h) is a
// MemoryStore with leases that expire by FakeTime and watches that push events
// synchronously (thread-safe: the handlers delete old rounds on threads of
// their own). Several handlers share it in one thread; the test drives their
// steps and the clock. No sleeps.
#include "dynamic_rendezvous.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/store/memory_store.h"
#include "fake_lease_store.h"

namespace ddp::rendezvous_detail {
namespace {

using namespace std::chrono_literals;

using ::ddp::test::FakeLeaseStore;

// A node's workers' store, which nobody connects to here: only its port is announced.
class FakeWorkerStore final : public HostedStore {
 public:
  explicit FakeWorkerStore(std::uint16_t port) : port_(port) {}
  std::uint16_t port() const override { return port_; }

 private:
  std::uint16_t port_;
};

class LeaseCluster {
 public:
  LeaseCluster(int min_nodes, int max_nodes) : min_(min_nodes), max_(max_nodes) {}

  // A new node; its workers' store would listen on port 4000 + its index.
  DynamicRendezvous& add_node(int min_nodes = 0, int max_nodes = 0) {
    RendezvousParams p;
    p.run_id = "job";
    p.min_nodes = min_nodes ? min_nodes : min_;
    p.max_nodes = max_nodes ? max_nodes : max_;
    p.node_rank = -1;
    p.local_world_size = 1;
    p.local_addr = "10.0.0." + std::to_string(nodes_.size() + 1);
    p.worker_master_port = 29500;
    p.join_timeout = 600s;
    p.last_call_timeout = 30s;
    p.keep_alive_interval = 5s;
    p.keep_alive_max_attempt = 3;  // a 15 s lease
    RendezvousStore rs(store_);
    rs.external("fake etcd", std::make_shared<FakeWorkerStore>(
                                 static_cast<std::uint16_t>(4000 + nodes_.size())));
    nodes_.push_back(std::make_unique<DynamicRendezvous>(p, rs, time_, "etcd"));
    return *nodes_.back();
  }

  DynamicRendezvous& node(int i) { return *nodes_[static_cast<std::size_t>(i)]; }
  FakeLeaseStore& store() { return *store_; }

  std::map<int, RendezvousInfo> form(const std::vector<int>& which) {
    std::map<int, RendezvousInfo> infos;
    for (int pass = 0; pass < 4 && infos.size() < which.size(); ++pass) {
      for (int i : which) {
        if (infos.count(i) == 0) {
          if (auto info = node(i).step()) infos[i] = *info;
        }
      }
    }
    return infos;
  }

  // The nodes in `alive` refresh their leases (when due) once per second of
  // fake time for `duration`; leases past their deadline expire.
  void run(const std::vector<int>& alive, Duration duration) {
    for (Duration t = 0s; t < duration; t += 1s) {
      for (int i : alive) node(i).liveness_tick(*store_);
      time_.advance(1s);
      store_->expire();
    }
  }

  std::optional<std::string> end_of(const RendezvousInfo& info) {
    if (!store_->check({info.round_prefix + "/end"})) return std::nullopt;
    return store_->get(info.round_prefix + "/end", 0ms);
  }

 private:
  int min_;
  int max_;
  FakeTime time_;
  std::shared_ptr<FakeLeaseStore> store_ = std::make_shared<FakeLeaseStore>(time_);
  std::vector<std::unique_ptr<DynamicRendezvous>> nodes_;
};

std::string alive_key(const std::string& member) { return "rdzv/job/alive/" + member; }

TEST(LeaseRendezvous, EveryNodesKeyLivesOnItsLease) {
  LeaseCluster c(2, 3);
  for (int i = 0; i < 3; ++i) c.add_node().begin_join();
  for (int i = 0; i < 3; ++i) {
    const auto lease = c.store().get(alive_key(c.node(i).member()), 0ms);
    EXPECT_EQ(c.store().lease_time_left(std::stoll(lease)), 15) << "the key holds its lease's id";
  }
}

TEST(LeaseRendezvous, ANodeThatStopsRefreshingIsLostWhenItsLeaseExpires) {
  LeaseCluster c(2, 3);
  for (int i = 0; i < 3; ++i) c.add_node().begin_join();
  auto infos = c.form({0, 1, 2});
  ASSERT_EQ(infos.size(), 3u);
  const std::string lost = c.node(2).member();
  c.run({0, 1, 2}, 30s);
  EXPECT_FALSE(c.end_of(infos[0])) << "refreshed leases never expire";
  // Node 2 freezes. Its lease (15 s) was last refreshed at most 5 s ago.
  c.run({0, 1}, 9s);
  EXPECT_FALSE(c.end_of(infos[0])) << "the lease has not expired yet";
  c.run({0, 1}, 6s);
  auto end = c.end_of(infos[0]);
  ASSERT_TRUE(end) << "node 1 watches node 2's key and ends the round on its DELETE";
  EXPECT_EQ(*end, "lost 2 " + lost);
}

TEST(LeaseRendezvous, WorkersUseGroupRankZerosStoreWhichMovesWhenThatNodeIsLost) {
  LeaseCluster c(2, 3);
  for (int i = 0; i < 3; ++i) c.add_node().begin_join();
  auto first = c.form({0, 1, 2});
  ASSERT_EQ(first.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(first[i].store_addr, "10.0.0.1");
    EXPECT_EQ(first[i].store_port, 4000);
  }
  c.run({1, 2}, 20s);  // node 0 (group rank 0) is gone
  auto end = c.end_of(first[0]);
  ASSERT_TRUE(end);
  EXPECT_EQ(end->rfind("lost 0 ", 0), 0u) << *end;
  c.node(2).begin_join();
  c.node(1).begin_join();
  auto second = c.form({1, 2});
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[1].group_rank, 0);
  for (int i : {1, 2}) {
    EXPECT_EQ(second[i].store_addr, "10.0.0.2") << "the workers' store moved to the new rank 0";
    EXPECT_EQ(second[i].store_port, 4001);
  }
}

TEST(LeaseRendezvous, ANodeWhoseLeaseExpiredRejoinsAsANewMemberOnANewLease) {
  LeaseCluster c(2, 3);
  for (int i = 0; i < 3; ++i) c.add_node().begin_join();
  auto first = c.form({0, 1, 2});
  c.run({0, 1}, 20s);  // node 2 was frozen (SIGSTOP) past its lease
  ASSERT_TRUE(c.end_of(first[0]));
  c.node(0).begin_join();
  c.node(1).begin_join();
  auto second = c.form({0, 1});
  ASSERT_EQ(second.size(), 2u);
  // Node 2 wakes up (SIGCONT): its refresh finds the lease gone.
  const std::string old_member = c.node(2).member();
  c.node(2).liveness_tick(c.store());
  c.node(2).begin_join();
  const std::string new_member = c.node(2).member();
  EXPECT_NE(new_member, old_member);
  EXPECT_FALSE(c.store().check({alive_key(old_member)}));
  ASSERT_TRUE(c.store().check({alive_key(new_member)}));
  EXPECT_GE(c.store().lease_time_left(std::stoll(c.store().get(alive_key(new_member), 0ms))), 14);
  auto end = c.end_of(second[0]);
  ASSERT_TRUE(end);
  EXPECT_EQ(*end, "joined " + new_member) << "the group below max re-forms with it";
  c.node(0).begin_join();
  c.node(1).begin_join();
  auto third = c.form({0, 1, 2});
  ASSERT_EQ(third.size(), 3u);
  EXPECT_EQ(third[2].group_rank, 2);
  // And it is watched like any member.
  c.run({0, 1}, 20s);
  auto lost = c.end_of(third[0]);
  ASSERT_TRUE(lost);
  EXPECT_EQ(*lost, "lost 2 " + new_member);
}

TEST(LeaseRendezvous, AKeyAlreadyGoneWhenTheRoundFormsIsSeenAtOnce) {
  LeaseCluster c(1, 2);
  c.add_node().begin_join();
  c.add_node().begin_join();
  // Node 1's lease is revoked before the round forms and before any watch exists.
  const auto lease = std::stoll(c.store().get(alive_key(c.node(1).member()), 0ms));
  c.store().revoke_lease(lease);
  auto infos = c.form({0});
  ASSERT_EQ(infos.size(), 1u);
  auto end = c.end_of(infos[0]);
  ASSERT_TRUE(end) << "the check after starting the watch saw the key missing";
  EXPECT_EQ(end->rfind("lost 1 ", 0), 0u) << *end;
}

TEST(LeaseRendezvous, ALiveJobsRunIdIsRefusedToAnotherJobAndFreedWhenItDies) {
  LeaseCluster c(2, 2);
  c.add_node().begin_join();
  c.add_node().begin_join();
  ASSERT_EQ(c.form({0, 1}).size(), 2u);
  DynamicRendezvous& other = c.add_node(1, 3);
  try {
    other.begin_join();
    FAIL() << "expected the run id to be refused";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("run id 'job' is in use on the store at fake etcd by another running job "
                        "(nnodes=2:2); this node runs (nnodes=1:3): use another --rdzv_id"),
              std::string::npos)
        << what;
  }
  // The job's nodes die: their leases expire, and the run id is free.
  c.run({}, 16s);
  EXPECT_NO_THROW(other.begin_join());
  EXPECT_EQ(c.store().get("rdzv/job/config", 0ms), "nnodes=1:3");
}

TEST(LeaseRendezvous, LeavingRevokesTheLeaseAndStopsWatching) {
  LeaseCluster c(2, 2);
  c.add_node().begin_join();
  c.add_node().begin_join();
  ASSERT_EQ(c.form({0, 1}).size(), 2u);
  EXPECT_EQ(c.store().watch_count(), 2u) << "each node watches its neighbour";
  const std::string member = c.node(0).member();
  c.node(0).shutdown(5s);
  EXPECT_EQ(c.store().watch_count(), 1u);
  EXPECT_FALSE(c.store().check({alive_key(member)})) << "revoking the lease deleted the key";
}

TEST(LeaseRendezvous, ADeadJobsKeysAreCollectedWhenAnotherJobTakesItsRunIdOver) {
  // Before: the new job took the run id (compare_set of the config) and the
  // dead job's rounds stayed in etcd forever.
  LeaseCluster c(2, 2);
  c.add_node().begin_join();
  c.add_node().begin_join();
  auto first = c.form({0, 1});
  ASSERT_EQ(first.size(), 2u);
  const std::string round = first[0].round_prefix;
  ASSERT_TRUE(c.store().check({round + "/closed", "rdzv/job/current"}));
  c.run({}, 20s);  // both nodes die: their leases expire, their alive keys go
  // A job with another node range (another signature) reuses the run id.
  DynamicRendezvous& newcomer = c.add_node(1, 1 + 1 + 1);
  newcomer.begin_join();
  // Only the new job's keys: its claim, its keep-alive, its arrival in a
  // first round of its own (no "current" left to continue from).
  EXPECT_EQ(c.store().keys(),
            (std::set<std::string>{"rdzv/job/config", alive_key(newcomer.member()),
                                   "rdzv/job/round_0/rec_0"}));
  EXPECT_EQ(c.store().get("rdzv/job/config", 0ms), "nnodes=1:3");
}

}  // namespace
}  // namespace ddp::rendezvous_detail
