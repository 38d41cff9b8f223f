// libFuzzer target for ddp::agent::parse_summary: arbitrary bytes as another
// node's progress summary, which anyone holding the store's token can write
// under any node's key, and every agent of the round reads.
//
// Build: scripts/fuzz --target summary_fuzz (the sources and includes are
// listed there as summary_sources and summary_includes).
// Run:
//   build/fuzz/summary_fuzz -max_len=65536 -timeout=20 <new-dir> tests/agent/fuzz/summary_corpus
//
// Invariants checked, for every input:
// - parse_summary throws nothing but ProtocolError;
// - what parses keeps its bounds: at most kMaxRanks ranks of kMaxGroups
//   groups, a host and addr of at most kMaxHostBytes, no group that completed
//   more than it issued, no age longer than its rank has run;
// - every text is printable ASCII (no control byte reaches a terminal);
// - its memory (summary_footprint: entries and string bytes) is at most
//   kFootprintFactor times the input plus sizeof(NodeSummary), and every rank
//   shares its node's one host;
// - encode_summary of it parses again to the same encoding (round trip);
// - refusal() against a few rounds neither throws nor crashes.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "ddp/common/error.h"
#include "progress_exchange.h"

namespace {

using ddp::agent::NodeSummary;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "summary_fuzz: invariant broken: %s\n", what);
  std::abort();
}

bool printable(const std::string& text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) return false;
  }
  return true;
}

void check_bounds(const NodeSummary& s, std::size_t input) {
  using ddp::agent::ProgressExchange;
  if (s.host.size() > ddp::agent::kMaxHostBytes || s.addr.size() > ddp::agent::kMaxHostBytes)
    fail("host or addr past its bound");
  if (!printable(s.host) || !printable(s.addr)) fail("host or addr not printable");
  if (s.ranks.size() > ProgressExchange::kMaxRanks) fail("too many ranks");
  for (const auto& r : s.ranks) {
    if (r.host.str() != s.host) fail("a rank's host is not its node's");
    if (r.host.held() != s.ranks.front().host.held()) fail("a rank holds its own copy of the host");
    if (r.groups.size() > static_cast<std::size_t>(ddp::progress::kMaxGroups))
      fail("too many groups");
    if (r.since_exit > r.since_start || r.since_step > r.since_start)
      fail("an age longer than the rank has run");
    for (const auto& g : r.groups) {
      if (g.completed > g.issued) fail("completed more than issued");
      if (g.name.size() > ddp::progress::kNameBytes || !printable(g.name)) fail("a group's name");
      if (g.waiting > r.since_start || g.since_completed > r.since_start ||
          g.since_issued > r.since_start)
        fail("a group's age longer than the rank has run");
    }
  }
  if (s.hang) {
    if (!printable(s.hang->summary) || !printable(s.hang->group)) fail("a hang's text");
    std::size_t bytes = s.hang->summary.size();
    for (const auto& line : s.hang->ranks) {
      if (!printable(line)) fail("a hang's rank line is not printable");
      bytes += line.size();
    }
    if (bytes > ddp::agent::kMaxHangBytes) fail("a hang's text past its bound");
  }
  if (ddp::agent::summary_footprint(s) > ddp::agent::kFootprintFactor * input + sizeof(NodeSummary))
    fail("the parsed summary holds more than kFootprintFactor x its text");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  NodeSummary summary;
  try {
    summary = ddp::agent::parse_summary(text);
  } catch (const ddp::ProtocolError&) {
    return 0;
  }
  check_bounds(summary, size);

  const std::string encoded = ddp::agent::encode_summary(summary);
  NodeSummary again;
  try {
    again = ddp::agent::parse_summary(encoded);
  } catch (const ddp::ProtocolError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    fail("an encoded summary does not parse");
  }
  if (ddp::agent::encode_summary(again) != encoded) fail("the round trip changed the summary");

  // Whose ranks it may name, in a static round and a c10d one.
  ddp::agent::RoundRanks exact;
  exact.world_size = 8;
  exact.local_world_sizes = {2, 2, 2, 2};
  exact.local_world_size = 2;
  ddp::agent::RoundRanks relative = exact;
  relative.local_world_sizes.clear();
  relative.node = 1;
  relative.base_rank = 2;
  const std::map<int, const NodeSummary*> none;
  const std::map<int, const NodeSummary*> self = {{3, &again}};
  for (const auto* round : {&exact, &relative}) {
    (void)ddp::agent::refusal(summary, *round, none, std::chrono::seconds(30));
    (void)ddp::agent::refusal(summary, *round, self, std::chrono::seconds(30));
  }
  return 0;
}
