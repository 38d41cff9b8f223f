// The static and c10d rendezvous handlers against MemoryStore.
#include "ddp/rendezvous/rendezvous.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "ddp/common/error.h"
#include "ddp/store/memory_store.h"
#include "forwarding_store.h"

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
  // Short enough for quick tests, with a wide margin between a beat and death.
  p.instance_heartbeat_interval = std::chrono::milliseconds(20);
  p.instance_dead_after = std::chrono::milliseconds(500);
  return p;
}

RendezvousStore with(std::shared_ptr<Store> store) {
  RendezvousStore rs(std::move(store));
  rs.at("h", 1);
  return rs;
}

// Runs the next round of `handlers` (one per node) on threads; returns their infos.
std::vector<RendezvousInfo> form(std::vector<std::unique_ptr<RendezvousHandler>>& handlers) {
  std::vector<RendezvousInfo> infos(handlers.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < handlers.size(); ++i) {
    threads.emplace_back([&, i] { infos[i] = handlers[i]->join()->info(); });
  }
  for (auto& t : threads) t.join();
  return infos;
}

std::vector<std::unique_ptr<RendezvousHandler>> static_job(const std::shared_ptr<Store>& store,
                                                           int nodes, const std::string& tag) {
  std::vector<std::unique_ptr<RendezvousHandler>> handlers;
  for (int node = 0; node < nodes; ++node) {
    auto p = params(nodes, node, 1);
    p.local_addr = tag + "-node" + std::to_string(node);
    handlers.push_back(make_static_rendezvous(p, with(store)));
  }
  return handlers;
}

TEST(StaticRendezvous, RanksFollowGroupRankWithDifferentLocalSizes) {
  auto store = std::make_shared<MemoryStore>();
  const std::vector<int> sizes = {2, 1, 3};
  std::vector<RendezvousInfo> infos(3);
  std::vector<std::thread> threads;
  // Join in reverse order: ranks must not depend on arrival.
  for (int node = 2; node >= 0; --node) {
    threads.emplace_back([&, node] {
      auto handler = make_static_rendezvous(params(3, node, sizes[static_cast<std::size_t>(node)]),
                                            with(store));
      infos[static_cast<std::size_t>(node)] = handler->join()->info();
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
    EXPECT_EQ(info.instance, infos[0].instance);
    EXPECT_EQ(info.round_prefix, "rdzv/r/" + info.instance + "/round_0");
    EXPECT_EQ(info.worker_prefix, "rdzv/r/" + info.instance + "/round_0/workers");
  }
}

TEST(StaticRendezvous, EachRoundHasItsOwnPrefix) {
  auto store = std::make_shared<MemoryStore>();
  auto handler = make_static_rendezvous(params(1, 0, 1), with(store));
  auto first = handler->join()->info();
  auto second = handler->join()->info();
  EXPECT_EQ(first.round, 0);
  EXPECT_EQ(second.round, 1);
  EXPECT_FALSE(first.instance.empty());
  EXPECT_EQ(second.worker_prefix, "rdzv/r/" + first.instance + "/round_1/workers");
  // A single node claims no instance: not one store operation.
  EXPECT_EQ(store->num_keys(), 0);
}

TEST(StaticRendezvous, DuplicateNodeRankIsRejected) {
  auto store = std::make_shared<MemoryStore>();
  auto p = params(2, 1, 1);
  p.join_timeout = std::chrono::milliseconds(300);
  // The first node 1 waits for node 0, which never comes.
  std::thread t(
      [&] { EXPECT_THROW(make_static_rendezvous(p, with(store))->join()->info(), TimeoutError); });
  while (!store->check({"rdzv/r/instance"}))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::string node_1 = "rdzv/r/" + store->get("rdzv/r/instance") + "/round_0/node_1";
  while (!store->check({node_1})) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  try {
    make_static_rendezvous(p, with(store))->join()->info();
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
    handler->join()->info();
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

// Counts the arrivals (adds to a round's arrival counter) that reached the store.
class ArrivalCounter : public test::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    const std::int64_t value = ForwardingStore::add(key, delta);
    const std::string suffix = "/arrivals";
    if (key.size() >= suffix.size() &&
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) {
      ++arrivals_;
    }
    return value;
  }
  // Returns once `n` arrivals reached the store.
  void wait_for(int n) const {
    while (arrivals_.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

 private:
  std::atomic<int> arrivals_{0};
};

TEST(C10dRendezvous, RanksFollowArrivalOrder) {
  // Node i joins once node i-1's arrival is in the store: the order is the
  // test's, however slowly a thread starts.
  auto store = std::make_shared<ArrivalCounter>(std::make_shared<MemoryStore>());
  std::vector<RendezvousInfo> infos(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      store->wait_for(i);
      auto p = params(3, 0, i + 1);
      infos[static_cast<std::size_t>(i)] = make_c10d_rendezvous(p, with(store))->join()->info();
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

TEST(C10dRendezvous, RangeClosesAfterLastCallAndALateNodeIsAdmittedByAReform) {
  auto store = std::make_shared<MemoryStore>();
  auto p = params(1, 0, 2);
  p.max_nodes = 4;
  p.node_rank = -1;
  p.last_call_timeout = std::chrono::milliseconds(50);
  auto first = make_c10d_rendezvous(p, with(store));
  auto round = first->join();
  const RendezvousInfo info = round->info();
  EXPECT_EQ(info.group_world_size, 1);
  EXPECT_EQ(info.world_size, 2);
  // A node that arrives while the group is below max ends the running round
  // ("joined"); the first node rejoins and both form the next round at once.
  auto late = make_c10d_rendezvous(p, with(store));
  RendezvousInfo late_info;
  std::thread joiner([&] { late_info = late->join()->info(); });
  auto watch = round->watch([] {});
  for (int i = 0; i < 500 && !watch->ended(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(watch->ended());
  EXPECT_EQ(watch->ended()->kind, RoundEnd::Kind::kNodeJoined);
  auto second = first->join()->info();
  joiner.join();
  EXPECT_EQ(second.group_world_size, 2);
  EXPECT_EQ(second.group_rank, 0);
  EXPECT_EQ(late_info.group_rank, 1);
  EXPECT_EQ(late_info.world_size, 4);
  first->shutdown(std::chrono::seconds(1));
  late->shutdown(std::chrono::seconds(1));
}

// ------------------------------------------------------------ the job's counts

TEST(JobCounts, RoundTripAndRejectAnythingElse) {
  const JobCounts counts{3, 2, 1, 7};
  EXPECT_EQ(encode_job_counts(counts), "3 2 1 7");
  EXPECT_EQ(decode_job_counts("3 2 1 7"), counts);
  for (const char* bad : {"", "3", "3 2 1", "3 2 1 7 0", "3 2 -1 7", "3  2 1 7", "a 2 1 7",
                          "3 2 4 7", "1234567890 0 0 0", " 3 2 1 7", "3 2 1 7 ", "3 2 1 -1"}) {
    EXPECT_FALSE(decode_job_counts(bad)) << "'" << bad << "'";
  }
}

TEST(JobCounts, ARestartWithoutAStepExtendsTheRunAndAnyStepEndsIt) {
  using K = RoundEndCount::Kind;
  JobCounts c;
  c = counted(c, 0, {K::kRestart, false});
  c = counted(c, 1, {K::kMembershipChange, false});  // a re-form without a step: the run goes on
  c = counted(c, 2, {K::kRestart, false});
  EXPECT_EQ(c, (JobCounts{2, 1, 2, 2}));
  c = counted(c, 3, {K::kMembershipChange, true});  // steps in the re-formed round
  EXPECT_EQ(c, (JobCounts{2, 2, 0, 3}));
  c = counted(c, 4, {K::kRestart, true});
  EXPECT_EQ(c, (JobCounts{3, 2, 0, 4}));
}

// Every agent of a round counts its end; the job counts it once, whatever
// the order, however late an agent read the counts, and a node that joins
// later reads the job's counts.
TEST(JobCounts, EveryNodeCountsARoundEndAndTheJobCountsItOnce) {
  for (const bool c10d : {false, true}) {
    SCOPED_TRACE(c10d ? "c10d" : "static");
    auto store = std::make_shared<MemoryStore>();
    std::vector<std::unique_ptr<RendezvousHandler>> handlers;
    for (int node = 0; node < 2; ++node) {
      handlers.push_back(c10d ? make_c10d_rendezvous(params(2, node, 1), with(store))
                              : make_static_rendezvous(params(2, node, 1), with(store)));
    }
    const int round = form(handlers)[0].round;
    const RoundEndCount restart{RoundEndCount::Kind::kRestart, false};
    EXPECT_EQ(*handlers[0]->job_counts(), JobCounts{});
    EXPECT_EQ(handlers[1]->count_round_end({}, round, restart), (JobCounts{1, 0, 1, round}));
    // Node 0 read the counts only now, after node 1 counted the round's end:
    // it finds the round counted and does not count it again.
    EXPECT_EQ(*handlers[0]->job_counts(), (JobCounts{1, 0, 1, round}));
    EXPECT_EQ(handlers[0]->count_round_end({}, round, restart), (JobCounts{1, 0, 1, round}));
    // The next round's end, with a step seen, counted by both.
    const RoundEndCount change{RoundEndCount::Kind::kMembershipChange, true};
    EXPECT_EQ(handlers[0]->count_round_end({}, round + 1, change), (JobCounts{1, 1, 0, round + 1}));
    EXPECT_EQ(handlers[1]->count_round_end({}, round + 1, change), (JobCounts{1, 1, 0, round + 1}));
    // A late counter of the first round (a node that left) changes nothing.
    EXPECT_EQ(handlers[1]->count_round_end({}, round, restart), (JobCounts{1, 1, 0, round + 1}));
    for (auto& h : handlers) h->shutdown(std::chrono::seconds(1));
  }
}

TEST(JobCounts, ASingleNodeKeepsItsOwnAndTouchesNoStore) {
  auto store = std::make_shared<MemoryStore>();
  auto handler = make_c10d_rendezvous(params(1, 0, 1), with(store));
  handler->join();
  EXPECT_FALSE(handler->job_counts());
  EXPECT_EQ(
      handler->count_round_end(JobCounts{2, 0, 0, 4}, 5, {RoundEndCount::Kind::kRestart, true}),
      (JobCounts{3, 0, 0, 5}));
  EXPECT_EQ(store->num_keys(), 0);
}

TEST(JobCounts, AValueThatIsNoCountsIsAProtocolErrorNamingTheKey) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::unique_ptr<RendezvousHandler>> handlers;
  for (int node = 0; node < 2; ++node) {
    handlers.push_back(make_c10d_rendezvous(params(2, node, 1), with(store)));
  }
  form(handlers);
  store->set("rdzv/r/counts", "lots");
  try {
    handlers[0]->job_counts();
    FAIL() << "no error";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("rdzv/r/counts"), std::string::npos) << e.what();
  }
  for (auto& h : handlers) h->shutdown(std::chrono::seconds(1));
}

// ------------------------------------------------------------ job instances

TEST(JobInstance, SecondJobWithTheSameIdIsRefusedWhileTheFirstRuns) {
  auto store = std::make_shared<MemoryStore>();
  auto first = static_job(store, 2, "a");
  const auto a = form(first);
  auto second = static_job(store, 2, "b");
  try {
    second[1]->join()->info();
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("run id 'r' is already used by a running job"),
              std::string::npos)
        << e.what();
  }
  // The refusal touched nothing of the running job.
  EXPECT_EQ(store->get("rdzv/r/instance"), a[0].instance);
}

TEST(JobInstance, CrashedJobIsTakenOverAndItsRecordsAreNeverRead) {
  auto store = std::make_shared<MemoryStore>();
  std::string old_instance, old_node_0;
  {
    auto crashed = static_job(store, 2, "a");
    const auto a = form(crashed);
    old_instance = a[0].instance;
    old_node_0 = a[0].round_prefix + "/node_0";
    // Destroyed without shutdown(): the heartbeat stops, every key stays, as
    // after a SIGKILL.
  }
  ASSERT_TRUE(store->check({old_node_0, "rdzv/r/instance"}));
  auto restarted = static_job(store, 2, "b");
  const auto b = form(restarted);
  EXPECT_NE(b[0].instance, old_instance);
  EXPECT_EQ(b[1].instance, b[0].instance);
  EXPECT_EQ(store->get("rdzv/r/instance"), b[0].instance);
  for (const auto& info : b) {
    EXPECT_EQ(info.master_addr, "b-node0") << "a stale record of the crashed job was read";
  }
  // The taker deletes what it can name of the old instance (on its keeper thread).
  for (int i = 0; i < 200 && store->check({old_node_0}); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(store->check({old_node_0}));
  EXPECT_FALSE(store->check({"rdzv/r/" + old_instance + "/heartbeat"}));
}

TEST(JobInstance, CrashBeforeTheFirstRoundFormedIsTakenOverToo) {
  auto store = std::make_shared<MemoryStore>();
  // What a job leaves when its node 0 is killed while waiting for node 1: a
  // forming instance whose heartbeat stands still and a record of a dead node.
  store->set("rdzv/r/instance", "dead");
  store->set("rdzv/r/dead/heartbeat", "7");
  store->set("rdzv/r/dead/round_0/node_0", "1 4242 dead-node 1");
  auto restarted = static_job(store, 2, "b");
  const auto b = form(restarted);
  EXPECT_NE(b[0].instance, "dead");
  for (const auto& info : b) EXPECT_EQ(info.master_addr, "b-node0");
  for (int i = 0; i < 200 && store->check({"rdzv/r/dead/round_0/node_0"}); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(store->check({"rdzv/r/dead/round_0/node_0"}));
}

TEST(JobInstance, FinishedRoundsAndFinishedJobsLeaveNoKeys) {
  auto store = std::make_shared<MemoryStore>();
  auto job = static_job(store, 2, "a");
  const auto round0 = form(job);
  const auto round1 = form(job);
  EXPECT_EQ(round1[0].round, 1);
  EXPECT_EQ(round1[0].instance, round0[0].instance);
  // Group rank 0 deletes round 0 once round 1 formed.
  const std::string old_record = round0[0].round_prefix + "/node_1";
  for (int i = 0; i < 200 && store->check({old_record}); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(store->check({old_record}));
  EXPECT_TRUE(store->check({round1[0].round_prefix + "/node_1"}));
  // The last node to leave deletes everything else, the instance included.
  job[1]->shutdown(std::chrono::seconds(5));
  EXPECT_TRUE(store->check({"rdzv/r/instance"})) << "node 0 has not left yet";
  job[0]->shutdown(std::chrono::seconds(5));
  EXPECT_EQ(store->num_keys(), 0);
  // The same id starts again at once: no instance to judge, no waiting.
  auto next = static_job(store, 2, "b");
  const auto start = std::chrono::steady_clock::now();
  const auto b = form(next);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(400));
  EXPECT_NE(b[0].instance, round0[0].instance);
  EXPECT_EQ(b[0].master_addr, "b-node0");
}

// Nodes of one job arrive at different times: a joiner confirms the creator's
// heartbeat while the round forms, which must cost far less than the time a
// dead instance needs to be declared dead.
TEST(JobInstance, MultiNodeStartIsNotDelayedByTheLivenessCheck) {
  for (const bool c10d : {false, true}) {
    auto store = std::make_shared<MemoryStore>();
    std::vector<std::unique_ptr<RendezvousHandler>> handlers;
    for (int node = 0; node < 2; ++node) {
      auto p = params(2, node, 1);
      p.instance_heartbeat_interval = std::chrono::seconds(3);
      p.instance_dead_after = std::chrono::seconds(15);
      handlers.push_back(c10d ? make_c10d_rendezvous(p, with(store))
                              : make_static_rendezvous(p, with(store)));
    }
    std::chrono::steady_clock::time_point second_start, second_done;
    std::thread first([&] { handlers[0]->join()->info(); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    second_start = std::chrono::steady_clock::now();
    handlers[1]->join()->info();
    second_done = std::chrono::steady_clock::now();
    first.join();
    EXPECT_LT(second_done - second_start, std::chrono::milliseconds(1500)) << "c10d: " << c10d;
  }
}

TEST(JobInstance, HeartbeatParamsAreChecked) {
  auto store = std::make_shared<MemoryStore>();
  auto p = params(2, 0, 1);
  p.instance_dead_after = p.instance_heartbeat_interval;
  EXPECT_THROW(make_static_rendezvous(p, with(store)), InvalidArgument);
}

TEST(Rendezvous, FindFreePort) { EXPECT_GT(find_free_port("127.0.0.1"), 0); }

}  // namespace
}  // namespace ddp
