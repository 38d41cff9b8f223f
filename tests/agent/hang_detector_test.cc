// Hang detection, its timeout, straggler scores and the summaries nodes
// exchange: pure functions, fed hand-made rank states (no processes, no clock).
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/common/time.h"
#include "hang_detector.h"
#include "progress_exchange.h"
#include "progress_page_file.h"
#include "progress_watch.h"
#include "straggler.h"

namespace ddp::agent {
namespace {

using std::chrono::seconds;

// A running rank of group "default" (size 4) that completed `completed`
// collectives and issued `issued`; when in a collective, it has waited `wait`.
RankStatus rank_at(int rank, std::uint64_t issued, std::uint64_t completed, Millis wait = Millis(0),
                   Millis since_completed = Millis(100)) {
  RankStatus r;
  r.rank = rank;
  r.node = rank / 2;
  r.host = "h" + std::to_string(rank / 2);
  r.pid = 1000 + rank;
  r.has_page = true;
  r.since_start = seconds(100);
  GroupStatus g;
  g.name = "default";
  g.size = 4;
  g.rank = rank;
  g.issued = issued;
  g.completed = completed;
  g.last_kind = progress::Kind::kAllreduce;
  g.last_bytes = 1280;
  g.waiting = issued > completed ? wait : Millis(0);
  g.since_completed = since_completed;
  r.groups.push_back(g);
  return r;
}

TEST(FindHang, RanksWaitingLongInACollectiveOneRankNeverIssuedNameThatRank) {
  std::vector<RankStatus> ranks = {
      rank_at(0, 14, 13, seconds(4), seconds(4)), rank_at(1, 14, 13, seconds(4), seconds(4)),
      rank_at(2, 13, 13, Millis(0), seconds(4)), rank_at(3, 14, 13, seconds(4), seconds(4))};
  auto hang = find_hang(ranks, seconds(3));
  ASSERT_TRUE(hang);
  EXPECT_EQ(hang->kind, Hang::Kind::kBehind);
  EXPECT_EQ(hang->culprits, std::vector<int>{2});
  EXPECT_EQ(hang->group, "default");
  EXPECT_EQ(hang->seq, 13u);
  EXPECT_EQ(hang->collective, progress::Kind::kAllreduce);
  EXPECT_NE(hang->summary.find("rank 2 never reached allreduce #13"), std::string::npos)
      << hang->summary;
  EXPECT_NE(hang->summary.find("ranks 0, 1, 3"), std::string::npos) << hang->summary;
  ASSERT_EQ(hang->ranks.size(), 4u);
  EXPECT_NE(hang->ranks[2].find("is not in a collective"), std::string::npos) << hang->ranks[2];
  EXPECT_NE(hang->ranks[0].find("waits in allreduce #13"), std::string::npos) << hang->ranks[0];
}

TEST(FindHang, AWaitShorterThanTheTimeoutIsNoHang) {
  // The usual skew of a healthy step: two ranks are in #13 already.
  std::vector<RankStatus> ranks = {rank_at(0, 14, 13, Millis(2900)), rank_at(1, 13, 13),
                                   rank_at(2, 14, 13, Millis(2900)), rank_at(3, 13, 13)};
  EXPECT_FALSE(find_hang(ranks, seconds(3)));
}

TEST(FindHang, AWaiterWhoseCollectiveEveryoneIssuedIsNoBehindHang) {
  // Everyone issued #13; one rank still waits in it (it is slow to complete):
  // nobody is behind, and collectives complete elsewhere.
  std::vector<RankStatus> ranks = {
      rank_at(0, 14, 13, seconds(5), seconds(5)), rank_at(1, 14, 14, Millis(0), Millis(10)),
      rank_at(2, 14, 14, Millis(0), Millis(10)), rank_at(3, 14, 14, Millis(0), Millis(10))};
  EXPECT_FALSE(find_hang(ranks, seconds(3)));
}

TEST(FindHang, SeveralRanksBehindAreAllNamed) {
  std::vector<RankStatus> ranks = {rank_at(0, 8, 7, seconds(9)), rank_at(1, 7, 7), rank_at(2, 5, 5),
                                   rank_at(3, 8, 7, seconds(9))};
  auto hang = find_hang(ranks, seconds(3));
  ASSERT_TRUE(hang);
  EXPECT_EQ(hang->culprits, (std::vector<int>{1, 2}));
  EXPECT_EQ(hang->seq, 7u);
}

TEST(FindHang, ARankThatExitedBeforeTheCollectiveOthersWaitInIsTheCulprit) {
  std::vector<RankStatus> ranks = {rank_at(0, 40, 39, seconds(4)), rank_at(1, 39, 39),
                                   rank_at(2, 40, 39, seconds(4)), rank_at(3, 40, 39, seconds(4))};
  ranks[1].state = RankStatus::State::kSucceeded;
  ranks[1].since_exit = seconds(4);
  auto hang = find_hang(ranks, seconds(3));
  ASSERT_TRUE(hang);
  EXPECT_EQ(hang->kind, Hang::Kind::kBehind);
  EXPECT_EQ(hang->culprits, std::vector<int>{1});
  EXPECT_NE(hang->ranks[1].find("exited 0"), std::string::npos) << hang->ranks[1];
}

TEST(FindHang, EveryRankInTheSameCollectiveForTheTimeoutStalls) {
  std::vector<RankStatus> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(rank_at(r, 6, 5, seconds(10), seconds(10)));
  auto hang = find_hang(ranks, seconds(3));
  ASSERT_TRUE(hang);
  EXPECT_EQ(hang->kind, Hang::Kind::kStalled);
  EXPECT_EQ(hang->culprits, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(hang->seq, 5u);
  EXPECT_NE(hang->summary.find("never completes"), std::string::npos) << hang->summary;
}

TEST(FindHang, NoRankInACollectiveForTheTimeoutStallsInUserCode) {
  std::vector<RankStatus> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(rank_at(r, 6, 6, Millis(0), seconds(10)));
  auto hang = find_hang(ranks, seconds(3));
  ASSERT_TRUE(hang);
  EXPECT_EQ(hang->kind, Hang::Kind::kStalled);
  EXPECT_NE(hang->summary.find("none is in one"), std::string::npos) << hang->summary;
  // One rank completed recently: no stall.
  ranks[3].groups[0].since_completed = seconds(1);
  EXPECT_FALSE(find_hang(ranks, seconds(3)));
}

TEST(FindHang, ACollectiveTheLastRankEnteredJustNowHasNotStalled) {
  // Every rank waits in #0, long after the ranks started (a slow start on a
  // loaded machine), but the last one entered it 0.1 s ago.
  std::vector<RankStatus> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(rank_at(r, 1, 0, seconds(5), seconds(7)));
  ranks[2].groups[0].waiting = Millis(100);
  EXPECT_FALSE(find_hang(ranks, seconds(3)));
  ranks[2].groups[0].waiting = Millis(3100);
  auto hang = find_hang(ranks, seconds(3));
  ASSERT_TRUE(hang);
  EXPECT_EQ(hang->kind, Hang::Kind::kStalled);
  EXPECT_NE(hang->summary.find("for 3.1 s or more"), std::string::npos) << hang->summary;
}

TEST(FindHang, AGroupWithRanksNotSeenYetHasNotStalled) {
  // Ranks 0 and 1 still start (no page yet); ranks 2 and 3 wait in the
  // group's first collective for them: nobody has stalled.
  std::vector<RankStatus> ranks = {rank_at(0, 0, 0), rank_at(1, 0, 0),
                                   rank_at(2, 1, 0, seconds(9), seconds(9)),
                                   rank_at(3, 1, 0, seconds(9), seconds(9))};
  for (int r = 0; r < 2; ++r) {
    ranks[r].has_page = false;
    ranks[r].groups.clear();
  }
  EXPECT_FALSE(find_hang(ranks, seconds(3)));
  // The same two ranks, once the other two are seen in the group: a stall.
  ranks[0] = rank_at(0, 1, 0, seconds(4), seconds(9));
  ranks[1] = rank_at(1, 1, 0, seconds(4), seconds(9));
  auto hang = find_hang(ranks, seconds(3));
  ASSERT_TRUE(hang);
  EXPECT_EQ(hang->kind, Hang::Kind::kStalled);
  EXPECT_EQ(hang->culprits, (std::vector<int>{0, 1, 2, 3}));
}

TEST(FindHang, ARankStillRunningAfterEveryOtherExitedZeroIsNotExiting) {
  std::vector<RankStatus> ranks;
  for (int r = 0; r < 3; ++r) {
    RankStatus s;
    s.rank = r;
    s.state = RankStatus::State::kSucceeded;
    s.since_exit = seconds(10 - r);  // the last one exited 8 s ago
    ranks.push_back(s);
  }
  RankStatus stuck;
  stuck.rank = 3;
  stuck.host = "h1";
  stuck.pid = 77;
  ranks.push_back(stuck);  // no progress page: a PyTorch script
  auto hang = find_hang(ranks, seconds(8));
  ASSERT_TRUE(hang);
  EXPECT_EQ(hang->kind, Hang::Kind::kNotExiting);
  EXPECT_EQ(hang->culprits, std::vector<int>{3});
  EXPECT_NE(hang->ranks[3].find("no progress page"), std::string::npos) << hang->ranks[3];
  EXPECT_FALSE(find_hang(ranks, Millis(8001)));
  // A failed rank is the failure path's business, not a hang.
  ranks[0].state = RankStatus::State::kFailed;
  EXPECT_FALSE(find_hang(ranks, seconds(1)));
}

// The watch's policy on a rank of a program without progress pages (a
// PyTorch script) still running `after` past the other rank's exit 0, with
// a fake clock: the verdict of one look.
std::optional<ProgressWatch::Verdict> not_exiting_verdict(std::optional<Millis> hang_timeout,
                                                          Millis after) {
  FakeTime time;
  WatchOptions options;
  options.hang_timeout = hang_timeout;
  ProgressWatch watch(options, "h0", "10.0.0.1", time);
  RendezvousInfo info;
  info.world_size = 2;
  watch.begin_round(info, /*local_world_size=*/2, nullptr);
  for (int local_rank = 0; local_rank < 2; ++local_rank) {
    watch.prepare(local_rank);
    watch.started(local_rank, local_rank, 100 + local_rank);
  }
  time.advance(seconds(5));
  watch.exited(1, 0);
  time.advance(after);
  return watch.check();
}

// Rank 0 evaluating or uploading for 15 minutes after the others finished
// cannot be told from a hang: the default timeout reports it and ends nothing.
TEST(HangPolicy, UnderAutoARankThatDoesNotExitIsReportedNotEnded) {
  EXPECT_FALSE(not_exiting_verdict(std::nullopt, HangTimeout::kAutoBeforeWarmup - seconds(1)));
  const auto verdict = not_exiting_verdict(std::nullopt, HangTimeout::kAutoBeforeWarmup);
  ASSERT_TRUE(verdict);
  EXPECT_EQ(verdict->hang.kind, Hang::Kind::kNotExiting);
  EXPECT_EQ(verdict->local_culprits, std::vector<int>{0});
  EXPECT_TRUE(verdict->report_only);
}

TEST(HangPolicy, AnExplicitTimeoutEndsARankThatDoesNotExit) {
  EXPECT_FALSE(not_exiting_verdict(seconds(30), seconds(29)));
  const auto verdict = not_exiting_verdict(seconds(30), seconds(30));
  ASSERT_TRUE(verdict);
  EXPECT_EQ(verdict->hang.kind, Hang::Kind::kNotExiting);
  EXPECT_FALSE(verdict->report_only);
}

TEST(HangPolicy, OnlyARankThatDoesNotExitMayBeWork) {
  std::vector<RankStatus> behind = {rank_at(0, 8, 7, seconds(20)), rank_at(1, 7, 7)};
  const auto hang = find_hang(behind, seconds(10));
  ASSERT_TRUE(hang);
  EXPECT_EQ(hang->kind, Hang::Kind::kBehind);
  EXPECT_FALSE(may_be_work(*hang)) << "ranks waiting in a collective others never reach";
  Hang not_exiting;
  not_exiting.kind = Hang::Kind::kNotExiting;
  EXPECT_TRUE(may_be_work(not_exiting));
}

// Every rank in its own code for the timeout may be every rank evaluating:
// under auto it is reported only. Every rank waiting in a collective that
// never completes is no work: it is acted on.
TEST(HangPolicy, AGroupWhoseRanksAreAllInTheirOwnCodeMayBeWork) {
  std::vector<RankStatus> own_code;
  std::vector<RankStatus> waiting;
  for (int r = 0; r < 4; ++r) {
    own_code.push_back(rank_at(r, 6, 6, Millis(0), seconds(10)));
    waiting.push_back(rank_at(r, 6, 5, seconds(10), seconds(10)));
  }
  const auto evaluating = find_hang(own_code, seconds(3));
  ASSERT_TRUE(evaluating);
  EXPECT_EQ(evaluating->kind, Hang::Kind::kStalled);
  EXPECT_TRUE(evaluating->in_own_code);
  EXPECT_TRUE(may_be_work(*evaluating));
  const auto stuck = find_hang(waiting, seconds(3));
  ASSERT_TRUE(stuck);
  EXPECT_EQ(stuck->kind, Hang::Kind::kStalled);
  EXPECT_FALSE(stuck->in_own_code);
  EXPECT_FALSE(may_be_work(*stuck));
  // Another node learns it from the summary, so that it reports it the same way.
  NodeSummary summary;
  summary.node = 1;
  summary.hang = *evaluating;
  summary.hang->found_by = 1;
  EXPECT_TRUE(parse_summary(encode_summary(summary)).hang->in_own_code);
  summary.hang = *stuck;
  summary.hang->found_by = 1;
  EXPECT_FALSE(parse_summary(encode_summary(summary)).hang->in_own_code);
}

TEST(FindHang, GroupsAreComparedByName) {
  // Rank 1 is behind in subgroup "pg1" only; "default" is fine.
  std::vector<RankStatus> ranks = {rank_at(0, 3, 3), rank_at(1, 3, 3)};
  for (auto& r : ranks) {
    GroupStatus sub = r.groups[0];
    sub.name = "pg1";
    sub.size = 2;
    r.groups.push_back(sub);
  }
  ranks[0].groups[1].issued = 5;
  ranks[0].groups[1].completed = 4;
  ranks[0].groups[1].waiting = seconds(4);
  auto hang = find_hang(ranks, seconds(3));
  ASSERT_TRUE(hang);
  EXPECT_EQ(hang->group, "pg1");
  EXPECT_EQ(hang->culprits, std::vector<int>{1});
}

TEST(HangTimeout, FixedZeroAndAuto) {
  EXPECT_FALSE(HangTimeout(Millis(0)).enabled());
  HangTimeout fixed(seconds(7));
  EXPECT_TRUE(fixed.enabled());
  EXPECT_EQ(fixed.current(), seconds(7));

  HangTimeout automatic(std::nullopt);
  EXPECT_TRUE(automatic.enabled());
  EXPECT_EQ(automatic.current(), HangTimeout::kAutoBeforeWarmup);
  RankStatus r;
  r.steps = HangTimeout::kWarmupSteps;  // still warming up: its slow steps do not count
  r.last_wall = seconds(100);
  automatic.observe({r});
  EXPECT_EQ(automatic.current(), HangTimeout::kAutoBeforeWarmup);
  r.steps = HangTimeout::kWarmupSteps + 1;
  r.last_wall = seconds(2);  // 10 x 2 s is under the floor
  automatic.observe({r});
  EXPECT_EQ(automatic.current(), HangTimeout::kAutoFloor);
  r.last_wall = seconds(90);
  automatic.observe({r});
  EXPECT_EQ(automatic.current(), seconds(900));
  r.last_wall = seconds(1);  // the slowest step seen stays
  automatic.observe({r});
  EXPECT_EQ(automatic.current(), seconds(900));
}

TEST(Straggler, ScoresAreTheFastestComputeOverEachRanks) {
  std::vector<RankStatus> ranks(3);
  ranks[0].rank = 0;
  ranks[0].compute = Millis(100);
  ranks[0].last_wall = Millis(320);
  ranks[1].rank = 1;
  ranks[1].compute = Millis(300);
  ranks[1].last_wall = Millis(320);
  ranks[2].rank = 2;  // no step yet
  auto scores = straggler_scores(ranks);
  ASSERT_EQ(scores.size(), 2u);
  EXPECT_DOUBLE_EQ(scores[0], 1.0);
  EXPECT_NEAR(scores[1], 1.0 / 3, 1e-9);
  ranks[0].compute = Millis(0);
  EXPECT_TRUE(straggler_scores(ranks).empty());  // one rank has nothing to compare with
}

TEST(Straggler, NamedOnceAfterASustainedWindowOnly) {
  FakeTime time;
  StragglerWatch watch;
  const std::map<int, double> slow = {{0, 1.0}, {1, 0.33}};
  EXPECT_TRUE(watch.update(time.now(), slow).empty());
  time.advance(StragglerWatch::kWindow - Millis(1));
  EXPECT_TRUE(watch.update(time.now(), slow).empty());
  // A look at or above the threshold restarts the window.
  EXPECT_TRUE(watch.update(time.now(), {{0, 1.0}, {1, 0.9}}).empty());
  time.advance(Millis(10));
  EXPECT_TRUE(watch.update(time.now(), slow).empty());
  time.advance(StragglerWatch::kWindow);
  EXPECT_EQ(watch.update(time.now(), slow), std::vector<int>{1});
  time.advance(seconds(30));
  EXPECT_TRUE(watch.update(time.now(), slow).empty());  // once
  EXPECT_EQ(format_scores(watch.last_scores(), watch.named()),
            "rank 0 1.00, rank 1 0.33 (straggler)");
}

TEST(Summary, RoundTripsEveryField) {
  NodeSummary summary;
  summary.node = 1;
  summary.host = "node-b";
  summary.addr = "10.0.0.2";
  summary.version = 42;
  RankStatus r = rank_at(3, 14, 13, seconds(4), seconds(5));
  r.node = 1;
  r.host = "node-b";
  r.local_rank = 1;
  r.steps = 9;
  r.no_sync_steps = 2;
  r.since_step = Millis(123);
  r.compute = Millis(45);
  r.last_wall = Millis(67);
  r.state = RankStatus::State::kSucceeded;
  r.since_exit = Millis(89);
  summary.ranks.push_back(r);
  NodeSummary back = parse_summary(encode_summary(summary));
  EXPECT_EQ(back.node, 1);
  EXPECT_EQ(back.host, "node-b");
  EXPECT_EQ(back.addr, "10.0.0.2");
  EXPECT_EQ(back.version, 42u);
  ASSERT_EQ(back.ranks.size(), 1u);
  const RankStatus& b = back.ranks[0];
  EXPECT_EQ(b.rank, 3);
  EXPECT_EQ(b.local_rank, 1);
  EXPECT_EQ(b.node, 1);
  EXPECT_EQ(b.host, "node-b");
  EXPECT_EQ(b.pid, 1003);
  EXPECT_EQ(b.state, RankStatus::State::kSucceeded);
  EXPECT_EQ(b.since_exit, Millis(89));
  EXPECT_EQ(b.steps, 9u);
  EXPECT_EQ(b.no_sync_steps, 2u);
  EXPECT_EQ(b.since_step, Millis(123));
  EXPECT_EQ(b.compute, Millis(45));
  EXPECT_EQ(b.last_wall, Millis(67));
  ASSERT_EQ(b.groups.size(), 1u);
  EXPECT_EQ(b.groups[0].name, "default");
  EXPECT_EQ(b.groups[0].issued, 14u);
  EXPECT_EQ(b.groups[0].completed, 13u);
  EXPECT_EQ(b.groups[0].last_kind, progress::Kind::kAllreduce);
  EXPECT_EQ(b.groups[0].last_bytes, 1280u);
  EXPECT_EQ(b.groups[0].waiting, seconds(4));
  EXPECT_EQ(b.groups[0].since_completed, seconds(5));
}

TEST(Summary, BadSummariesAreProtocolErrors) {
  const std::string good = encode_summary(
      NodeSummary{0, "h", "127.0.0.1", 1, {rank_at(0, 2, 1, std::chrono::seconds(1))}, {}});
  EXPECT_NO_THROW(parse_summary(good));
  for (const std::string& bad :
       {std::string("not json"), std::string("[]"), std::string(R"({"node":0})"),
        std::string(R"({"node":"0","host":"h","v":1,"ranks":[]})"),
        std::string(R"({"node":0,"host":"h","v":1,"ranks":[{"r":0}]})"),
        std::string(std::string(100000, '[') + std::string(100000, ']'))}) {
    EXPECT_THROW(parse_summary(bad), ProtocolError) << bad.substr(0, 60);
  }
  // Completed more than issued, a negative age, an unknown state.
  std::string twisted = good;
  twisted.replace(twisted.find("\"c\":1"), 5, "\"c\":9");
  EXPECT_THROW(parse_summary(twisted), ProtocolError);
  twisted = good;
  twisted.replace(twisted.find("\"w\":"), 4, "\"w\":-");
  EXPECT_THROW(parse_summary(twisted), ProtocolError);
  twisted = good;
  twisted.replace(twisted.find("\"st\":0"), 6, "\"st\":7");
  EXPECT_THROW(parse_summary(twisted), ProtocolError);
}

TEST(Summary, CarriesTheHangItsNodeFound) {
  std::vector<RankStatus> ranks = {rank_at(0, 14, 13, seconds(4)), rank_at(1, 13, 13),
                                   rank_at(2, 14, 13, seconds(4)), rank_at(3, 14, 13, seconds(4))};
  NodeSummary summary{0, "h0", "127.0.0.1", 5, {ranks[0], ranks[1]}, find_hang(ranks, seconds(3))};
  ASSERT_TRUE(summary.hang);
  summary.hang->found_by = 0;
  NodeSummary back = parse_summary(encode_summary(summary));
  ASSERT_TRUE(back.hang);
  EXPECT_EQ(back.hang->kind, Hang::Kind::kBehind);
  EXPECT_EQ(back.hang->culprits, std::vector<int>{1});
  EXPECT_EQ(back.hang->group, "default");
  EXPECT_EQ(back.hang->seq, 13u);
  EXPECT_EQ(back.hang->collective, progress::Kind::kAllreduce);
  EXPECT_EQ(back.hang->duration, summary.hang->duration);
  EXPECT_EQ(back.hang->found_by, 0);
  EXPECT_EQ(back.hang->summary, summary.hang->summary);
  EXPECT_EQ(back.hang->ranks, summary.hang->ranks);
  // No hang, no field.
  summary.hang.reset();
  EXPECT_FALSE(parse_summary(encode_summary(summary)).hang);
  // A peer's text is bounded, and its fields typed.
  std::string text = encode_summary(NodeSummary{0, "h0", "127.0.0.1", 5, {}, Hang{}});
  auto at = text.find("\"summary\":\"\"");
  ASSERT_NE(at, std::string::npos) << text;
  std::string huge = text;
  huge.insert(at + 11, std::string(5000, 'x'));
  EXPECT_THROW(parse_summary(huge), ProtocolError);
  std::string typed = text;
  typed.replace(typed.find("\"culprits\":[]"), 13, "\"culprits\":[\"a\"]");
  EXPECT_THROW(parse_summary(typed), ProtocolError);
}

TEST(Straggler, TheEndOfJobScoresUseTheMeanComputeOfTheRound) {
  std::vector<RankStatus> ranks(2);
  ranks[0].rank = 0;
  ranks[0].compute = Millis(500);  // just paused for a checkpoint
  ranks[0].mean_compute = Millis(100);
  ranks[0].last_wall = Millis(2000);
  ranks[1].rank = 1;
  ranks[1].compute = Millis(100);
  ranks[1].mean_compute = Millis(100);
  ranks[1].last_wall = Millis(2000);
  EXPECT_NEAR(straggler_scores(ranks)[0], 0.2, 1e-9);
  EXPECT_DOUBLE_EQ(straggler_scores(ranks, &RankStatus::mean_compute)[0], 1.0);
}

TEST(Summary, AgesAdvanceByTheTimeASummaryWaited) {
  RankStatus r = rank_at(0, 3, 2, seconds(1), seconds(2));
  advance_ages(r, seconds(3));
  EXPECT_EQ(r.groups[0].waiting, seconds(4));
  EXPECT_EQ(r.groups[0].since_completed, seconds(5));
  EXPECT_EQ(r.summary_age, seconds(3));
}

TEST(ProgressPageFile, ReadsWhatAWorkerWroteAndDistrustsIt) {
  auto file = ProgressPageFile::create();
  ASSERT_GE(file->fd(), 3);
  RankStatus r;
  file->read(r, progress::now_ns(), seconds(1));
  EXPECT_FALSE(r.has_page);  // nobody attached
  EXPECT_TRUE(r.groups.empty());

  // Write as a worker would, through a second mapping of the descriptor.
  void* memory =
      ::mmap(nullptr, progress::kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, file->fd(), 0);
  ASSERT_NE(memory, MAP_FAILED);
  auto* page = static_cast<progress::Page*>(memory);
  EXPECT_EQ(page->magic, progress::kMagic);
  const std::int64_t now = progress::now_ns();
  page->pid = 4242;
  page->steps = 7;
  page->compute_ns = 250'000'000;
  auto& slot = page->groups[0];
  std::memset(slot.name, 'x', sizeof(slot.name));  // no terminating NUL
  slot.name[3] = '\n';
  slot.size = 4;
  slot.issued = 10;
  slot.completed = 9;
  slot.last_kind = 999;  // not a kind
  slot.waiting_since_ns = now - 2'000'000'000;
  slot.last_completed_ns = now + 5'000'000'000;  // in the future
  slot.in_use = 1;
  file->read(r, now, seconds(10));
  ::munmap(memory, progress::kPageBytes);
  EXPECT_TRUE(r.has_page);
  EXPECT_EQ(r.steps, 7u);
  EXPECT_EQ(r.compute, Millis(250));
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(r.groups[0].name, "xxx?" + std::string(progress::kNameBytes - 4, 'x'));
  EXPECT_EQ(r.groups[0].last_kind, progress::Kind::kNone);
  EXPECT_EQ(r.groups[0].waiting, seconds(2));
  EXPECT_EQ(r.groups[0].since_completed, Millis(0));
  EXPECT_TRUE(r.groups[0].in_collective());
  file->close_fd();
  EXPECT_EQ(file->fd(), -1);
}

}  // namespace
}  // namespace ddp::agent
