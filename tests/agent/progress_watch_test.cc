// What one node's ProgressWatch does with the other nodes' summaries: the real
// watch and exchange, a fake clock, a MemoryStore holding node 1's summary
// written the way a node writes it (encode_summary under round_area_key), and
// this node's rank 0 with a real progress page written here as a worker would.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "ddp/common/time.h"
#include "ddp/rendezvous/round.h"
#include "ddp/store/memory_store.h"
#include "ddp/worker_contract/progress_page.h"
#include "progress_exchange.h"
#include "progress_watch.h"

namespace ddp::agent {
namespace {

using std::chrono::seconds;

constexpr std::int64_t kSecondNs = 1'000'000'000;

class WatchTrustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WatchOptions options;
    options.hang_timeout = seconds(3);
    options.progress_pages = true;
    options.exchange_period = Millis(5);  // real time: the exchange's thread
    watch_ = std::make_unique<ProgressWatch>(options, "node-a", "10.0.0.1", time_);
    info_.round = 0;
    info_.group_rank = 0;
    info_.group_world_size = 2;
    info_.base_rank = 0;
    info_.world_size = 2;
    info_.local_world_sizes = {1, 1};
    info_.round_prefix = "rdzv/job/round_0";
  }

  void TearDown() override {
    if (page_ != nullptr) ::munmap(page_, progress::kPageBytes);
    const bool exchanging = store_->check({round_area_key(info_.round_prefix, 0)});
    watch_.reset();
    // The exchange's thread is abandoned, not joined, and its last task
    // deletes node 0's key; time_ (its runtime) must outlive it, so wait for
    // that (a summary carrying a hang is kept: then a bounded wait). ASan
    // found the thread reading time_ after the fixture was gone.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (exchanging && store_->check({round_area_key(info_.round_prefix, 0)}) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  // Begins the round and starts rank 0 (local rank 0) with a page, then lets
  // `age` of the fake clock pass (how long rank 0 has run).
  void start(Millis age) {
    watch_->begin_round(info_, 1, store_);
    ProgressPageFile* file = watch_->prepare(0);
    ASSERT_NE(file, nullptr);
    void* memory =
        ::mmap(nullptr, progress::kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, file->fd(), 0);
    ASSERT_NE(memory, MAP_FAILED);
    page_ = static_cast<progress::Page*>(memory);
    watch_->started(0, 0, 4242);
    time_.advance(age);
  }

  // Rank 0's page: group 'default' with `issued` and `completed`, the last of
  // each `ago` ago (real time, the page's clock).
  void write_page(std::uint64_t issued, std::uint64_t completed, std::int64_t ago_ns) {
    const std::int64_t then = progress::now_ns() - ago_ns;
    page_->pid = 4242;
    auto& slot = page_->groups[0];
    std::memset(slot.name, 0, sizeof(slot.name));
    std::memcpy(slot.name, "default", 7);
    slot.size = 2;
    slot.rank = 0;
    slot.issued = issued;
    slot.completed = completed;
    slot.last_kind = static_cast<std::uint32_t>(progress::Kind::kAllreduce);
    slot.last_issued_ns = then;
    slot.last_completed_ns = then;
    slot.waiting_since_ns = then;
    slot.in_use = 1;
  }

  // Node 1's rank 1, waiting `wait` in all-reduce #seq of group 'default'.
  static RankStatus node1_rank(std::uint64_t seq, Millis wait, Millis up) {
    RankStatus r;
    r.rank = 1;
    r.local_rank = 0;
    r.node = 1;
    r.pid = 77;
    r.has_page = true;
    r.since_start = up;
    r.since_step = up;
    GroupStatus g;
    g.name = "default";
    g.size = 2;
    g.rank = 1;
    g.issued = seq + 1;
    g.completed = seq;
    g.last_kind = progress::Kind::kAllreduce;
    g.since_issued = wait;
    g.since_completed = wait;
    g.waiting = wait;
    r.groups.push_back(g);
    return r;
  }

  // What node 1 claims: rank 0 never reached all-reduce #seq.
  static Hang claim_behind(std::uint64_t seq, Millis wait) {
    Hang hang;
    hang.kind = Hang::Kind::kBehind;
    hang.culprits = {0};
    hang.group = "default";
    hang.seq = seq;
    hang.collective = progress::Kind::kAllreduce;
    hang.duration = wait;
    hang.found_by = 1;
    hang.summary = "rank 0 never reached allreduce #" + std::to_string(seq);
    hang.ranks = {"rank 0 (node 0, host node-a, pid 4242): somewhere"};
    return hang;
  }

  void write_node1(const NodeSummary& summary) {
    store_->set(round_area_key(info_.round_prefix, 1), encode_summary(summary));
  }

  // Looks (check()) until node 1's summary was read or refused, and once more;
  // returns the first verdict any look gave.
  std::optional<ProgressWatch::Verdict> look_until_node1_read() {
    std::optional<ProgressWatch::Verdict> first;
    const auto give_up = std::chrono::steady_clock::now() + seconds(20);
    for (;;) {
      auto verdict = watch_->check();
      if (verdict && !first) first = std::move(verdict);
      const auto& nodes = watch_->nodes();
      if ((!nodes.empty() && (nodes[0].heard || nodes[0].refused > 0)) ||
          std::chrono::steady_clock::now() > give_up)
        break;
      std::this_thread::sleep_for(Millis(5));
    }
    if (auto verdict = watch_->check(); verdict && !first) first = std::move(verdict);
    return first;
  }

  FakeTime time_;
  std::shared_ptr<MemoryStore> store_ = std::make_shared<MemoryStore>();
  std::unique_ptr<ProgressWatch> watch_;
  RendezvousInfo info_;
  progress::Page* page_ = nullptr;
};

// Item 1: node 1 claims rank 0 never reached all-reduce #100; rank 0's own
// page says it issued and completed #100 just now. The hang is reported, as
// a disagreement, and rank 0 is not named for ending.
TEST_F(WatchTrustTest, AClaimTheLocalPageContradictsEndsNoRank) {
  ASSERT_NO_FATAL_FAILURE(start(seconds(20)));
  write_page(101, 101, 0);
  write_node1(NodeSummary{1,
                          "node-b",
                          "10.0.0.2",
                          1,
                          {node1_rank(100, seconds(10), seconds(15))},
                          claim_behind(100, seconds(10))});
  auto verdict = look_until_node1_read();
  ASSERT_TRUE(watch_->nodes()[0].heard);
  ASSERT_TRUE(verdict) << "the claim is still reported";
  EXPECT_EQ(verdict->hang.found_by, 1);
  EXPECT_TRUE(verdict->local_culprits.empty());
  ASSERT_EQ(verdict->disputed.size(), 1u);
  EXPECT_NE(verdict->disputed[0].find("rank 0 (local rank 0): its page shows it issued "
                                      "collective #100"),
            std::string::npos)
      << verdict->disputed[0];
}

// The same claim, confirmed by rank 0's page (it never issued #100 and did
// nothing in the group for 10 s), names rank 0 for ending.
TEST_F(WatchTrustTest, AClaimTheLocalPageConfirmsEndsTheRank) {
  ASSERT_NO_FATAL_FAILURE(start(seconds(20)));
  write_page(100, 100, 10 * kSecondNs);
  write_node1(NodeSummary{1,
                          "node-b",
                          "10.0.0.2",
                          1,
                          {node1_rank(100, seconds(10), seconds(15))},
                          claim_behind(100, seconds(10))});
  auto verdict = look_until_node1_read();
  ASSERT_TRUE(verdict);
  EXPECT_EQ(verdict->local_culprits, std::vector<int>{0});
  EXPECT_TRUE(verdict->disputed.empty());
}

// A claim is taken from a current summary only. Node 1 claims rank 0 is
// behind; rank 0's page neither confirms nor contradicts yet (it completed
// a collective of the group 1 s ago), so the report waits. Then node 1's
// summary goes stale (its agent stopped): the claim is no longer taken, even
// after the wait for rank 0's page is over.
TEST_F(WatchTrustTest, AClaimInAStaleSummaryIsNotTaken) {
  ASSERT_NO_FATAL_FAILURE(start(seconds(20)));
  write_page(100, 100, kSecondNs);
  // Node 1's rank is past the collective by now (as the claim's node may
  // see it a moment after its find): nothing here makes a hang of its own.
  RankStatus past = node1_rank(100, Millis(0), seconds(15));
  past.groups[0].completed = past.groups[0].issued;
  write_node1(NodeSummary{1, "node-b", "10.0.0.2", 1, {past}, claim_behind(100, seconds(10))});
  EXPECT_FALSE(look_until_node1_read()) << "rank 0's page has not confirmed the claim yet";
  ASSERT_TRUE(watch_->nodes()[0].heard);
  time_.advance(seconds(60));
  for (int i = 0; i < 10; ++i) {
    EXPECT_FALSE(watch_->check()) << "look " << i;
    std::this_thread::sleep_for(Millis(5));
  }
  EXPECT_TRUE(watch_->nodes()[0].stale);
}

// Item 2: node 1's summary, with no hang, says its rank waited 1,000 s in
// all-reduce #5000 in a round 20 s old. It is refused (and counted); rank 0,
// healthy, is not judged behind.
TEST_F(WatchTrustTest, ASummaryWithWaitsLongerThanTheRoundIsRefused) {
  ASSERT_NO_FATAL_FAILURE(start(seconds(20)));
  write_page(101, 101, 0);
  write_node1(NodeSummary{
      1, "node-b", "10.0.0.2", 1, {node1_rank(5000, seconds(1000), seconds(1000))}, {}});
  EXPECT_FALSE(look_until_node1_read());
  EXPECT_FALSE(watch_->nodes()[0].heard);
  EXPECT_EQ(watch_->nodes()[0].refused, 1);
  for (const auto& r : watch_->ranks()) EXPECT_EQ(r.node, 0) << "rank " << r.rank;
}

// Item 2: a summary naming a rank that is not its node's (here this node's
// rank 0) is refused: its ranks reach neither the view nor the scores.
TEST_F(WatchTrustTest, ASummaryNamingAnotherNodesRankIsRefused) {
  ASSERT_NO_FATAL_FAILURE(start(seconds(20)));
  write_page(101, 101, 0);
  RankStatus impostor = node1_rank(100, Millis(0), seconds(10));
  impostor.rank = 0;
  write_node1(NodeSummary{1, "node-b", "10.0.0.2", 1, {impostor}, {}});
  EXPECT_FALSE(look_until_node1_read());
  EXPECT_EQ(watch_->nodes()[0].refused, 1);
  ASSERT_EQ(watch_->ranks().size(), 1u);
  EXPECT_EQ(watch_->ranks()[0].node, 0);
}

// Item 2: a culprit this node's own detector names from a view with another
// node's ranks is also judged by its page: node 1's rank (plausible, 30 s
// into a 40 s round) waits in #5000, rank 0 completed #100 just now. The
// report waits a timeout for rank 0's page to confirm, then reports a
// disagreement and ends nothing.
TEST_F(WatchTrustTest, ALocalCulpritOfThisNodesOwnFindIsJudgedByItsPageToo) {
  ASSERT_NO_FATAL_FAILURE(start(seconds(40)));
  write_page(101, 101, 0);
  write_node1(
      NodeSummary{1, "node-b", "10.0.0.2", 1, {node1_rank(5000, seconds(30), seconds(35))}, {}});
  EXPECT_FALSE(look_until_node1_read()) << "not confirmed yet: no report";
  ASSERT_TRUE(watch_->nodes()[0].heard);
  time_.advance(seconds(3));
  write_page(101, 101, 0);
  auto verdict = watch_->check();
  ASSERT_TRUE(verdict);
  EXPECT_EQ(verdict->hang.found_by, 0);
  EXPECT_TRUE(verdict->local_culprits.empty());
  EXPECT_EQ(verdict->disputed.size(), 1u);
}

// not_exiting: node 1 claims rank 0 still runs after every other rank
// exited 0, but its own summary says its rank 1 still runs.
TEST_F(WatchTrustTest, ANotExitingClaimWhileAnotherRankRunsEndsNoRank) {
  ASSERT_NO_FATAL_FAILURE(start(seconds(20)));  // rank 0: no page (pid 0)
  Hang hang;
  hang.kind = Hang::Kind::kNotExiting;
  hang.culprits = {0};
  hang.duration = seconds(5);
  hang.found_by = 1;
  hang.summary = "rank 0 still running 5.0 s after every other rank exited 0";
  hang.ranks = {"rank 0 (node 0, host node-a, pid 4242): running"};
  RankStatus running = node1_rank(10, Millis(0), seconds(15));
  running.groups.clear();
  running.has_page = false;
  write_node1(NodeSummary{1, "node-b", "10.0.0.2", 1, {running}, hang});
  auto verdict = look_until_node1_read();
  ASSERT_TRUE(verdict);
  EXPECT_TRUE(verdict->local_culprits.empty());
  ASSERT_EQ(verdict->disputed.size(), 1u);
  EXPECT_NE(verdict->disputed[0].find("rank 1 (node 1) still runs"), std::string::npos)
      << verdict->disputed[0];
}

}  // namespace
}  // namespace ddp::agent
