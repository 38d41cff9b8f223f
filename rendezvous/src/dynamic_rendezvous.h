// The dynamic (c10d) rendezvous handler: elastic membership over any Store.
//
// Keys, under P = "rdzv/<run_id>/" (records.h has every value's format):
//   P/current                  "<round> <nodes>" of the last round that formed
//   P/alive/<member>           a node's keep-alive counter (its own key: O(1) per node)
//   R = P/round_<r>:
//     R/arrivals               add counter: a node's arrival index
//     R/rec_<i>                arrival i's record (records.h: Arrival)
//     R/closed                 the round's one decision (records.h: Decision), set once by
//                              compare_set
//     R/assign_<d>_<i>         decider d's answer to arrival i (records.h: Assignment)
//     R/members_<d>            the members in group-rank order (the next round's lineage)
//     R/end, R/exit_barrier    how the round ended (round.h), and the exit barrier
//
// An arrival index without its record (a node killed between taking its
// index and writing its record, or anyone's add to R/arrivals) holds a round
// up by at most kRecordGrace, then counts as no arrival. A round considers at
// most kMaxArrivals arrivals: a larger count is clamped, never narrowed.
//
// Joining round r: a node adds itself to R/arrivals and writes its record. Arrival 0
// decides (membership.h: decide_round) when max_nodes are there, or min_nodes and
// either every survivor of round r-1 or the end of last call; another node decides
// only if none did long after (arrival 0 died). The decision is published once and
// read by all: no shared blob rewritten by every node. A node that arrives after
// the decision, or is not chosen, asks a round below max_nodes to re-form with it
// (R/end "joined <member>"), or waits as a spare behind a full one.
//
// Liveness, on a store without leases (the built-in one): every node writes
// P/alive/<member> every keep_alive_interval on a thread and store connection of
// its own; during a round, group rank g also reads the key of rank g+1 (mod n)
// every quarter interval (at most every 200 ms) and, once it has not moved for
// keep_alive_interval x keep_alive_max_attempt on g's own clock, ends the round
// with "lost <g+1> <member>".
// On a store with leases (LeaseStore: etcd): P/alive/<member> holds the id of the
// node's lease (TTL keep_alive_interval x keep_alive_max_attempt), which the
// node refreshes every keep_alive_interval; the store deletes the key when the
// lease expires, and group rank g, which watches rank g+1's key, ends the round
// on its DELETE event: pushed, never polled.
// A node that finds itself declared lost rejoins with a new member id.
//
// Run ids on a shared store (a ddp-rendezvous daemon, etcd): P/config holds the
// node range of the job using the run id; a node with another range is refused
// while any node of that job is alive, and takes the run id over otherwise.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/background.h"
#include "ddp/rendezvous/rendezvous.h"
#include "ddp/store/lease_store.h"
#include "membership.h"

namespace ddp::rendezvous_detail {

class DynamicRendezvous : public RendezvousHandler {
 public:
  // `runtime` must outlive the handler; `backend` is what backend() returns.
  // When `store.store` is a LeaseStore, liveness uses its leases.
  // Throws InvalidArgument for bad params.
  DynamicRendezvous(const RendezvousParams& params, RendezvousStore store, const Runtime& runtime,
                    std::string backend = "c10d");
  ~DynamicRendezvous() override;

  RendezvousInfo next_rendezvous() override;
  void shutdown(std::chrono::milliseconds deadline) override;
  std::unique_ptr<RoundWatch> watch_round(const RendezvousInfo& info,
                                          std::function<void()> wake) override;
  std::unique_ptr<PendingEnd> end_round(const RendezvousInfo& info, const RoundEnd& end) override;
  void arrive_at_exit_barrier(const RendezvousInfo& info, Clock::time_point deadline) override;
  int num_nodes_waiting() override;
  std::chrono::milliseconds grace_for_membership_change(const RendezvousInfo& info) override;

  std::shared_ptr<Store> store() override;
  std::shared_ptr<Store> open_store() override;
  std::string store_name() const override;
  std::string store_token() const override { return store_.token; }
  std::string backend() const override { return backend_; }
  const RendezvousParams& params() const override { return params_; }

  // ---- the steps of next_rendezvous(), public so that tests drive them with a
  // fake clock and no threads. Each is a few store calls and never waits.

  // Registers this node for the next round; asks a running round below
  // max_nodes to re-form with it, or waits as a spare behind a full one.
  void begin_join();
  // One look at the round being joined (deciding it when this node should):
  // its info once it formed with this node, else nullopt. Throws TimeoutError
  // past join_timeout, ShutdownError when the job ended while this node waited.
  std::optional<RendezvousInfo> step();
  // One keep-alive tick on `store`: writes this node's key when it is due and
  // judges the watched node (ending the round when it is dead).
  void liveness_tick(Store& store);
  // This node's member id.
  std::string member() const;

 private:
  struct Join {
    int round = 0;
    // This node's arrival index (a counter anyone may add to: not narrowed).
    std::int64_t index = -1;
    Clock::time_point deadline;
    Clock::time_point fallback_at;
    // A full round this node waits behind as a spare (-1: none).
    int spare_of = -1;
    LastCall last_call{1, Duration(0)};
    // Arrival i's record, once read (decider); nullopt while it is missing.
    std::vector<std::optional<Arrival>> arrivals;
    // Arrivals whose record was missing, since when (this node's clock). A
    // node writes its record right after taking its index; one that died in
    // between never will: its record missing kRecordGrace later means that
    // arrival did not happen.
    std::map<int, Clock::time_point> missing;
    std::optional<Lineage> lineage;
  };
  struct Watched {
    std::string round_prefix;
    int group_rank = -1;
    std::string member;
    HeartbeatTracker tracker;
  };

  std::string prefix() const { return "rdzv/" + params_.run_id + "/"; }
  std::string round_prefix(int round) const { return prefix() + "round_" + std::to_string(round); }
  std::string alive_key(const std::string& member) const { return prefix() + "alive/" + member; }
  // Refuses a run id that a live job with another node range uses (P/config).
  void claim_run_id();
  // Whether some node of the job at P/current (or forming its first round) is alive.
  bool job_alive();
  void join_round(int round);
  // Where this round's workers reach their store; `master` is group rank 0's arrival.
  void set_worker_store(RendezvousInfo& info, const std::string& master_addr,
                        std::uint16_t master_store_port) const;
  // Leases: puts this node's key on a lease of its own (a new lease for a new member id).
  void put_leased_key();
  // Leases: watches the watched member's key and ends the round when it is deleted.
  void watch_for_death(const std::string& round_prefix, int rank, const std::string& member);
  std::chrono::milliseconds lease_grace(const std::vector<std::string>& keys);
  // --worker master port, or a free one (this node may become group rank 0).
  std::uint16_t worker_master_port() const;
  // Whether this node decides the round it joins at `now`: arrival 0 at
  // once, another arrival the round considers from join_.fallback_at on.
  bool may_decide(Clock::time_point now) const;
  // When a node other than arrival 0 decides a round it joined at `now`.
  Clock::time_point fallback_after(Clock::time_point now) const;
  bool decide(Join& join);
  // Reads the records of arrivals not read yet, below `count`, into `join`
  // (in batches; missing ones are noted in join.missing at `now`).
  void read_arrivals(Store& store, const std::string& round_prefix, int count, Join& join,
                     Clock::time_point now);
  Lineage load_lineage(int round);
  std::optional<RendezvousInfo> on_closed(const std::string& closed);
  void on_late(int nodes);
  void admit_or_wait_behind(int round, int nodes);
  // A spare's look at the full round it waits behind: when none of its
  // members shows a sign of life (on a LeaseStore: none of their keep-alive
  // keys exists; else none of their counters moved for keep_alive_interval x
  // keep_alive_max_attempt on this node's clock), ends it as "lost" (its job
  // crashed, and nobody is left to end it) and returns the end; else nullopt.
  std::optional<std::string> end_if_dead(Store& store, int round, Clock::time_point now);
  void wait_for_change();
  void start_liveness();
  void stop_liveness(std::chrono::milliseconds deadline);
  // Deletes round `round`'s keys in the background; nobody waits for it.
  void forget_round(int round);
  // Deletes round R's keys (its workers' keys cannot be listed and stay).
  static void delete_round_keys(Store& store, const std::string& round_prefix);
  static std::optional<std::string> try_get(Store& store, const std::string& key);

  RendezvousParams params_;
  RendezvousStore store_;
  const Runtime& time_;
  std::string backend_;
  // Non-null when the store has leases (liveness by lease and DELETE events).
  std::shared_ptr<LeaseStore> leases_;
  std::unique_ptr<StoreWatch> death_watch_;
  Join join_;
  int last_round_ = -1;
  int last_nodes_ = 0;
  // The key listing the last round's members ("R/members_<decider>").
  std::string members_key_;
  // While a spare: the full round's end, once the wait for it returned it,
  // and what it saw of that round's members' keep-alive counters.
  std::optional<std::string> spare_end_;
  std::map<std::string, HeartbeatTracker> spare_watch_;

  // Shared with the liveness worker, which holds no reference to the handler
  // (a worker blocked in a frozen store past shutdown's deadline is abandoned).
  struct Liveness {
    std::string prefix;
    Duration interval;
    const Runtime* time = nullptr;
    std::mutex mutex;
    std::string member;
    std::int64_t beats = 0;
    Clock::time_point next_write{};
    std::optional<Watched> watched;
    // Leases: this node's lease (0: none yet, or it expired) and the member whose key it holds.
    LeaseStore::LeaseId lease = 0;
    std::string leased_member;
  };
  // One tick of the keep-alive thread: counters (writes this node's key,
  // judges the watched one) or, on a LeaseStore, refresh_tick.
  static void tick(Liveness& liveness, Store& store);
  // Refreshes this node's lease when due.
  static void refresh_tick(Liveness& liveness, LeaseStore& store);

  std::shared_ptr<Liveness> liveness_;
  std::unique_ptr<BackgroundWorker> liveness_worker_;
};

}  // namespace ddp::rendezvous_detail
