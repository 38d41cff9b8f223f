// How every node learns where every rank is: each agent publishes a compact
// summary of its ranks (rank_status.h: states, collective counters, waits,
// steps) once per period in its node's key of the round's area
// ("<round prefix>/area/<group rank>", ddp/rendezvous/round.h) in the
// agents' store, on its own thread and store handle, and reads the other
// nodes' summaries on the same tick. A hang check then compares all ranks
// without asking anyone anything.
//
// Ages are relative to the publisher's clock when it wrote them; a reader adds
// how long ago it first saw that version (its own clock), so no two clocks
// are compared. A summary whose version did not change for kStaleAfter
// periods is stale: its node's agent is unreachable or stopped.
//
// What a summary is trusted for: anyone holding the store's token can write
// any node's key, and a node's agent may be buggy. A summary is taken only
// when it parses within the bounds below (its size, every text printable and
// bounded, no impossible value) and names exactly its own node's ranks of
// the round (refusal()); otherwise it is refused, counted, and its node is
// named in one warning. Even then its hang is a claim: the watch ends a local
// rank only when that rank's own page confirms it (progress_watch.h).
//
// Ownership: shares the store handle with its thread. Blocking: publish(),
// remotes() and the destructor never block (the thread removes this node's
// key after the destructor, on its own, unless it carries a hang: the round's
// cleanup deletes that one); tick_now() waits as long as told.
// Thread-safety: one owner thread; its tick runs on another
// (BackgroundWorker). Errors: store failures are logged once per kind and
// retried next period; a summary that does not parse, or is refused, is
// ignored (and its node reads as never heard from, or as it was last heard).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/common/background.h"
#include "ddp/common/time.h"
#include "ddp/store/store.h"
#include "hang_detector.h"
#include "rank_status.h"

namespace ddp::agent {

struct NodeSummary {
  int node = 0;
  // Once per node (its ranks share `host`, rank_status.h); parsed ones are
  // printable and at most kMaxHostBytes.
  std::string host;
  std::string addr;           // where other nodes reach it (--local_addr), for status pages
  std::uint64_t version = 0;  // the publisher's counter
  std::vector<RankStatus> ranks;
  // The hang this node found in the round (it stays in every later summary),
  // so that every node reports the same one even when its own look would come
  // later, or too late (the culprit ended).
  std::optional<Hang> hang;
};

// The longest host or addr a summary may carry (as the rendezvous records
// bound an address).
inline constexpr std::size_t kMaxHostBytes = 255;
// The most text a hang in a summary carries (its summary and rank lines):
// encode_summary leaves out the rank lines past it, saying how many.
inline constexpr std::size_t kMaxHangBytes = 1 << 20;
// The longest summary parse_summary reads: the largest one encode_summary
// writes, rounded up. That one has kMaxRanks ranks of kMaxGroups groups each,
// every number at its widest and every text at its bound and escaped (two
// bytes a character), and a hang with kMaxHangBytes of text, escaped too:
// 11,872,319 bytes (SummaryBounds.TheLargestSummaryANodeSendsFitsTheBound).
inline constexpr std::size_t kMaxSummaryBytes = 12u << 20;
// A parsed summary holds at most this many times the bytes of its text (plus
// a few hundred: summary_footprint()); a summary of the same ranks is then
// no bigger in memory than on the wire, whatever it says.
inline constexpr std::size_t kFootprintFactor = 4;

// JSON, a few hundred bytes per rank.
std::string encode_summary(const NodeSummary& summary);
// Throws ProtocolError naming what is wrong: longer than kMaxSummaryBytes,
// bad JSON, a field of the wrong type or out of its type's range, more than
// kMaxRanks ranks or kMaxGroups groups per rank, a host or addr longer than
// kMaxHostBytes, an impossible value (a group that completed more than it
// issued, an age longer than its rank has run), a hang's text past its
// bounds. Every text comes back printable (ddp/common/text.h): a control
// byte another node sent reaches no terminal, log or report.
NodeSummary parse_summary(std::string_view text);

// The bytes `summary` holds: its entries and the heap bytes of its strings
// (a text held once counted once). For a parsed summary, at most
// kFootprintFactor x the text's size + sizeof(NodeSummary).
std::size_t summary_footprint(const NodeSummary& summary);

// The ranks of a round as this node knows them, for refusal().
struct RoundRanks {
  int world_size = 1;
  int node = 0;  // this node's group rank, base rank and local world size
  int base_rank = 0;
  int local_world_size = 1;
  // Every node's local world size by group rank, when the round tells them
  // (static rendezvous); empty otherwise (c10d, etcd).
  std::vector<int> local_world_sizes;
};

// How much later than this node another node may have begun the round (every
// node reads the same decision from the store; kept workers restart their
// clocks at the round's start): the slack of the "no older than the round" rule.
inline constexpr Millis kRoundSkew = std::chrono::seconds(60);

// Why `summary`, read under node `summary.node`'s key, is not one that node
// may send in this round; empty when it may. Its ranks must be its own: with
// every local world size known, ranks base..base+size-1 of its node (or some
// of them, while its workers start), local rank i being rank base+i; without,
// one such run of ranks within the world, on its side of this node's ranks
// (below for a lower group rank, above for a higher) and clear of the ranks
// of `others` (the other nodes' summaries already taken) in group-rank order.
// No rank may have run longer than `round_age` (how long this node has been
// in the round) + kRoundSkew. A hang must be its own node's find, name ranks
// of the world, and be no older than the round either.
std::string refusal(const NodeSummary& summary, const RoundRanks& round,
                    const std::map<int, const NodeSummary*>& others, Millis round_age);

class ProgressExchange {
 public:
  static constexpr int kStaleAfter = 4;  // periods
  static constexpr std::size_t kMaxRanks = 4096;

  // Node n's summary lives in the round's area, at round_area_key(round_prefix, n)
  // (ddp/rendezvous/round.h), which the rendezvous deletes with the round.
  // `ranks` says whose ranks each node's summary may name (refusal()); the
  // round's age counts from this call.
  ProgressExchange(std::shared_ptr<Store> store, std::string round_prefix, RoundRanks ranks,
                   int nodes, Millis period, const Runtime& runtime = real_runtime());
  ~ProgressExchange();
  ProgressExchange(const ProgressExchange&) = delete;
  ProgressExchange& operator=(const ProgressExchange&) = delete;

  // This node's ranks as they are now; the next tick writes them, or one at
  // once when `urgent` (a worker exited, a hang was found). Once a summary
  // carrying a hang was published, this node's key stays in the store when
  // the exchange ends (the round's cleanup deletes it): a node that learns of
  // the round's end over that hang reads it there.
  void publish(NodeSummary summary, bool urgent = false);

  // Whether the store took this node's summary of `version` (or a later one).
  bool written(std::uint64_t version) const;

  // Runs a tick now (writes what was published, reads the other nodes) and
  // waits for it at most `wait`; true when it ran in time.
  bool tick_now(Millis wait);

  struct Remote {
    NodeSummary summary;  // ages already advanced to `now`; stale marked
    bool stale = false;
    Millis age{0};  // since this version was first seen
  };
  // The other nodes heard from, by group rank.
  std::map<int, Remote> remotes(Clock::time_point now) const;
  // How many versions of each node's summary were refused, by group rank.
  std::map<int, int> refused() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  Millis period_;
  std::unique_ptr<BackgroundWorker> worker_;
};

// Adds `by` to every age of `rank` (a summary that waited in the store).
void advance_ages(RankStatus& rank, Millis by);

}  // namespace ddp::agent
