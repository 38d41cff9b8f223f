// The dynamic (c10d, etcd) rendezvous handler: elastic membership over any
// Store. rendezvous/PROTOCOL.md is the protocol; this handler is its executor,
// over three parts that each do one thing:
//   dynamic_keys.h  the keys and the store calls that read and write records;
//   join_state.h    the join as a state record and its decisions (pure);
//   liveness.h      keep-alives and death verdicts (counters, or leases);
//   spare.h         waiting behind a full round.
//
// Joining round r: a node takes an arrival index and writes its record.
// Arrival 0 decides (membership.h: decide_round) when max_nodes are there, or
// min_nodes and either every survivor of round r-1 or the end of last call;
// another node decides only if none did long after (arrival 0 died). The
// decision is published once and read by all. A node that arrives after the
// decision, or is not chosen, asks a round below max_nodes to re-form with it
// (R/end "joined <member>"), or waits as a spare behind a full one. An
// arrival index without its record holds a round up by at most kRecordGrace,
// then counts as no arrival; a round considers at most kMaxArrivals arrivals.
// A node that finds itself declared lost rejoins with a new member id.
//
// Run ids on a shared store (a ddp-rendezvous daemon, etcd): P/config holds
// the job using the run id; a node of another job is refused while any node
// of that job is alive, and takes the run id over otherwise.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/common/background.h"
#include "ddp/rendezvous/rendezvous.h"
#include "dynamic_keys.h"
#include "join_state.h"
#include "liveness.h"
#include "spare.h"

namespace ddp::rendezvous_detail {

class DynamicRendezvous : public RendezvousHandler {
 public:
  // `runtime` must outlive the handler; `backend` is what backend() returns.
  // Liveness uses leases when `store`'s client has leases and watches.
  // Throws InvalidArgument for bad params.
  DynamicRendezvous(const RendezvousParams& params, RendezvousStore store, const Runtime& runtime,
                    std::string backend = "c10d");
  ~DynamicRendezvous() override;

  std::unique_ptr<Round> join() override;
  void shutdown(std::chrono::milliseconds deadline) override;
  int num_nodes_waiting() override;
  void on_wait(std::function<void(const std::string&)> note) override {
    wait_note_ = std::move(note);
  }

  // The probe reads the liveness strategy's view of the node it judges.
  void observe_keep_alives(const std::function<void(KeepAliveProbe)>& observer) override;
  std::optional<JobCounts> job_counts() override;
  JobCounts count_round_end(const JobCounts& mine, int round, const RoundEndCount& how) override;
  std::shared_ptr<Store> store() override;
  std::shared_ptr<Store> open_store() override;
  std::string store_name() const override;
  std::string store_token() const override { return store_.token(); }
  std::string backend() const override { return backend_; }
  const RendezvousParams& params() const override { return params_; }

  // ---- the steps of join(), public so that tests drive them with a fake
  // clock and no threads. Each is a few store calls and never waits.

  // Registers this node for the next round; asks a running round below
  // max_nodes to re-form with it, or waits as a spare behind a full one.
  void begin_join();
  // One look at the round being joined (deciding it when this node should):
  // its info once it formed with this node, else nullopt. Throws TimeoutError
  // past join_timeout, ShutdownError when the job ended while this node waited.
  std::optional<RendezvousInfo> step();
  // One keep-alive tick on `store` (Liveness::tick).
  void liveness_tick(Store& store) { liveness_->tick(store); }
  // This node's member id.
  std::string member() const { return liveness_->member(); }

 private:
  std::string round_prefix(int round) const { return keys_.round(round); }
  // A round of one node: no store at all.
  RendezvousInfo solo_round();
  // Takes an arrival index in `round` and writes this node's record.
  void arrive(int round);
  // --worker master port, or a free one (this node may become group rank 0).
  std::uint16_t worker_master_port() const;
  // Reads what the decision needs and publishes it when the round is decided.
  bool decide();
  std::optional<RendezvousInfo> on_closed(const Decision& decision);
  // The round formed without this node: it joins the next one.
  void on_late(int nodes);
  void admit_or_wait_behind(int round, int nodes);
  void wait_for_change();
  // Tells on_wait's note what step() waits for now, once per round and kind.
  void note_wait(Clock::time_point now);
  Duration membership_grace(int group_world_size);
  // Whether another member of the last round shows a sign of life
  // (Round::needed_by_others); one look that never waits.
  bool others_alive();
  void start_liveness();
  // Deletes round `round`'s keys in the background; nobody waits for it.
  void forget_round(int round);

  RendezvousParams params_;
  RendezvousStore store_;
  const Runtime& time_;
  std::string backend_;
  RunKeys keys_;
  JoinRules rules_;
  std::shared_ptr<Liveness> liveness_;
  std::unique_ptr<BackgroundWorker> liveness_worker_;
  JoinState join_;
  int last_round_ = -1;
  int last_nodes_ = 0;
  // The key listing the last round's members ("R/members_<decider>").
  std::string members_key_;
  // The last round's other members (read at the first look), and what the
  // looks saw of their keep-alives.
  std::optional<std::vector<std::string>> others_;
  std::map<std::string, HeartbeatTracker> others_seen_;
  // While this node waits behind a full round.
  std::optional<SpareWait> spare_;
  std::function<void(const std::string&)> wait_note_;
  // The last wait told (round and kind), so that each is told once.
  std::optional<std::pair<int, int>> wait_told_;
};

}  // namespace ddp::rendezvous_detail
