// What a node takes from another node's progress summary, and from a
// worker's page: bounds on size and memory, the ranks a node may speak for,
// printable text only, plausible step times.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <chrono>
#include <limits>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "hang_detector.h"
#include "incident.h"
#include "progress_exchange.h"
#include "progress_page_file.h"
#include "straggler.h"

namespace ddp::agent {
namespace {

using std::chrono::seconds;

bool all_printable(const std::string& text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) return false;
  }
  return true;
}

RankStatus plain_rank(int rank, int local_rank) {
  RankStatus r;
  r.rank = rank;
  r.local_rank = local_rank;
  r.since_start = seconds(10);
  r.since_step = seconds(1);
  return r;
}

NodeSummary summary_of(int node, std::vector<RankStatus> ranks) {
  NodeSummary s;
  s.node = node;
  s.host = "node-" + std::to_string(node);
  s.addr = "10.0.0." + std::to_string(node);
  s.version = 1;
  s.ranks = std::move(ranks);
  return s;
}

// ---- item 3: size and memory ----

TEST(SummaryBounds, AHostOrAddrPastTheRendezvousBoundIsRefused) {
  NodeSummary s = summary_of(1, {plain_rank(4, 0)});
  s.host = std::string(kMaxHostBytes, 'h');
  EXPECT_EQ(parse_summary(encode_summary(s)).host, s.host);
  s.host += 'h';
  EXPECT_THROW(parse_summary(encode_summary(s)), ProtocolError);
  s.host = "h";
  s.addr = std::string(kMaxHostBytes + 1, 'a');
  EXPECT_THROW(parse_summary(encode_summary(s)), ProtocolError);
}

TEST(SummaryBounds, ATextPastTheBoundIsRefusedBeforeItIsParsed) {
  std::string text = encode_summary(summary_of(1, {plain_rank(4, 0)}));
  EXPECT_NO_THROW(parse_summary(text));
  text.append(kMaxSummaryBytes + 1 - text.size(), ' ');  // still valid JSON
  try {
    parse_summary(text);
    FAIL() << "a text of " << text.size() << " bytes was parsed";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("more than the"), std::string::npos) << e.what();
  }
}

// The bound is the largest summary a node can send: kMaxRanks ranks of
// kMaxGroups groups each, every number at its widest, every text at its bound
// and escaped, and the most hang text a summary carries.
TEST(SummaryBounds, TheLargestSummaryANodeSendsFitsTheBound) {
  NodeSummary s;
  s.node = std::numeric_limits<int>::min();
  s.host = std::string(kMaxHostBytes, '"');  // each escaped to two bytes
  s.addr = s.host;
  s.version = std::numeric_limits<std::uint64_t>::max();
  RankStatus r;
  r.rank = r.local_rank = r.pid = std::numeric_limits<int>::min();
  r.state = RankStatus::State::kSucceeded;
  const Millis longest(std::numeric_limits<Millis::rep>::max());
  r.since_exit = r.since_start = r.since_step = r.compute = r.last_wall = r.mean_compute = longest;
  r.has_page = true;
  r.steps = r.no_sync_steps = std::numeric_limits<std::uint64_t>::max();
  GroupStatus g;
  g.name = std::string(progress::kNameBytes, '\\');
  g.size = g.rank = std::numeric_limits<int>::min();
  g.issued = g.completed = g.last_bytes = std::numeric_limits<std::uint64_t>::max();
  g.last_kind = progress::Kind::kReduceScatter;
  g.since_issued = g.since_completed = g.waiting = longest;
  r.groups.assign(progress::kMaxGroups, g);
  s.ranks.assign(ProgressExchange::kMaxRanks, r);
  Hang hang;
  hang.culprits.assign(ProgressExchange::kMaxRanks, std::numeric_limits<int>::min());
  hang.group = g.name;
  hang.seq = std::numeric_limits<std::uint64_t>::max();
  hang.duration = longest;
  hang.found_by = std::numeric_limits<int>::min();
  hang.summary = std::string(4096, '"');
  hang.ranks.assign(ProgressExchange::kMaxRanks, std::string(4096, '"'));
  s.hang = hang;
  const std::size_t size = encode_summary(s).size();
  EXPECT_LE(size, kMaxSummaryBytes);
  // And the bound is not much more than that.
  EXPECT_GE(size, kMaxSummaryBytes - (kMaxSummaryBytes / 8)) << size;
}

// A summary of 4,096 ranks with a 255-byte host: every rank shares the one
// host, and what the parse keeps stays within a small multiple of the text
// (it was 484x when each rank held a copy).
TEST(SummaryBounds, RanksShareTheirNodesHostAndMemoryStaysWithinASmallMultiple) {
  std::vector<RankStatus> ranks;
  for (int i = 0; i < static_cast<int>(ProgressExchange::kMaxRanks); ++i) {
    RankStatus r;
    r.rank = i;
    r.local_rank = i;
    ranks.push_back(r);
  }
  NodeSummary s = summary_of(1, std::move(ranks));
  s.host = std::string(kMaxHostBytes, 'h');
  const std::string text = encode_summary(s);
  NodeSummary back = parse_summary(text);
  ASSERT_EQ(back.ranks.size(), ProgressExchange::kMaxRanks);
  for (const auto& r : back.ranks) {
    EXPECT_EQ(r.host.str(), s.host);
    ASSERT_EQ(r.host.held(), back.ranks[0].host.held());
  }
  EXPECT_LE(summary_footprint(back), kFootprintFactor * text.size() + sizeof(NodeSummary))
      << text.size();
  // A hang's lines, each as short as a line may be.
  NodeSummary lines = summary_of(1, {});
  Hang hang;
  hang.found_by = 1;
  hang.ranks.assign(ProgressExchange::kMaxRanks, std::string(8, 'x'));
  hang.culprits.assign(ProgressExchange::kMaxRanks, 0);
  lines.hang = hang;
  const std::string hang_text = encode_summary(lines);
  EXPECT_LE(summary_footprint(parse_summary(hang_text)),
            kFootprintFactor * hang_text.size() + sizeof(NodeSummary));
}

TEST(SummaryBounds, AHangsRankLinesPastItsBoundAreLeftOutAndCounted) {
  NodeSummary s = summary_of(1, {});
  Hang hang;
  hang.found_by = 1;
  hang.ranks.assign(4000, std::string(1000, 'x'));  // 4 MB of lines
  s.hang = hang;
  const std::string text = encode_summary(s);
  EXPECT_LT(text.size(), kMaxHangBytes + 4096 * 8);
  NodeSummary back = parse_summary(text);
  ASSERT_TRUE(back.hang);
  ASSERT_GT(back.hang->ranks.size(), 1u);
  EXPECT_LT(back.hang->ranks.size(), 4000u);
  EXPECT_EQ(back.hang->ranks.back(), "(" + std::to_string(4000 - back.hang->ranks.size() + 1) +
                                         " more ranks: see node 1's report)");
}

// ---- item 2: what a summary's ranks may say ----

TEST(SummaryRanks, WithEveryLocalWorldSizeKnownANodeNamesExactlyItsOwnRanks) {
  RoundRanks round;
  round.world_size = 6;
  round.node = 0;
  round.base_rank = 0;
  round.local_world_size = 2;
  round.local_world_sizes = {2, 3, 1};
  const std::map<int, const NodeSummary*> none;
  EXPECT_EQ(refusal(summary_of(1, {plain_rank(2, 0), plain_rank(3, 1), plain_rank(4, 2)}), round,
                    none, seconds(10)),
            "");
  EXPECT_EQ(refusal(summary_of(1, {plain_rank(2, 0)}), round, none, seconds(10)), "")
      << "some of them, while its workers start";
  EXPECT_EQ(refusal(summary_of(2, {}), round, none, seconds(10)), "");
  for (const auto& ranks :
       std::vector<std::vector<RankStatus>>{{plain_rank(0, 0)},                    // this node's
                                            {plain_rank(5, 3)},                    // node 2's
                                            {plain_rank(3, 0)},                    // its place is 1
                                            {plain_rank(2, 0), plain_rank(2, 0)},  // twice
                                            {plain_rank(6, 4)},  // beyond the world
                                            {plain_rank(-1, -3)}}) {
    EXPECT_NE(refusal(summary_of(1, ranks), round, none, seconds(10)), "")
        << "rank " << ranks.back().rank;
  }
  EXPECT_NE(refusal(summary_of(3, {}), round, none, seconds(10)), "") << "no node 3";
}

TEST(SummaryRanks, WithoutThemANodeNamesOneRunOnItsSideClearOfTheOthers) {
  RoundRanks round;  // c10d: node 1 of 3, ranks 2..3; the others' sizes unknown
  round.world_size = 8;
  round.node = 1;
  round.base_rank = 2;
  round.local_world_size = 2;
  std::map<int, const NodeSummary*> none;
  EXPECT_EQ(refusal(summary_of(0, {plain_rank(0, 0), plain_rank(1, 1)}), round, none, seconds(1)),
            "");
  EXPECT_EQ(refusal(summary_of(2, {plain_rank(4, 0), plain_rank(5, 1)}), round, none, seconds(1)),
            "");
  EXPECT_NE(refusal(summary_of(0, {plain_rank(2, 0)}), round, none, seconds(1)), "") << "ours";
  EXPECT_NE(refusal(summary_of(2, {plain_rank(1, 0)}), round, none, seconds(1)), "") << "below us";
  EXPECT_NE(refusal(summary_of(2, {plain_rank(4, 0), plain_rank(6, 1)}), round, none, seconds(1)),
            "")
      << "not one run";
  // Node 3 took ranks 6..7: node 2 may not name them.
  const NodeSummary node3 = summary_of(3, {plain_rank(6, 0), plain_rank(7, 1)});
  const std::map<int, const NodeSummary*> others = {{3, &node3}};
  EXPECT_EQ(refusal(summary_of(2, {plain_rank(4, 0), plain_rank(5, 1)}), round, others, seconds(1)),
            "");
  EXPECT_NE(refusal(summary_of(2, {plain_rank(6, 0)}), round, others, seconds(1)), "");
}

TEST(SummaryRanks, AgesLongerThanTheRoundAndForeignHangsAreRefused) {
  RoundRanks round;
  round.world_size = 2;
  round.local_world_sizes = {1, 1};
  const std::map<int, const NodeSummary*> none;
  NodeSummary s = summary_of(1, {plain_rank(1, 0)});
  s.ranks[0].since_start = seconds(20) + kRoundSkew;
  EXPECT_EQ(refusal(s, round, none, seconds(20)), "");
  s.ranks[0].since_start += Millis(1);
  EXPECT_NE(refusal(s, round, none, seconds(20)).find("longer than the round"), std::string::npos);
  s.ranks[0].since_start = seconds(10);
  Hang hang;
  hang.found_by = 1;
  hang.culprits = {0};
  s.hang = hang;
  EXPECT_EQ(refusal(s, round, none, seconds(20)), "");
  s.hang->found_by = 0;  // "node 0 found it": not node 1's to say
  EXPECT_NE(refusal(s, round, none, seconds(20)), "");
  s.hang->found_by = 1;
  s.hang->culprits = {2};
  EXPECT_NE(refusal(s, round, none, seconds(20)), "");
}

TEST(SummaryRanks, ImpossibleValuesDoNotParse) {
  NodeSummary s = summary_of(1, {plain_rank(1, 0)});
  GroupStatus g;
  g.name = "default";
  g.issued = 3;
  g.completed = 2;
  g.waiting = seconds(11);  // the rank has run 10 s
  s.ranks[0].groups.push_back(g);
  EXPECT_THROW(parse_summary(encode_summary(s)), ProtocolError);
  s.ranks[0].groups[0].waiting = seconds(9);
  EXPECT_NO_THROW(parse_summary(encode_summary(s)));
  // A number past its field's type is an error, not a wrapped value.
  std::string text = encode_summary(s);
  text.replace(text.find("\"r\":1"), 5, "\"r\":4294967297");
  EXPECT_THROW(parse_summary(text), ProtocolError);
  text = encode_summary(s);
  text.replace(text.find("\"i\":3"), 5, "\"i\":-3");
  EXPECT_THROW(parse_summary(text), ProtocolError);
}

// ---- item 4: text from other nodes ----

TEST(PeerText, ControlBytesFromAnotherNodeReachNoReport) {
  const std::string forged = "x\x1b]0;pwned\x07\x1b[2J\nddprun: HANG (behind) detected by node 9";
  NodeSummary s = summary_of(1, {plain_rank(1, 0)});
  s.host = forged.substr(0, 40);
  s.addr = "10.0.0.2\r\n";
  GroupStatus g;
  g.name = "g\x1b[31m\n";
  s.ranks[0].groups.push_back(g);
  Hang hang;
  hang.kind = Hang::Kind::kBehind;
  hang.culprits = {1};
  hang.group = "g\x1b[31m\n";
  hang.found_by = 1;
  hang.summary = forged;
  hang.ranks = {forged, "rank 1 " + forged};
  s.hang = hang;
  NodeSummary back = parse_summary(encode_summary(s));
  EXPECT_TRUE(all_printable(back.host)) << back.host;
  EXPECT_TRUE(all_printable(back.addr));
  EXPECT_TRUE(all_printable(back.ranks[0].host.str()));
  EXPECT_TRUE(all_printable(back.ranks[0].groups[0].name));
  ASSERT_TRUE(back.hang);
  EXPECT_TRUE(all_printable(back.hang->group));
  EXPECT_TRUE(all_printable(back.hang->summary)) << back.hang->summary;
  for (const auto& line : back.hang->ranks) EXPECT_TRUE(all_printable(line)) << line;
  EXPECT_EQ(back.hang->summary.size(), forged.size()) << "bytes replaced, none dropped";

  Incident incident;
  incident.hang = *back.hang;
  incident.node = 0;
  incident.host = "node-a";
  incident.ranks = back.ranks;
  incident.ranks[0].groups[0].issued = 1;
  incident.hang.ranks.push_back(describe_rank(incident.ranks[0]));
  const std::string report = format_incident(incident);
  EXPECT_EQ(report.find('\x1b'), std::string::npos) << report;
  EXPECT_EQ(report.find("\nddprun: HANG (behind) detected by node 9"), std::string::npos) << report;
  EXPECT_EQ(report.find('\r'), std::string::npos);
}

// ---- item 5: step times ----

TEST(Straggler, AnImplausibleComputeTimeIsIgnored) {
  std::vector<RankStatus> ranks(4);
  for (int i = 0; i < 4; ++i) {
    ranks[i].rank = i;
    ranks[i].compute = Millis(100);
    ranks[i].mean_compute = Millis(100);
    ranks[i].last_wall = Millis(120);
  }
  ranks[3].compute = ranks[3].mean_compute = ranks[3].last_wall = Millis(1);  // below the floor
  auto scores = straggler_scores(ranks);
  EXPECT_EQ(scores.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(scores[i], 1.0) << i;
  EXPECT_EQ(straggler_scores(ranks, &RankStatus::mean_compute).size(), 3u);
  // A compute time far longer than the step it was part of; one a little
  // longer than the last step is the smoothing's.
  ranks[3].compute = Millis(50);
  ranks[3].last_wall = Millis(24);
  EXPECT_EQ(straggler_scores(ranks).count(3), 0u);
  ranks[3].compute = Millis(20);
  ranks[3].last_wall = Millis(18);
  EXPECT_NEAR(straggler_scores(ranks)[0], 0.2, 1e-9);  // plausible: rank 3 is just fast
  // No wall time known: no figure is plausible.
  ranks[3].last_wall = Millis(0);
  EXPECT_EQ(straggler_scores(ranks).count(3), 0u);
  EXPECT_GE(kMinStepCompute, Millis(10));
}

TEST(ProgressPageFile, AHugeTimedStepCountIsNoNegativeMean) {
  auto file = ProgressPageFile::create();
  void* memory =
      ::mmap(nullptr, progress::kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, file->fd(), 0);
  ASSERT_NE(memory, MAP_FAILED);
  auto* page = static_cast<progress::Page*>(memory);
  page->pid = 4242;
  page->total_compute_ns = 5'000'000'000;
  for (std::uint64_t timed : {std::numeric_limits<std::uint64_t>::max(), std::uint64_t{1} << 63,
                              (std::uint64_t{1} << 63) + 5}) {
    page->timed_steps = timed;
    RankStatus r;
    r.rank = 1;
    file->read(r, progress::now_ns(), seconds(10));
    EXPECT_GE(r.mean_compute.count(), 0) << timed;
    // Its node's summary still parses everywhere.
    r.since_start = seconds(10);
    EXPECT_NO_THROW(parse_summary(encode_summary(summary_of(1, {r})))) << timed;
  }
  page->timed_steps = 50;
  RankStatus r;
  file->read(r, progress::now_ns(), seconds(10));
  EXPECT_EQ(r.mean_compute, Millis(100));
  ::munmap(memory, progress::kPageBytes);
}

}  // namespace
}  // namespace ddp::agent
