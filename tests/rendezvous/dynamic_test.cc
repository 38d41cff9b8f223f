// The dynamic (c10d) rendezvous with a fake clock: several handlers share one
// MemoryStore in one thread, and the test drives their steps (begin_join, step,
// liveness_tick) and the clock. No sleeps; no threads but in the one test of join().
#include "dynamic_rendezvous.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/store/memory_store.h"
#include "membership.h"

namespace ddp::rendezvous_detail {
namespace {

using namespace std::chrono_literals;

struct Options {
  int min_nodes = 1;
  int max_nodes = 3;
};

class Cluster {
 public:
  explicit Cluster(Options options) : options_(options) {}

  // A new node (agent) of the job; `node_rank` -1: not given.
  DynamicRendezvous& add_node(int node_rank = -1) {
    RendezvousParams p;
    p.run_id = "job";
    p.min_nodes = options_.min_nodes;
    p.max_nodes = options_.max_nodes;
    p.node_rank = node_rank;
    p.local_world_size = 2;
    p.local_addr = "10.0.0." + std::to_string(nodes_.size() + 1);
    p.worker_master_port = 29500;
    p.join_timeout = 600s;
    p.last_call_timeout = 30s;
    p.keep_alive_interval = 5s;
    p.keep_alive_max_attempt = 3;
    RendezvousStore rs(store_);
    nodes_.push_back(std::make_unique<DynamicRendezvous>(p, rs, time_));
    return *nodes_.back();
  }

  DynamicRendezvous& node(int i) { return *nodes_[static_cast<std::size_t>(i)]; }
  FakeTime& time() { return time_; }
  Store& store() { return *store_; }

  // Steps the given joining nodes until each has formed (or `max_passes` runs out).
  std::map<int, RendezvousInfo> form(const std::vector<int>& which, int max_passes = 4) {
    std::map<int, RendezvousInfo> infos;
    for (int pass = 0; pass < max_passes && infos.size() < which.size(); ++pass) {
      for (int i : which) {
        if (infos.count(i)) continue;
        if (auto info = node(i).step()) infos[i] = *info;
      }
    }
    return infos;
  }

  // Every node in `alive` ticks its liveness once per second of fake time for `duration`.
  void run_liveness(const std::vector<int>& alive, Duration duration) {
    for (Duration t = 0s; t < duration; t += 1s) {
      for (int i : alive) node(i).liveness_tick(*store_);
      time_.advance(1s);
    }
    for (int i : alive) node(i).liveness_tick(*store_);
  }

  std::optional<std::string> end_of(const RendezvousInfo& info) {
    if (!store_->check({info.round_prefix + "/end"})) return std::nullopt;
    return store_->get(info.round_prefix + "/end", 0ms);
  }

 private:
  Options options_;
  FakeTime time_;
  std::shared_ptr<Store> store_ = std::make_shared<MemoryStore>();
  std::vector<std::unique_ptr<DynamicRendezvous>> nodes_;
};

// ---- the decision alone ---------------------------------------------------------------------

Arrival arrival(const std::string& member, int node_rank = -1) {
  Arrival a;
  a.member = member;
  a.node_rank = node_rank;
  a.addr = "h";
  return a;
}

TEST(DecideRound, WaitsBelowMinAndClosesAtMaxAtOnce) {
  const RoundRule rule{2, 3};
  EXPECT_FALSE(decide_round({arrival("a")}, {}, rule, true));
  EXPECT_FALSE(decide_round({arrival("a"), arrival("b")}, {}, rule, false));
  EXPECT_EQ(decide_round({arrival("a"), arrival("b")}, {}, rule, true), (std::vector<int>{0, 1}));
  EXPECT_EQ(decide_round({arrival("a"), arrival("b"), arrival("c"), arrival("d")}, {}, rule, false),
            (std::vector<int>{0, 1, 2}));
}

TEST(DecideRound, SurvivorsCloseAtOnceAndKeepTheirOrder) {
  const RoundRule rule{1, 4};
  Lineage previous{{"c", "a", "lost", "b"}, "lost"};
  // Arrival order b, a, c; the survivors' previous order was c, a, b.
  EXPECT_EQ(decide_round({arrival("b"), arrival("a"), arrival("c")}, previous, rule, false),
            (std::vector<int>{2, 1, 0}));
  // Not every survivor is here: wait for them or for last call.
  EXPECT_FALSE(decide_round({arrival("b"), arrival("a")}, previous, rule, false));
}

TEST(DecideRound, SurvivorsComeBeforeNewcomersAndNodeRanksComeFirst) {
  const RoundRule rule{1, 3};
  Lineage previous{{"a", "b"}, ""};
  // A newcomer x arrived first; at max, survivors are kept first.
  EXPECT_EQ(
      decide_round({arrival("x"), arrival("b"), arrival("a"), arrival("y")}, previous, rule, false),
      (std::vector<int>{2, 1, 0}));
  // --node_rank where given orders the group.
  EXPECT_EQ(decide_round({arrival("p", 2), arrival("q", 0), arrival("r", 1)}, {}, rule, false),
            (std::vector<int>{1, 2, 0}));
}

TEST(LastCallAndHeartbeat, FollowTheFakeClock) {
  FakeTime time;
  LastCall call(2, 30s);
  call.observe(1, time.now());
  EXPECT_EQ(call.deadline(), Clock::time_point::max());
  call.observe(2, time.now());
  time.advance(29s);
  EXPECT_FALSE(call.over(time.now()));
  time.advance(1s);
  EXPECT_TRUE(call.over(time.now()));

  HeartbeatTracker tracker(5s, 3, time.now());
  tracker.observe(std::string("1"), time.now());
  time.advance(14s);
  tracker.observe(std::string("1"), time.now());  // no change
  EXPECT_EQ(tracker.missed(time.now()), 2);
  EXPECT_FALSE(tracker.dead(time.now()));
  time.advance(1s);
  EXPECT_TRUE(tracker.dead(time.now()));
  tracker.observe(std::string("2"), time.now());  // it moved: alive again
  EXPECT_FALSE(tracker.dead(time.now()));
  time.advance(500ms);
  EXPECT_EQ(tracker.missed(time.now()), 0);
}

// ---- the handler -------------------------------------------------------------------------------

TEST(DynamicRendezvous, RoundClosesAtMaxWithRanksByArrival) {
  Cluster c({2, 3});
  for (int i = 0; i < 3; ++i) c.add_node().begin_join();
  auto infos = c.form({0, 1, 2});
  ASSERT_EQ(infos.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(infos[i].group_rank, i);
    EXPECT_EQ(infos[i].group_world_size, 3);
    EXPECT_EQ(infos[i].world_size, 6);
    EXPECT_EQ(infos[i].base_rank, 2 * i);
    EXPECT_EQ(infos[i].master_addr, "10.0.0.1");
    EXPECT_EQ(infos[i].master_port, 29500);
    EXPECT_EQ(infos[i].round_prefix, infos[0].round_prefix);
  }
}

TEST(DynamicRendezvous, RoundAtMinClosesWhenLastCallIsOver) {
  Cluster c({2, 3});
  c.add_node().begin_join();
  c.add_node().begin_join();
  EXPECT_TRUE(c.form({0, 1}).empty()) << "two of three: last call has just begun";
  c.time().advance(29s);
  EXPECT_TRUE(c.form({0, 1}).empty());
  c.time().advance(1s);
  auto infos = c.form({0, 1});
  ASSERT_EQ(infos.size(), 2u);
  EXPECT_EQ(infos[1].group_world_size, 2);
  EXPECT_EQ(infos[1].world_size, 4);
}

// Before its first round an elastic job waits (for min_nodes, then for the
// last call): the join says what it waits for and for how long, once per
// kind of wait, not at every step.
TEST(DynamicRendezvous, AJoinSaysOnceWhatItWaitsForAndForHowLong) {
  Cluster c({2, 3});
  std::vector<std::string> first, second;
  c.add_node().on_wait([&](const std::string& line) { first.push_back(line); });
  c.node(0).begin_join();
  c.time().advance(100s);
  EXPECT_FALSE(c.node(0).step());
  c.time().advance(1s);
  EXPECT_FALSE(c.node(0).step());
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0],
            "waiting for nodes to join round 0: 1 of at least 2 (--nnodes=2:3) so far; giving up "
            "in 500 s (join_timeout)");
  c.add_node().on_wait([&](const std::string& line) { second.push_back(line); });
  c.node(1).begin_join();
  c.time().advance(2s);
  EXPECT_TRUE(c.form({0, 1}).empty());
  c.time().advance(20s);
  EXPECT_TRUE(c.form({0, 1}).empty());
  const std::string last_call =
      "2 nodes have joined round 0 (--nnodes=2:3): waiting up to 30 s (last_call_timeout) for "
      "more before it starts";
  EXPECT_EQ(first, (std::vector<std::string>{first[0], last_call}));
  EXPECT_EQ(second, (std::vector<std::string>{last_call}));
  c.time().advance(10s);
  EXPECT_EQ(c.form({0, 1}).size(), 2u);
  EXPECT_EQ(first.size(), 2u);
  EXPECT_EQ(second.size(), 1u);
}

TEST(DynamicRendezvous, ASpareSaysOnceThatItWaits) {
  Cluster c({1, 2});
  c.add_node().begin_join();
  c.add_node().begin_join();
  ASSERT_EQ(c.form({0, 1}).size(), 2u);
  std::vector<std::string> notes;
  c.add_node().on_wait([&](const std::string& line) { notes.push_back(line); });
  c.node(2).begin_join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(c.node(2).step());
    c.run_liveness({0, 1, 2}, 10s);  // the round's members live on
  }
  EXPECT_EQ(notes, (std::vector<std::string>{
                       "the running round has the most nodes --nnodes=1:2 allows: this node waits "
                       "as a spare until a member leaves or the job ends"}));
}

TEST(DynamicRendezvous, TooFewNodesFailAfterTheJoinTimeoutNamingTheCounts) {
  Cluster c({2, 3});
  c.add_node().begin_join();
  c.time().advance(599s);
  EXPECT_FALSE(c.node(0).step());
  c.time().advance(1s);
  try {
    c.node(0).step();
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("1 of at least 2 nodes joined"), std::string::npos)
        << e.what();
  }
}

TEST(DynamicRendezvous, SilentNodeIsDeclaredLostAfterTheMissedKeepAlives) {
  Cluster c({2, 3});
  for (int i = 0; i < 3; ++i) c.add_node().begin_join();
  auto infos = c.form({0, 1, 2});
  ASSERT_EQ(infos.size(), 3u);
  const std::string lost_member = c.node(2).member();
  c.run_liveness({0, 1, 2}, 10s);
  EXPECT_FALSE(c.end_of(infos[0]));
  // Node 2 goes silent; node 1 watches it. 3 x 5 s without a change: dead.
  c.run_liveness({0, 1}, 14s);
  EXPECT_FALSE(c.end_of(infos[0])) << "not yet three missed keep-alives";
  c.run_liveness({0, 1}, 2s);
  auto end = c.end_of(infos[0]);
  ASSERT_TRUE(end);
  EXPECT_EQ(*end, "lost 2 " + lost_member);
}

TEST(DynamicRendezvous, SurvivorsReformAtOnceWithTheNewWorldSize) {
  Cluster c({2, 3});
  for (int i = 0; i < 3; ++i) c.add_node().begin_join();
  auto first = c.form({0, 1, 2});
  c.run_liveness({0, 1, 2}, 5s);
  c.run_liveness({0, 1}, 20s);
  ASSERT_TRUE(c.end_of(first[0]));
  // The survivors rejoin in the other order; no last call: every survivor is here.
  c.node(1).begin_join();
  c.node(0).begin_join();
  auto second = c.form({0, 1});
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].group_rank, 0) << "survivors keep their relative order";
  EXPECT_EQ(second[1].group_rank, 1);
  EXPECT_EQ(second[0].world_size, 4);
  EXPECT_EQ(second[0].round, first[0].round + 1);
  EXPECT_NE(second[0].round_prefix, first[0].round_prefix);
}

TEST(DynamicRendezvous, NodeDeclaredLostRejoinsAsANewMemberAndTheGroupScalesUp) {
  Cluster c({2, 3});
  for (int i = 0; i < 3; ++i) c.add_node().begin_join();
  auto first = c.form({0, 1, 2});
  c.run_liveness({0, 1, 2}, 5s);
  c.run_liveness({0, 1}, 20s);  // node 2 is cut off
  ASSERT_TRUE(c.end_of(first[0]));
  c.node(0).begin_join();
  c.node(1).begin_join();
  auto second = c.form({0, 1});
  ASSERT_EQ(second.size(), 2u);
  // The partition heals: node 2 learns that it was declared lost.
  const std::string old_member = c.node(2).member();
  c.node(2).begin_join();
  EXPECT_NE(c.node(2).member(), old_member) << "a lost node never comes back as its old self";
  // The running group is below max: it is asked to re-form with the newcomer.
  auto end = c.end_of(second[0]);
  ASSERT_TRUE(end);
  EXPECT_EQ(*end, "joined " + c.node(2).member());
  c.node(0).begin_join();
  c.node(1).begin_join();
  auto third = c.form({0, 1, 2});
  ASSERT_EQ(third.size(), 3u);
  EXPECT_EQ(third[0].group_rank, 0);
  EXPECT_EQ(third[1].group_rank, 1);
  EXPECT_EQ(third[2].group_rank, 2) << "the newcomer comes after the survivors";
  EXPECT_EQ(third[2].world_size, 6);
}

TEST(DynamicRendezvous, NodeAtMaxWaitsAsASpareAndTakesOverWhenAMemberDies) {
  Cluster c({1, 2});
  c.add_node().begin_join();
  c.add_node().begin_join();
  auto first = c.form({0, 1});
  ASSERT_EQ(first.size(), 2u);
  c.add_node().begin_join();  // node 2: the group is full
  c.time().advance(3600s);    // a spare waits as long as the round runs
  EXPECT_FALSE(c.node(2).step());
  EXPECT_FALSE(c.end_of(first[0])) << "a spare does not disturb a full group";
  // Node 1 dies; node 0 declares it lost.
  c.run_liveness({0, 1, 2}, 5s);
  c.run_liveness({0, 2}, 20s);
  ASSERT_TRUE(c.end_of(first[0]));
  c.node(0).begin_join();
  auto second = c.form({0, 2});
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].group_rank, 0);
  EXPECT_EQ(second[2].group_rank, 1);
}

TEST(DynamicRendezvous, SpareLeavesWhenTheJobEndedAndItsKeysAreGone) {
  Cluster c({1, 2});
  c.add_node().begin_join();
  c.add_node().begin_join();
  auto first = c.form({0, 1});
  c.add_node().begin_join();
  EXPECT_FALSE(c.node(2).step());
  // The job finished and its last agent deleted its keys before the spare looked.
  c.store().delete_key("rdzv/job/current");
  EXPECT_THROW(c.node(2).step(), ShutdownError);
}

// join() itself, on two threads (the one test here with threads): which work
// runs in the background, as the fake runtime counts the threads it started.
TEST(DynamicRendezvous, ASingleNodeStartsNoThreadAndAJoinedNodeOneForItsKeepAlives) {
  Cluster solo({1, 1});
  auto alone = solo.add_node().join();
  EXPECT_EQ(alone->info().group_world_size, 1);
  EXPECT_EQ(solo.time().threads_started(), 0);
  EXPECT_EQ(solo.store().num_keys(), 0) << "nor touches the store";

  Cluster c({2, 2});
  DynamicRendezvous& a = c.add_node();
  DynamicRendezvous& b = c.add_node();
  std::unique_ptr<Round> round_a;
  std::thread joiner([&] { round_a = a.join(); });
  auto round_b = b.join();
  joiner.join();
  ASSERT_TRUE(round_a);
  EXPECT_EQ(round_a->info().group_world_size, 2);
  EXPECT_EQ(c.time().threads_started(), 2) << "one keep-alive worker each";
  a.shutdown(5s);
  b.shutdown(5s);
  EXPECT_EQ(c.time().threads_started(), 4) << "each leaves on a thread of its own";
}

TEST(DynamicRendezvous, ARunAtTheLastRoundARunMayHaveIsRefusedNotOverflowed) {
  Cluster c({1, 2});
  c.store().set("rdzv/job/current", std::to_string(kMaxRound) + " 1");
  try {
    c.add_node().begin_join();
    FAIL() << "expected the round cap to be refused";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("has reached round " + std::to_string(kMaxRound)),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(c.store().check({"rdzv/job/round_" + std::to_string(kMaxRound + 1) + "/rec_0"}))
      << "no arrival in a round no reader accepts";
}

TEST(DynamicRendezvous, NodesWaitingForTheNextRoundAreCounted) {
  Cluster c({1, 2});
  c.add_node().begin_join();
  c.add_node().begin_join();
  auto first = c.form({0, 1});
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(c.node(0).num_nodes_waiting(), 0);
  c.add_node().begin_join();  // a spare: it waits in the next round's list
  EXPECT_EQ(c.node(0).num_nodes_waiting(), 1);
  EXPECT_EQ(c.node(1).num_nodes_waiting(), 1);
}

TEST(DynamicRendezvous, CountingTheNodesWaitingCreatesNoKey) {
  Cluster c({1, 2});
  c.add_node().begin_join();
  c.add_node().begin_join();
  ASSERT_EQ(c.form({0, 1}).size(), 2u);
  const auto keys = c.store().num_keys();
  EXPECT_EQ(c.node(0).num_nodes_waiting(), 0);
  EXPECT_FALSE(c.store().check({"rdzv/job/round_1/arrivals"}))
      << "a look at the next round must not create its arrival counter";
  EXPECT_EQ(c.store().num_keys(), keys);
}

TEST(DynamicRendezvous, SpareLeavesWhenTheJobEnds) {
  Cluster c({1, 1 + 1});
  c.add_node().begin_join();
  c.add_node().begin_join();
  auto first = c.form({0, 1});
  c.add_node().begin_join();
  c.store().set(first[0].round_prefix + "/end", "done");
  EXPECT_THROW(c.node(2).step(), ShutdownError);
}

TEST(DynamicRendezvous, SameNodesGetTheSameRanksWhateverTheirArrivalOrder) {
  Cluster c({3, 3});
  c.add_node(2);
  c.add_node(0);
  c.add_node(1);
  for (int i = 0; i < 3; ++i) c.node(i).begin_join();
  auto first = c.form({0, 1, 2});
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0].group_rank, 2);
  EXPECT_EQ(first[1].group_rank, 0);
  EXPECT_EQ(first[2].group_rank, 1);
  // A worker failure restarts the round: rejoining in another order changes nothing.
  c.store().set(first[0].round_prefix + "/end", "restart 1 3");
  for (int i : {2, 0, 1}) c.node(i).begin_join();
  auto second = c.form({0, 1, 2});
  ASSERT_EQ(second.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(second[i].group_rank, first[i].group_rank);
}

TEST(DynamicRendezvous, LateNodeMakesARoundBelowMaxReform) {
  Cluster c({1, 3});
  c.add_node().begin_join();
  EXPECT_TRUE(c.form({0}).empty()) << "last call starts when min_nodes are seen";
  c.time().advance(30s);
  auto first = c.form({0});
  ASSERT_EQ(first.size(), 1u);
  c.add_node().begin_join();
  auto end = c.end_of(first[0]);
  ASSERT_TRUE(end);
  EXPECT_EQ(*end, "joined " + c.node(1).member());
  c.node(0).begin_join();
  auto second = c.form({0, 1});
  ASSERT_EQ(second.size(), 2u) << "the survivor and the newcomer form at once";
  EXPECT_EQ(second[0].group_rank, 0);
  EXPECT_EQ(second[1].group_rank, 1);
}

TEST(DynamicRendezvous, NodeArrivingDuringLastCallIsCounted) {
  Cluster c({2, 3});
  c.add_node().begin_join();
  c.add_node().begin_join();
  EXPECT_TRUE(c.form({0, 1}).empty());
  c.time().advance(30s);
  c.add_node().begin_join();  // took its index before the decision...
  auto first = c.form({0, 1, 2});
  ASSERT_EQ(first.size(), 3u) << "...and is counted: the decision sees three arrivals";
}

// ---- arrivals without records (a node killed between its index and its record) ------------

TEST(DynamicRendezvous, AnArrivalWithoutItsRecordHoldsTheRoundForItsGraceThenFormsWithoutIt) {
  // Before: the decider waited 10 s on multi_get and threw: "rendezvous failed"
  // on every node, instead of forming without the dead joiner.
  Cluster c({2, 2});
  c.add_node().begin_join();                      // index 0: the decider
  c.store().add("rdzv/job/round_0/arrivals", 1);  // index 1: took its index, then died
  c.add_node().begin_join();                      // index 2
  EXPECT_TRUE(c.form({0, 1}).empty()) << "the record may still come";
  c.time().advance(4s);
  EXPECT_TRUE(c.form({0, 1}).empty());
  c.time().advance(1s);  // past the grace: arrival 1 did not happen
  auto infos = c.form({0, 1});
  ASSERT_EQ(infos.size(), 2u);
  EXPECT_EQ(infos[0].group_rank, 0);
  EXPECT_EQ(infos[1].group_rank, 1);
  EXPECT_EQ(infos[1].group_world_size, 2);
  EXPECT_EQ(infos[1].world_size, 4);
}

TEST(DynamicRendezvous, ARecordThatComesWithinTheGraceIsCounted) {
  Cluster c({2, 3});
  c.add_node().begin_join();
  c.add_node().begin_join();
  c.time().advance(30s);                          // last call over for the two...
  c.store().add("rdzv/job/round_0/arrivals", 1);  // ...when a third takes its index
  EXPECT_TRUE(c.form({0, 1}).empty()) << "the decider waits for the third's record";
  c.time().advance(2s);
  Arrival late;
  late.member = "abcdef";
  late.local_world_size = 2;
  late.addr = "10.0.0.9";
  c.store().set("rdzv/job/round_0/rec_2", encode_arrival(late));
  auto infos = c.form({0, 1});
  ASSERT_EQ(infos.size(), 2u);
  EXPECT_EQ(infos[0].group_world_size, 3) << "the third node is a member";
}

TEST(DynamicRendezvous, APhantomDeciderIsReplacedByTheFallbackDecider) {
  Cluster c({2, 2});
  c.store().add("rdzv/job/round_0/arrivals", 1);  // index 0 never writes its record
  c.add_node().begin_join();
  c.add_node().begin_join();
  EXPECT_TRUE(c.form({0, 1}).empty());
  c.time().advance(45s);  // last call (30 s) + keep-alives (3 x 5 s): arrival 0 is dead
  EXPECT_TRUE(c.form({0, 1}).empty()) << "the fallback decider gives the record its grace";
  c.time().advance(5s);
  auto infos = c.form({0, 1});
  ASSERT_EQ(infos.size(), 2u);
  EXPECT_EQ(infos[0].group_rank, 0);
  EXPECT_EQ(infos[1].group_rank, 1);
}

TEST(DynamicRendezvous, AHugeArrivalCountIsClampedNotNarrowedNorBuiltAsKeys) {
  // Before: the count was narrowed to int (2^31 + 2 became negative), and a
  // count of a billion built a billion key strings (out of memory).
  Cluster c({1, 2});
  c.store().add("rdzv/job/round_0/arrivals", 1'000'000'000);
  c.add_node().begin_join();  // its index is a billion: past what a round considers
  c.time().advance(45s);      // the fallback decider
  EXPECT_TRUE(c.form({0}).empty());
  c.time().advance(5s);
  EXPECT_TRUE(c.form({0}).empty()) << "a billion phantoms: nobody real to form with";
  c.time().advance(600s);
  try {
    c.node(0).step();
    FAIL() << "expected the join timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("1000000001 of at least 1 nodes joined"),
              std::string::npos)
        << e.what();
  }
}

TEST(DynamicRendezvous, ANodeArrivingPastWhatARoundConsidersNeverDecidesIt) {
  // Before: a fallback decider whose arrival index was past kMaxArrivals (the
  // counter inflated by anyone's add) published itself as the decider, a value
  // every node's parse refuses: the round failed with a ProtocolError.
  Cluster c({1, 2});
  c.store().add("rdzv/job/round_0/arrivals", 1);  // a phantom at index 0
  c.add_node().begin_join();                      // node 0: index 1
  c.store().add("rdzv/job/round_0/arrivals", 70'000);
  c.add_node().begin_join();  // node 1: index 70,002, past the 65,536 considered
  c.time().advance(45s);      // both are fallback deciders now
  // Node 1 alone looks: the phantom's grace, then last call (min 1 of max 2).
  EXPECT_TRUE(c.form({1}).empty());
  c.time().advance(6s);
  EXPECT_TRUE(c.form({1}).empty());
  c.time().advance(31s);
  EXPECT_NO_THROW(c.form({1}));
  EXPECT_FALSE(c.store().check({"rdzv/job/round_0/closed"}))
      << "a node the round does not consider must not decide it";
  // Node 0 decides, the same way, and forms alone.
  EXPECT_TRUE(c.form({0}).empty());
  c.time().advance(6s);
  EXPECT_TRUE(c.form({0}).empty());
  c.time().advance(31s);
  auto infos = c.form({0});
  ASSERT_EQ(infos.size(), 1u);
  EXPECT_EQ(infos[0].group_world_size, 1);
}

TEST(DynamicRendezvous, AMalformedRecordIsAProtocolErrorNamingItsKey) {
  // Before: a local world size of 2^31-1 overflowed the world size (signed
  // overflow), and std::stoi failures surfaced as a bare "stoi".
  Cluster c({2, 2});
  c.add_node().begin_join();
  c.store().add("rdzv/job/round_0/arrivals", 1);
  c.store().set("rdzv/job/round_0/rec_1", "abc 0 2147483647 29500 0 10.0.0.9");
  try {
    c.form({0});
    FAIL() << "accepted a local world size of 2^31-1";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("rdzv/job/round_0/rec_1"), std::string::npos) << e.what();
  }
}

TEST(DynamicRendezvous, SparesBehindAFullRoundWhoseNodesAllDiedEndItAndForm) {
  // Before: after a full job crashed, the next job with its run id found its
  // round still "running" and waited behind it as spares forever.
  Cluster c({2, 2});
  c.add_node().begin_join();
  c.add_node().begin_join();
  auto first = c.form({0, 1});
  ASSERT_EQ(first.size(), 2u);
  c.run_liveness({0, 1}, 5s);  // then both crash: no keep-alive moves again
  c.add_node().begin_join();
  c.add_node().begin_join();
  EXPECT_TRUE(c.form({2, 3}).empty()) << "spares behind a full round";
  c.time().advance(10s);
  EXPECT_TRUE(c.form({2, 3}).empty()) << "not yet three missed keep-alives";
  EXPECT_FALSE(c.end_of(first[0]));
  c.time().advance(6s);
  auto second = c.form({2, 3});
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[2].round, first[0].round + 1);
  auto end = c.end_of(first[0]);
  ASSERT_TRUE(end);
  EXPECT_EQ(end->rfind("lost 0 ", 0), 0u) << *end;
}

TEST(DynamicRendezvous, SparesKeepWaitingBehindAFullRoundThatLives) {
  Cluster c({2, 2});
  c.add_node().begin_join();
  c.add_node().begin_join();
  auto first = c.form({0, 1});
  c.add_node().begin_join();
  for (int i = 0; i < 120; ++i) {  // ten minutes of a running round
    c.run_liveness({0, 1}, 5s);
    EXPECT_FALSE(c.node(2).step());
  }
  EXPECT_FALSE(c.end_of(first[0])) << "a spare ended a live round";
}

}  // namespace
}  // namespace ddp::rendezvous_detail
