// The agent's watch over its workers' progress: creates each worker's
// progress page, reads the pages every tick, shares this node's summary with
// the other nodes (progress_exchange.h), and compares every rank: a hang
// (hang_detector.h) and stragglers (straggler.h). It decides nothing about
// processes: the agent collects stacks, writes the incident and applies
// --on_hang.
//
// Whom a hang ends: a hang found here, or claimed by another node's current
// (not stale) summary, is reported on every node; but a rank of this node is
// named for ending (Verdict::local_culprits) only when its own record
// confirms the claim (confirm_culprit(), hang_detector.h). A record that
// contradicts it makes a disagreement: one warning naming the node that
// found the hang and the rank, which is left running. While a record neither
// confirms nor contradicts (the rank did something in the group within the
// timeout) the report waits, a timeout at most, for it to do either.
//
// Ownership: owns the pages and the exchange of the current round. Blocking:
// never (the exchange's store calls run on its own thread). Thread-safety:
// the agent's thread only. Errors: prepare() throws InternalError when no
// page can be made.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ddp/agent/worker_spec.h"
#include "ddp/common/time.h"
#include "ddp/rendezvous/rendezvous.h"
#include "hang_detector.h"
#include "progress_exchange.h"
#include "progress_page_file.h"
#include "straggler.h"

namespace ddp::agent {

class ProgressWatch {
 public:
  // How long a found hang's summary may take to reach the store before the
  // culprit is ended anyway.
  static constexpr Millis kPublishWait = std::chrono::seconds(2);

  // `host` and `addr` name this node in its summaries.
  ProgressWatch(const WatchOptions& options, std::string host, std::string addr,
                const Runtime& runtime);
  ~ProgressWatch();

  // Whether the agent needs to tick at all (hang detection or pages on).
  bool active() const { return timeout_.enabled() || options_.progress_pages; }

  // A new round, in which this node runs `local_world_size` ranks from
  // info.base_rank: `store` carries the summaries when the round has more than
  // one node. Workers kept from the last round (end_round(true)) stay.
  void begin_round(const RendezvousInfo& info, int local_world_size, std::shared_ptr<Store> store);
  // Stops the exchange and forgets the round's workers (their pages go),
  // unless `keep_workers`: workers that recover in place live on into the
  // next round with their pages (see kept()).
  void end_round(bool keep_workers = false);

  // The page of the worker about to start at `local_rank`, or null (pages off).
  ProgressPageFile* prepare(int local_rank);
  void started(int local_rank, int rank, int pid);
  // The worker at `local_rank` was kept from the last round and is `rank` now.
  void kept(int local_rank, int rank);
  void exited(int local_rank, int status);

  struct Verdict {
    Hang hang;
    Millis timeout{0};
    // The culprits running on this node, by local rank.
    std::vector<int> local_culprits;
    // Nodes whose summary is stale or never came: "node 1 (no summary for 9.0 s)".
    std::vector<std::string> unreachable;
    // The culprits running on this node whose own record does not confirm
    // the hang: "rank 0 (local rank 0): its page shows it issued collective
    // #100 ...". They are not ended.
    std::vector<std::string> disputed;

    // Reported, not acted on: the timeout is auto and the hang may be
    // legitimate work (may_be_work).
    bool report_only = false;
  };
  // One look: reads the pages, publishes, compares. Returns a hang the first
  // time it is found in a round (nullopt afterwards, and while none): found
  // here, or found first by another node and carried by its current summary
  // (the same hang on every node). Logs straggler warnings, and a
  // disagreement warning per disputed culprit. `final`: the round ends, so
  // the report waits for no record (an unconfirmed culprit is disputed).
  std::optional<Verdict> check(bool final = false);

  // The round ends (another node ended it): one more look, reading the other
  // nodes' summaries at once (waiting for the store at most `wait`), so that a
  // hang another node found and acted on is reported here too. Nullopt when
  // there is none, or it was reported already.
  std::optional<Verdict> last_look(Millis wait);

  // Whether a hang was reported in this round (check() or last_look() returned it).
  bool reported() const { return reported_; }

  // The hang reported in this round is in the store for the other nodes to
  // read: this node's summary carrying the hang it found was written (waiting
  // at most `wait` for that, publishing it again when needed), or the hang
  // came from another node's summary (which keeps it there). False when no
  // hang was reported, or the store did not take it in time.
  bool hang_in_store(Millis wait);

  // Whether a rank of the round completed a step: this node's ranks as their
  // pages show now, the other nodes' as last seen. Nullopt when no rank has
  // a page (a program that writes none: its steps cannot be seen). Call it
  // before end_round().
  std::optional<bool> steps_seen() const;

  // Every rank as last seen (this node's and the others').
  const std::vector<RankStatus>& ranks() const { return view_; }

  // The other nodes of the round as last seen (in the last look).
  struct NodeSeen {
    int node = 0;
    bool heard = false;  // a summary came
    std::string host, addr;
    bool stale = false;
    Millis age{0};    // since its summary last changed
    int refused = 0;  // its summaries refused in the round (progress_exchange.h)
  };
  const std::vector<NodeSeen>& nodes() const { return nodes_; }
  // Each rank's recent straggler score (1.00 = fastest), and the ranks named
  // stragglers in this round.
  const std::map<int, double>& scores() const { return stragglers_.last_scores(); }
  const std::set<int>& stragglers() const { return stragglers_.named(); }
  // The ranks named stragglers since the last call.
  std::vector<int> take_new_stragglers() { return std::exchange(new_stragglers_, {}); }
  // Scores from each rank's mean compute time over the round ("rank 0 1.00,
  // rank 1 0.33 (straggler)"), or empty when no steps were seen.
  std::string straggler_summary() const;
  Millis timeout() const { return timeout_.current(); }

 private:
  struct Local {
    int rank = -1;
    int pid = 0;
    RankStatus::State state = RankStatus::State::kRunning;
    Clock::time_point started{};
    Clock::time_point exited{};
    std::unique_ptr<ProgressPageFile> page;
  };
  RankStatus status_of(int local_rank, const Local& local, std::int64_t now_ns,
                       Clock::time_point now) const;
  // What the other nodes said beyond their ranks.
  struct Remote {
    std::vector<std::string> unreachable;
    std::optional<Hang> hang;  // one a node found first
  };
  // Reads the pages, publishes them, and puts every rank known in view_.
  Remote look(Clock::time_point now);
  // The end-of-job scores and the straggler warnings.
  void note_stragglers(Clock::time_point now);
  // Which of this node's running workers a hang names, each judged by its
  // own record: confirmed ones into `local_culprits`, contradicted ones (and
  // with `final`, unconfirmed ones) into `disputed`; false when one is not
  // judged yet.
  bool judge(Verdict& verdict, bool final) const;
  // Sends this node's ranks (and found_) to the other nodes.
  void publish(const std::vector<RankStatus>& local, bool urgent);
  // This node's ranks in view_.
  std::vector<RankStatus> view_local() const;

  WatchOptions options_;
  SharedText host_;
  int local_world_size_ = 1;
  // Since when the hang now found or claimed waits for a culprit's record to
  // confirm or contradict it.
  std::optional<Clock::time_point> undecided_since_;
  const Runtime& runtime_;
  HangTimeout timeout_;
  StragglerWatch stragglers_;
  RendezvousInfo info_;
  std::map<int, Local> locals_;
  std::unique_ptr<ProgressExchange> exchange_;
  std::uint64_t version_ = 0;
  bool reported_ = false;
  // The hang this node found in the round: it goes out with every summary,
  // first in version found_version_.
  std::optional<Hang> found_;
  std::uint64_t found_version_ = 0;
  // The local ranks' states as last published (a change is published at once).
  std::vector<RankStatus::State> published_states_;
  std::vector<RankStatus> view_;
  std::vector<NodeSeen> nodes_;
  std::vector<int> new_stragglers_;
  std::string addr_;
  // Mean compute scores from the most complete view of the round.
  std::map<int, double> final_scores_;
};

}  // namespace ddp::agent
