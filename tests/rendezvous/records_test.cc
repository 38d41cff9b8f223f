// The dynamic rendezvous' record codec (rendezvous/src/records.h) and the
// round's end (round.h): every record round-trips, and a value that is not
// what ddprun writes (out of range, trailing junk, a number that is a prefix,
// a sum that would overflow) is a ProtocolError naming its key, never a bare
// "stoi", a narrowed count, or undefined behaviour.
#include "records.h"

#include <gtest/gtest.h>

#include <climits>
#include <string>

#include "ddp/common/error.h"
#include "ddp/rendezvous/round.h"

namespace ddp::rendezvous_detail {
namespace {

// Expects `parse` to throw a ProtocolError that names `key`.
template <typename Parse>
void expect_refused(Parse parse, const std::string& key, const std::string& value) {
  try {
    parse();
    ADD_FAILURE() << "accepted '" << value << "' at " << key;
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("'" + key + "'"), std::string::npos) << e.what();
  }
}

TEST(Records, ArrivalRoundTripsAndOutOfRangeFieldsAreRefused) {
  Arrival a;
  a.member = "0123456789abcdef";
  a.node_rank = 3;
  a.local_world_size = 8;
  a.master_port = 29500;
  a.store_port = 41000;
  a.addr = "node-7.cluster";
  const Arrival back = parse_arrival(encode_arrival(a), "k");
  EXPECT_EQ(back.member, a.member);
  EXPECT_EQ(back.node_rank, 3);
  EXPECT_EQ(back.local_world_size, 8);
  EXPECT_EQ(back.master_port, 29500);
  EXPECT_EQ(back.store_port, 41000);
  EXPECT_EQ(back.addr, a.addr);
  const std::string key = "rdzv/job/round_0/rec_1";
  for (const std::string value :
       {"m 0 0 1 0 h", "m 0 4097 1 0 h", "m 0 2147483647 1 0 h", "m -2 1 1 0 h", "m 0 1 65536 0 h",
        "m 0 1 1 0", "m 0 1 1 0 h extra", "m 0 1x 1 0 h", "m 0 +1 1 0 h", "m 0 99999999999 1 0 h",
        "bad/member 0 1 1 0 h", "", "m 0 1 1 0 h\x01"}) {
    expect_refused([&] { parse_arrival(value, key); }, key, value);
  }
}

TEST(Records, StaticNodeRoundTripsAndOutOfRangeFieldsAreRefused) {
  StaticNode n;
  n.local_world_size = 8;
  n.master_port = 29500;
  n.addr = "node-7.cluster";
  n.nonce = 18446744073709551615ull;  // the whole unsigned range
  const StaticNode back = parse_static_node(encode_static_node(n), "k");
  EXPECT_EQ(back.local_world_size, 8);
  EXPECT_EQ(back.master_port, 29500);
  EXPECT_EQ(back.addr, n.addr);
  EXPECT_EQ(back.nonce, n.nonce);
  const std::string key = "rdzv/job/0123456789abcdef/round_0/node_1";
  for (const std::string value :
       {"0 0 h 1", "4097 0 h 1", "2147483648 0 h 1", "1 65536 h 1", "1 -1 h 1", "1 0 h",
        "1 0 h 1 extra", "1 0 h -1", "1 0 h 18446744073709551616", "1x 0 h 1", "1 0 h\x01 1", "",
        "1 0 h 0x1"}) {
    expect_refused([&] { parse_static_node(value, key); }, key, value);
  }
}

TEST(Records, DecisionBoundsItsCountsSoNoSumOverflowsAndNoLoopRunsAway) {
  Decision d;
  d.decider = 2;
  d.nodes = 3;
  d.world = 24;
  d.considered = 5;
  d.master_addr = "10.0.0.1";
  d.master_port = 29500;
  const Decision back = parse_decision(encode_decision(d), "k");
  EXPECT_EQ(encode_decision(back), encode_decision(d));
  const std::string key = "rdzv/job/round_4/closed";
  // Before: `considered` up to 2^31 built that many key strings when the round
  // was deleted, and stoi failures surfaced as a bare "stoi".
  for (const std::string value :
       {"0 0 1 1 h 1 0", "0 2 1 2 h 1 0", "0 1 4097 1 h 1 0", "0 1 1 0 h 1 0", "0 1 1 65537 h 1 0",
        "0 1 1 2147483647 h 1 0", "-1 1 1 1 h 1 0", "65536 1 1 1 h 1 0", "x 1 1 1 h 1 0",
        "0 1 1 1 h 1", "0 1 1 1 h 1 0 0"}) {
    expect_refused([&] { parse_decision(value, key); }, key, value);
  }
}

TEST(Records, AssignmentIsCheckedAgainstItsDecision) {
  Decision d;
  d.nodes = 3;
  d.world = 6;
  d.considered = 4;
  Assignment a;
  a.group_rank = 2;
  a.base_rank = 4;
  a.watched_member = "abc";
  a.watched_rank = 0;
  const Assignment back = parse_assignment(encode_assignment(a), "k", d);
  EXPECT_EQ(back.group_rank, 2);
  EXPECT_EQ(back.base_rank, 4);
  EXPECT_EQ(back.watched_member, "abc");
  EXPECT_TRUE(parse_assignment("spare", "k", d).spare);
  const std::string key = "rdzv/job/round_1/assign_0_3";
  for (const std::string value :
       {"3 0 abc 0", "0 6 abc 0", "0 0 abc 3", "0 0 - 1", "0 0 abc", "spare now"}) {
    expect_refused([&] { parse_assignment(value, key, d); }, key, value);
  }
  Decision single;
  single.nodes = 1;
  single.world = 2;
  single.considered = 1;
  EXPECT_EQ(parse_assignment("0 0 - 0", "k", single).watched_member, "");
}

TEST(Records, MembersCurrentAndKeepAlives) {
  EXPECT_EQ(parse_members(encode_members({"a", "b-1", "C_2"}), "k"),
            (std::vector<std::string>{"a", "b-1", "C_2"}));
  EXPECT_TRUE(parse_members("", "k").empty());
  expect_refused([] { parse_members("a b/c", "rdzv/job/round_0/members_0"); },
                 "rdzv/job/round_0/members_0", "a b/c");
  const Current c = parse_current(encode_current({7, 3}), "k");
  EXPECT_EQ(c.round, 7);
  EXPECT_EQ(c.nodes, 3);
  for (const std::string value : {"7", "7 0", "-1 3", "1073741825 3", "7 3 1", "7x 3"}) {
    expect_refused([&] { parse_current(value, "rdzv/job/current"); }, "rdzv/job/current", value);
  }
  EXPECT_EQ(parse_lease_id("7587869471437650177", "k"), 7587869471437650177);
  for (const std::string value : {"0", "-5", "12abc", "", "99999999999999999999"}) {
    expect_refused([&] { parse_lease_id(value, "rdzv/job/alive/m"); }, "rdzv/job/alive/m", value);
  }
  EXPECT_EQ(considered_arrivals(-3), 0);
  EXPECT_EQ(considered_arrivals(5), 5);
  EXPECT_EQ(considered_arrivals(std::int64_t{1} << 40), kMaxArrivals) << "clamped, never narrowed";
}

TEST(Records, AValueShownInAMessageIsCutAndMasked) {
  EXPECT_EQ(shown_value("nnodes=2:2 program=train.py"), "nnodes=2:2 program=train.py");
  EXPECT_EQ(shown_value(std::string("a\nb\x1b[31m\x7f\xff", 10)), "a?b?[31m??");
  const std::string shown = shown_value(std::string(100, 'x'));
  EXPECT_EQ(shown, std::string(80, 'x') + "...");
}

TEST(Records, EveryRoundEndRoundTripsAndOddTextIsNone) {
  // Before: encode_round_end(kStoreLost) wrote a value parse_round_end refused.
  for (RoundEnd::Kind kind :
       {RoundEnd::Kind::kRestart, RoundEnd::Kind::kAbort, RoundEnd::Kind::kDone,
        RoundEnd::Kind::kNodeLost, RoundEnd::Kind::kNodeJoined, RoundEnd::Kind::kStoreLost}) {
    RoundEnd end;
    end.kind = kind;
    end.node = 2;
    end.value = 139;
    end.member = "f00d";
    auto back = parse_round_end(encode_round_end(end));
    ASSERT_TRUE(back) << encode_round_end(end);
    EXPECT_EQ(back->kind, kind);
    EXPECT_EQ(encode_round_end(*back), encode_round_end(end));
  }
  for (const std::string value :
       {"restart 1", "restart 1 3 4", "restart 1 3 hang hang", "abort 1 3 Hang", "done hang",
        "lost 2 f00d hang", "restart x 3", "restart 1 3x", "lost 2", "lost 2 a/b", "joined",
        "done now", "", "lost -1 m", "abort 1 99999"}) {
    EXPECT_FALSE(parse_round_end(value)) << value;
  }
}

// A node that ended the round over a hang says so in the end itself, so that
// every node reports the hang from the summaries in the store instead of
// racing their next exchange (issue 29 item 6). Before: "restart 1 -9 hang"
// did not parse (the round watch turned it into a lost store).
TEST(Records, ARoundEndedOverAHangSaysSo) {
  for (const std::string value : {"restart 1 -9 hang", "abort 0 0 hang"}) {
    auto end = parse_round_end(value);
    ASSERT_TRUE(end) << value;
    EXPECT_TRUE(end->hang) << value;
    EXPECT_EQ(encode_round_end(*end), value);
  }
  auto plain = parse_round_end("restart 1 -9");
  ASSERT_TRUE(plain);
  EXPECT_FALSE(plain->hang);
  RoundEnd end;
  end.kind = RoundEnd::Kind::kRestart;
  end.node = 1;
  end.value = -9;
  end.hang = true;
  EXPECT_EQ(encode_round_end(end), "restart 1 -9 hang");
  EXPECT_NE(describe(end).find("after a hang"), std::string::npos) << describe(end);
}

}  // namespace
}  // namespace ddp::rendezvous_detail
