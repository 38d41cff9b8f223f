// The join's decisions (rendezvous/src/join_state.h) as pure functions of a
// state record and the time: no store, no clock, no thread.
#include "join_state.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ddp::rendezvous_detail {
namespace {

using namespace std::chrono_literals;

const Clock::time_point kT0 = Clock::time_point() + std::chrono::hours(1000);

JoinRules rules(int min_nodes, int max_nodes) {
  JoinRules r;
  r.nodes = RoundRule{min_nodes, max_nodes};
  r.join_timeout = 600s;
  r.last_call_timeout = 30s;
  r.verdict = 15s;
  return r;
}

Arrival arrival(const std::string& member, int local_world_size = 1) {
  Arrival a;
  a.member = member;
  a.local_world_size = local_world_size;
  a.addr = "host-" + member;
  a.master_port = 1000;
  a.store_port = 2000;
  return a;
}

// A decider (arrival 0) that has read `members`' records at kT0.
JoinState read_by_decider(const JoinRules& r, const std::vector<std::string>& members) {
  JoinState join = start_join(r, 0, 0, kT0 + r.join_timeout, kT0);
  for (std::size_t i = 0; i < members.size(); ++i)
    note_record(join, static_cast<int>(i), arrival(members[i]), kT0);
  join.lineage = Lineage{};
  return join;
}

TEST(JoinState, ArrivalZeroDecidesAtOnceAndAnotherOnlyAfterTheFallback) {
  const auto r = rules(2, 2);
  EXPECT_TRUE(may_decide(start_join(r, 0, 0, kT0 + 600s, kT0), kT0));
  const JoinState second = start_join(r, 0, 1, kT0 + 600s, kT0);
  EXPECT_EQ(second.fallback_at, kT0 + 30s + 15s) << "last call plus a verdict";
  EXPECT_FALSE(may_decide(second, kT0 + 44s));
  EXPECT_TRUE(may_decide(second, kT0 + 45s));
  const JoinState past = start_join(r, 0, kMaxArrivals, kT0 + 600s, kT0);
  EXPECT_FALSE(may_decide(past, kT0 + 1000s)) << "an index the round never considers";
}

TEST(JoinState, RecordsToReadAreTheUnreadThenNoneMissingPastTheirGrace) {
  JoinState join = start_join(rules(2, 4), 0, 0, kT0 + 600s, kT0);
  EXPECT_EQ(records_to_read(join, 3, kT0), (std::vector<int>{0, 1, 2}));
  note_record(join, 0, arrival("a"), kT0);
  note_record(join, 1, std::nullopt, kT0);
  note_record(join, 2, arrival("c"), kT0);
  EXPECT_TRUE(awaiting_record(join, kT0 + 4s));
  EXPECT_EQ(records_to_read(join, 4, kT0 + 1s), (std::vector<int>{1, 3}))
      << "the missing one again, then the new one";
  note_record(join, 1, std::nullopt, kT0 + 3s);
  EXPECT_EQ(join.missing.at(1), kT0) << "the first time it was seen missing is kept";
  EXPECT_FALSE(awaiting_record(join, kT0 + kRecordGrace));
  EXPECT_EQ(records_to_read(join, 3, kT0 + kRecordGrace), std::vector<int>{})
      << "past its grace an arrival without a record did not happen";
}

TEST(JoinState, ARecordThatComesWithinItsGraceIsNoLongerMissing) {
  JoinState join = start_join(rules(1, 2), 0, 0, kT0 + 600s, kT0);
  note_record(join, 0, std::nullopt, kT0);
  note_record(join, 0, arrival("a"), kT0 + 1s);
  EXPECT_TRUE(join.missing.empty());
  EXPECT_FALSE(awaiting_record(join, kT0 + 1s));
  ASSERT_TRUE(join.arrivals[0]);
  EXPECT_EQ(join.arrivals[0]->member, "a");
}

TEST(JoinState, APlanWaitsForLastCallBelowMaxAndThenAssignsEveryArrival) {
  const auto r = rules(2, 3);
  JoinState join = read_by_decider(r, {"a", "b"});
  join.arrivals[1]->local_world_size = 4;
  EXPECT_FALSE(plan_round(join, r, 2, kT0)) << "min nodes, last call just started";
  EXPECT_FALSE(plan_round(join, r, 2, kT0 + 29s));
  const auto plan = plan_round(join, r, 2, kT0 + 30s);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->decision.decider, 0);
  EXPECT_EQ(plan->decision.nodes, 2);
  EXPECT_EQ(plan->decision.considered, 2);
  EXPECT_EQ(plan->decision.world, 5);
  EXPECT_EQ(plan->members, (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(plan->assignments.size(), 2u);
  EXPECT_EQ(plan->assignments[0].group_rank, 0);
  EXPECT_EQ(plan->assignments[0].base_rank, 0);
  EXPECT_EQ(plan->assignments[0].watched_member, "b");
  EXPECT_EQ(plan->assignments[1].group_rank, 1);
  EXPECT_EQ(plan->assignments[1].base_rank, 1);
  EXPECT_EQ(plan->assignments[1].watched_rank, 0);
  EXPECT_EQ(plan->assignments[1].watched_member, "a");
  EXPECT_EQ(plan->decision.master_addr, "host-a");
  EXPECT_EQ(plan->decision.master_port, 1000);
  EXPECT_EQ(plan->decision.store_port, 2000);
}

TEST(JoinState, LastCallStartsAtMinNodesOfDistinctMembers) {
  const auto r = rules(2, 3);
  JoinState join = read_by_decider(r, {"a", "a"});  // one member's record twice
  EXPECT_FALSE(plan_round(join, r, 2, kT0));
  EXPECT_EQ(join.last_call.deadline(), Clock::time_point::max()) << "one member is below min";
  EXPECT_FALSE(plan_round(join, r, 2, kT0 + 31s));
  note_record(join, 2, arrival("b"), kT0 + 31s);
  EXPECT_FALSE(plan_round(join, r, 3, kT0 + 31s));
  EXPECT_EQ(join.last_call.deadline(), kT0 + 31s + 30s) << "it starts with the second member";
}

TEST(JoinState, AtMaxNodesThePlanIsImmediateAndLaterArrivalsAreSpares) {
  const auto r = rules(1, 2);
  JoinState join = read_by_decider(r, {"a", "b", "c"});
  const auto plan = plan_round(join, r, 3, kT0);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->decision.nodes, 2);
  EXPECT_EQ(plan->decision.considered, 3);
  EXPECT_FALSE(plan->assignments[0].spare);
  EXPECT_FALSE(plan->assignments[1].spare);
  EXPECT_TRUE(plan->assignments[2].spare);
}

TEST(JoinState, AnArrivalWhoseRecordNeverCameIsASpareAndHoldsThePlanOnlyWithinItsGrace) {
  const auto r = rules(2, 3);
  JoinState join = start_join(r, 0, 0, kT0 + 600s, kT0);
  join.lineage = Lineage{};
  note_record(join, 0, arrival("a"), kT0);
  note_record(join, 1, std::nullopt, kT0);
  note_record(join, 2, arrival("c"), kT0);
  note_record(join, 3, arrival("d"), kT0);
  EXPECT_FALSE(plan_round(join, r, 4, kT0 + 1s)) << "the missing record may yet come";
  const auto plan = plan_round(join, r, 4, kT0 + kRecordGrace);
  ASSERT_TRUE(plan) << "three records at max nodes";
  EXPECT_EQ(plan->decision.nodes, 3);
  EXPECT_EQ(plan->decision.considered, 4);
  EXPECT_TRUE(plan->assignments[1].spare);
  EXPECT_EQ(plan->members, (std::vector<std::string>{"a", "c", "d"}));
}

TEST(JoinState, AReformationWaitsForEverySurvivorNotForLastCall) {
  const auto r = rules(1, 4);
  JoinState join = read_by_decider(r, {"b"});
  join.lineage = Lineage{{"a", "b", "c"}, "a"};
  EXPECT_FALSE(plan_round(join, r, 1, kT0)) << "survivor c has not arrived";
  note_record(join, 1, arrival("c"), kT0 + 1s);
  const auto plan = plan_round(join, r, 2, kT0 + 1s);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->members, (std::vector<std::string>{"b", "c"}));
}

TEST(JoinState, AWaiterWakesForTheDecisionOrItsTurnToDecide) {
  const auto r = rules(2, 2);
  const JoinState join = start_join(r, 0, 1, kT0 + 600s, kT0);
  const Wake wake = next_wake(join, r, kT0);
  EXPECT_EQ(wake.kind, Wake::Kind::kClosed);
  EXPECT_EQ(wake.until, join.fallback_at);
}

TEST(JoinState, ADeciderWakesForTheRecordThatCanChangeItsDecision) {
  const auto r = rules(3, 5);
  JoinState join = read_by_decider(r, {"a"});
  Wake wake = next_wake(join, r, kT0);
  EXPECT_EQ(wake.kind, Wake::Kind::kRecord);
  EXPECT_EQ(wake.index, 2) << "min nodes' record";
  EXPECT_EQ(wake.until, kT0 + 600s) << "last call has not started";

  note_record(join, 1, arrival("b"), kT0);
  note_record(join, 2, arrival("c"), kT0);
  EXPECT_FALSE(plan_round(join, r, 3, kT0));  // last call starts at min nodes
  wake = next_wake(join, r, kT0);
  EXPECT_EQ(wake.index, 4) << "max nodes' record";
  EXPECT_EQ(wake.until, kT0 + 30s) << "or the end of last call";

  note_record(join, 3, std::nullopt, kT0 + 2s);
  wake = next_wake(join, r, kT0 + 2s);
  EXPECT_EQ(wake.index, 3) << "a missing record first";
  EXPECT_EQ(wake.until, kT0 + 2s + kRecordGrace);
}

TEST(JoinState, InAReformationTheDeciderWakesForTheLastSurvivor) {
  const auto r = rules(1, 8);
  JoinState join = read_by_decider(r, {"a"});
  join.lineage = Lineage{{"a", "b", "c", "d"}, "d"};
  const Wake wake = next_wake(join, r, kT0);
  EXPECT_EQ(wake.kind, Wake::Kind::kRecord);
  EXPECT_EQ(wake.index, 2) << "three survivors: arrivals 0, 1, 2";
}

TEST(JoinState, AJoinTimesOutAtItsDeadline) {
  const JoinState join = start_join(rules(2, 2), 0, 0, kT0 + 600s, kT0);
  EXPECT_FALSE(timed_out(join, kT0 + 599s));
  EXPECT_TRUE(timed_out(join, kT0 + 600s));
}

}  // namespace
}  // namespace ddp::rendezvous_detail
