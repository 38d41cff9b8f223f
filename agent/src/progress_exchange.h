// How every node learns where every rank is: each agent publishes a compact
// summary of its ranks (rank_status.h: states, collective counters, waits,
// steps) once per period under "<round prefix>/progress/<group rank>" in the
// agents' store, on its own thread and store handle, and reads the other
// nodes' summaries on the same tick. A hang check then compares all ranks
// without asking anyone anything.
//
// Ages are relative to the publisher's clock when it wrote them; a reader adds
// how long ago it first saw that version (its own clock), so no two clocks
// are compared. A summary whose version did not change for kStaleAfter
// periods is stale: its node's agent is unreachable or stopped.
//
// Ownership: shares the store handle with its thread. Blocking: publish(),
// remotes() and the destructor never block (the thread removes this node's
// key after the destructor, on its own, unless it carries a hang); tick_now() waits as long as told. Thread-safety: one owner thread; its tick runs on
// another (BackgroundWorker). Errors: store failures are logged once per
// kind and retried next period; a summary that does not parse is ignored (and
// its node reads as never heard from).
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
  std::string host;
  std::string addr;           // where other nodes reach it (--local_addr), for status pages
  std::uint64_t version = 0;  // the publisher's counter
  std::vector<RankStatus> ranks;
  // The hang this node found in the round (it stays in every later summary),
  // so that every node reports the same one even when its own look would come
  // later, or too late (the culprit ended).
  std::optional<Hang> hang;
};

// JSON, a few hundred bytes per rank.
std::string encode_summary(const NodeSummary& summary);
// Throws ProtocolError naming what is wrong (bad JSON, a field of the wrong
// type, more than kMaxRanks ranks or kMaxGroups groups per rank).
NodeSummary parse_summary(std::string_view text);

class ProgressExchange {
 public:
  static constexpr int kStaleAfter = 4;  // periods
  static constexpr std::size_t kMaxRanks = 4096;

  // Node n's summary lives at progress_key(round_prefix, n) (ddp/rendezvous/round.h).
  ProgressExchange(std::shared_ptr<Store> store, std::string round_prefix, int node, int nodes,
                   Millis period, const Runtime& runtime = real_runtime());
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

 private:
  struct State;
  std::shared_ptr<State> state_;
  Millis period_;
  std::unique_ptr<BackgroundWorker> worker_;
};

// Adds `by` to every age of `rank` (a summary that waited in the store).
void advance_ages(RankStatus& rank, Millis by);

}  // namespace ddp::agent
