// The agent's watch over its workers' progress: creates each worker's
// progress page, reads the pages every tick, shares this node's summary with
// the other nodes (progress_exchange.h), and compares every rank: a hang
// (hang_detector.h) and stragglers (straggler.h). It decides nothing about
// processes: the agent collects stacks, writes the incident and applies
// --on_hang.
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

  // A new round: `store` carries the summaries when the round has more than
  // one node. Workers kept from the last round (end_round(true)) stay.
  void begin_round(const RendezvousInfo& info, std::shared_ptr<Store> store);
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
    // Reported, not acted on: the timeout is auto and the hang may be
    // legitimate work (may_be_work).
    bool report_only = false;
  };
  // One look: reads the pages, publishes, compares. Returns a hang the first
  // time it is found in a round (nullopt afterwards, and while none): found
  // here, or found first by another node and carried by its summary (the same
  // hang on every node). Logs straggler warnings.
  std::optional<Verdict> check();

  // The round ends (another node ended it): one more look, reading the other
  // nodes' summaries at once (waiting for the store at most `wait`), so that a
  // hang another node found and acted on is reported here too. Nullopt when
  // there is none, or it was reported already.
  std::optional<Verdict> last_look(Millis wait);

  // Every rank as last seen (this node's and the others').
  const std::vector<RankStatus>& ranks() const { return view_; }

  // The other nodes of the round as last seen (in the last look).
  struct NodeSeen {
    int node = 0;
    bool heard = false;  // a summary came
    std::string host, addr;
    bool stale = false;
    Millis age{0};  // since its summary last changed
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
  // Which of this node's workers a hang names.
  Verdict verdict_on(Hang hang, Millis timeout, std::vector<std::string> unreachable) const;
  // Sends this node's ranks (and found_) to the other nodes.
  void publish(const std::vector<RankStatus>& local, bool urgent);
  // This node's ranks in view_.
  std::vector<RankStatus> view_local() const;

  WatchOptions options_;
  std::string host_;
  const Runtime& runtime_;
  HangTimeout timeout_;
  StragglerWatch stragglers_;
  RendezvousInfo info_;
  std::map<int, Local> locals_;
  std::unique_ptr<ProgressExchange> exchange_;
  std::uint64_t version_ = 0;
  bool reported_ = false;
  // The hang this node found in the round: it goes out with every summary.
  std::optional<Hang> found_;
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
