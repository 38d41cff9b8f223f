// Rendezvous: how the agents of a job (one per node) find each other, agree on
// group ranks and world size, and learn where worker rank 0 hosts PyTorch's
// store (MASTER_ADDR:MASTER_PORT).
//
// A job goes through numbered rounds: every restart (a worker failed) and, for
// c10d, every membership change (a node lost or admitted) starts a new one.
// Every round has its own key prefix in the store; workers get a prefix below it
// (RendezvousInfo::worker_prefix), so a worker of an old round can never touch
// the keys of a new one. While a round runs, the agent watches it
// (Round::watch) and ends it (Round::end, Round::arrive_at_exit_barrier); how an end is
// told and seen is the handler's (round.h).
//
// Job instances (static). Many jobs may share one long-lived store (ddp-rendezvous), and
// a run id may be reused. A multi-node job therefore claims an instance of its
// run id: a random nonce stored at "rdzv/<run_id>/instance", and every round
// lives under "rdzv/<run_id>/<instance>/round_<r>", so a new instance never
// reads an old one's records. The agents of an instance add to
// "rdzv/<run_id>/<instance>/heartbeat" every instance_heartbeat_interval (on a thread and
// store handle of their own); liveness is judged by a newcomer on its own clock
// (the counter moved, or did not move for instance_dead_after), never by comparing
// clocks of different nodes. A newcomer that finds
//   - no instance: claims one (no waiting at all);
//   - an instance still forming its first round: joins it, and checks in
//     parallel that its creator still heartbeats (it beats fast while forming,
//     so the check costs a normal start almost nothing); a dead one is taken over;
//   - an instance whose first round formed ("<instance>/started"): refuses to
//     start (InvalidArgument naming the run id) while it heartbeats, and takes
//     it over when it does not.
// Taking over replaces the instance nonce (compare_set from the old one) and
// deletes the old instance's keys that it can name. Keys of a finished round are
// deleted by group rank 0 once the next round formed; at the end of the job the
// last agent to call shutdown() deletes the rest, the instance key included.
// Workers' keys (below worker_prefix) cannot be listed through the Store
// interface and are not deleted.
// A single-node job (max_nodes == 1) never touches the store: its instance is a
// local random nonce, claimed nowhere.
//
// Handlers use the Store interface only, so they are tested against MemoryStore.
// Thread-safety: a handler is driven by one thread (the agent's); store() may be
// used from other threads (the Store is thread-safe).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/time.h"
#include "ddp/rendezvous/job_counts.h"
#include "ddp/rendezvous/rendezvous_store.h"
#include "ddp/rendezvous/round.h"
#include "ddp/store/store.h"

namespace ddp {

struct RendezvousParams {
  // The job's id (--rdzv_id); every key lives under "rdzv/<run_id>/".
  std::string run_id = "none";
  int min_nodes = 1;
  int max_nodes = 1;
  // This node's rank: required by the static handler (--node_rank); for c10d,
  // -1 when not given (group ranks then follow join order), else the sort key
  // of this node's group rank.
  int node_rank = 0;
  // Workers this node runs in every round (--nproc_per_node); may differ per node.
  int local_world_size = 1;
  // The address other nodes reach this node at (for MASTER_ADDR when this node
  // becomes group rank 0).
  std::string local_addr = "127.0.0.1";
  // How long a round waits for every node to join.
  std::chrono::milliseconds join_timeout = std::chrono::seconds(600);
  // c10d with min_nodes < max_nodes: once min_nodes have joined, how long the
  // round stays open for more (torchrun's default, as --rdzv_conf's).
  std::chrono::milliseconds last_call_timeout = std::chrono::seconds(30);
  // c10d: how often each node writes its keep-alive key, and how many in a row
  // it may miss before the node watching it declares it dead (torchrun's
  // keep_alive_interval and keep_alive_max_attempt).
  std::chrono::milliseconds keep_alive_interval = std::chrono::seconds(5);
  int keep_alive_max_attempt = 3;
  // A fixed MASTER_PORT for workers (0: group rank 0 picks a free port each round).
  std::uint16_t worker_master_port = 0;
  // Static, multi-node only: how often every agent of a running instance adds to its
  // heartbeat counter (the creator of a forming instance beats ten times as
  // often, so that joiners confirm it quickly).
  std::chrono::milliseconds instance_heartbeat_interval = std::chrono::seconds(1);
  // An instance whose heartbeat counter does not move for this long, observed
  // by a newcomer on its own clock, is dead and taken over. Must exceed
  // instance_heartbeat_interval by a margin for a slow store or a busy node.
  // (Not --rdzv_conf heartbeat_timeout, which bounds one keep-alive write:
  // RendezvousConfig::keep_alive_write_timeout.)
  std::chrono::milliseconds instance_dead_after = std::chrono::seconds(5);
  // c10d and etcd: what identifies this job among others that use the run id on
  // a shared store (the launcher: "nnodes=MIN:MAX program=<file name>", never
  // the program's arguments: they may differ per node and hold secrets, and
  // the signature is readable by other jobs); a node whose signature differs
  // from a live job's is refused. Empty: "nnodes=MIN:MAX".
  std::string job_signature;
};

// What one round decided, seen from one node.
struct RendezvousInfo {
  int round = 0;
  int group_rank = 0;
  int group_world_size = 1;
  // Global rank of this node's local rank 0 (sum of the local world sizes of the
  // nodes with a lower group rank).
  int base_rank = 0;
  int world_size = 1;
  // Local world size of every node, by group rank: filled by the static
  // handler and for a single node; empty in a multi-node c10d or etcd round,
  // whose decision gives each node only its own base rank.
  std::vector<int> local_world_sizes;
  // Where worker rank 0 may host PyTorch's store (env://).
  std::string master_addr;
  std::uint16_t master_port = 0;
  // The job instance's nonce, the round's key prefix in the store, and the
  // prefix workers get as DDP_STORE_PREFIX ("<round prefix>/workers"). Static:
  // "rdzv/<run_id>/<instance>/round_<r>". c10d and etcd: `instance` is this
  // node's member id and the prefix "rdzv/<run_id>/round_<r>" (for a single
  // node, "..._<member>": it touches no store). rendezvous/PROTOCOL.md has
  // every key.
  std::string instance;
  std::string round_prefix;
  std::string worker_prefix;
  // Where this round's workers reach their store (DDP_STORE_ADDR/PORT): the
  // agents' store, or for etcd the built-in one that group rank 0's agent serves.
  std::string store_addr;
  std::uint16_t store_port = 0;
};

// What this node sees of the keep-alives of the node it judges in a round of
// dynamic membership (its group rank + 1, wrapping), for whoever shows
// liveness (RendezvousHandler::observe_keep_alives).
struct KeepAliveView {
  int group_rank = 0;  // the node judged
  // Since its keep-alive counter last moved, on this node's clock (from the
  // round's start while it has not moved yet). Nullopt for leases (etcd),
  // whose age only the store knows: the key simply goes when it expires.
  std::optional<std::chrono::milliseconds> age;
  // How long without a keep-alive declares it lost (interval x max attempts).
  std::chrono::milliseconds lost_after{0};
};

// One round this node takes part in (RendezvousHandler::join): what it
// decided, and what the agent does with it while it runs (watch it, end it,
// pass its exit barrier). How an end is told and seen is the handler's
// (round.h). Must not outlive its handler. Thread-safety: used by the agent's
// thread; a watch's wake comes from another.
class Round {
 public:
  virtual ~Round() = default;
  const RendezvousInfo& info() const { return info_; }

  // Starts watching the round for its end: another agent ended it (end()),
  // every node passed the exit barrier, or the store was lost. `wake` is
  // called once, from another thread, when it ended; the watch then tells
  // how. Destroying the watch stops watching. Never blocks.
  virtual std::unique_ptr<RoundWatch> watch(std::function<void()> wake) = 0;

  // Ends the round for every agent (the first end set wins) on a thread of
  // its own and returns at once: the caller stops its workers meanwhile, then
  // waits for the PendingEnd as long as it likes. Never throws.
  virtual std::unique_ptr<PendingEnd> end(const RoundEnd& end) = 0;

  // This node's workers all succeeded: counts it at the round's exit barrier;
  // the last node to arrive ends the round with kDone (waiting for the store
  // at most until `deadline`). Throws the store's errors.
  virtual void arrive_at_exit_barrier(Clock::time_point deadline) = 0;

  // A worker of this node failed. With elastic membership the cause may be a
  // node that died: its peers' collectives fail at once, long before its
  // keep-alives are missed. Returns how long to wait for the round's watch to
  // report a membership change before calling it a worker failure: zero for
  // a fixed membership, or when every member of the round showed a
  // keep-alive within about one keep-alive interval (a real failure). Blocks
  // that long at most. Never throws.
  virtual std::chrono::milliseconds grace_for_membership_change() {
    return std::chrono::milliseconds(0);
  }

  // After this node's exit barrier timed out: whether it must stay, because
  // it serves a store that other nodes of the round use (the agents' store it
  // hosts, or etcd's workers' store of group rank 0) and one of them still
  // shows a sign of life (a heartbeat or keep-alive within the time that
  // declares a node dead, on this node's clock). Its leaving would take the
  // store from agents and workers that are still running. Called again and
  // again while the node stays; the first call counts everyone as alive.
  // False for a node that serves nobody. One call to this node's own store at
  // most; never throws (a store that fails: false).
  virtual bool needed_by_others() { return false; }

 protected:
  explicit Round(RendezvousInfo info) : info_(std::move(info)) {}

 private:
  RendezvousInfo info_;
};

// Tells, whenever called, what this node sees now of the keep-alives of the
// node it judges: nullopt while it judges none (between rounds, a single node).
// Never blocks, never throws; may be called from any thread.
using KeepAliveProbe = std::function<std::optional<KeepAliveView>()>;

class RendezvousHandler {
 public:
  virtual ~RendezvousHandler() = default;

  // Joins the next round and blocks until every node of it has joined. The
  // first call of a multi-node job claims or joins the job instance (see above)
  // and starts the heartbeat thread. The round must not outlive the handler.
  // Throws TimeoutError naming the missing nodes after join_timeout,
  // InvalidArgument when this node does not fit (node rank out of range, two
  // nodes with the same rank, round already full) or when a live job already
  // uses the run id, and the store's errors.
  virtual std::unique_ptr<Round> join() = 0;

  // This node is done with the job (after its last round, whatever the
  // outcome). Stops the heartbeat; the last agent of the last round to call it
  // deletes the job's remaining keys. Waits at most `deadline` for the store
  // (a frozen store must not hold up an exit); what has not finished by then
  // is abandoned (ddp::BackgroundCall) with its own store handle. Never
  // throws. Must not be called while join() runs on another thread;
  // after it, join() must not be called again. A no-op for a
  // single-node job; when no round formed it only stops this node's
  // heartbeat or keep-alives (and takes its keep-alive key away).
  virtual void shutdown(std::chrono::milliseconds deadline) { (void)deadline; }

  // Nodes that wait to join the next round (none for a fixed membership).
  virtual int num_nodes_waiting() { return 0; }

  // What join() waits for, for the user: `note` gets one line each time a
  // join starts waiting for something new (more nodes until the last call
  // ends, at least min_nodes until the join timeout, a place as a spare),
  // once per round and kind of wait, never in a loop. Called on the thread
  // that runs join(). Set before the first join(); a handler whose joins
  // never wait long ignores it.
  virtual void on_wait(std::function<void(const std::string&)> note) { (void)note; }

  // For whoever shows liveness (the agent's live view): `observer` is called
  // once, at once, on the calling thread, with the probe of the keep-alives
  // this node judges, valid as long as the handler. A handler of fixed
  // membership never calls it. Register before the first join().
  virtual void observe_keep_alives(const std::function<void(KeepAliveProbe)>& observer) {
    (void)observer;
  }

  // The job's counts of restarts and membership changes (job_counts.h) as the
  // store holds them, read when a round formed; nullopt for a handler that
  // keeps none (a single node: the agent counts its own). Call it between
  // join() and the round's end, on the agent's thread. Throws the store's errors.
  virtual std::optional<JobCounts> job_counts() { return std::nullopt; }

  // Counts, once for the job, the end of round `round` as `how`: every agent
  // of the round may call it, before it joins the next one. Returns the counts
  // after it (the same on every agent of the round); a handler that keeps
  // none returns counted(mine, round, how), `mine` being the agent's own.
  // Throws the store's errors.
  virtual JobCounts count_round_end(const JobCounts& mine, int round, const RoundEndCount& how) {
    return counted(mine, round, how);
  }

  // The store the agents meet in (used by the agent's thread).
  virtual std::shared_ptr<Store> store() = 0;

  // A second handle on the same store for a thread that blocks in wait() (a
  // TcpStore serializes calls on its one connection, so a blocked wait there
  // would stall the agent). May return store() for in-process stores.
  virtual std::shared_ptr<Store> open_store() = 0;

  // Where the agents' store is, for messages ("host:port", or etcd's endpoint list).
  virtual std::string store_name() const = 0;
  // The token workers use on their store (DDP_STORE_TOKEN); empty: none.
  virtual std::string store_token() const { return ""; }

  // "static", "c10d" or "etcd".
  virtual std::string backend() const = 0;
  virtual const RendezvousParams& params() const = 0;
};

// The static handler: node_rank is given, the round is complete when every
// rank in [0, max_nodes) has joined (min_nodes must equal max_nodes). Takes a
// store that already exists (the caller hosts or connects to it).
// Throws InvalidArgument for bad params or neither a store nor an opener.
// A single-node job (max_nodes == 1) never touches the store.
std::unique_ptr<RendezvousHandler> make_static_rendezvous(const RendezvousParams& params,
                                                          RendezvousStore store);

// The c10d handler: dynamic membership (rendezvous/src/dynamic_rendezvous.h has
// the protocol). A round closes when max_nodes have joined, or min_nodes and
// either every survivor of the previous round or last_call_timeout; nodes send
// keep-alives, a silent one is declared dead by its neighbour and the round
// ends; a node that arrives while a round below max_nodes runs makes it
// re-form at once, one that arrives at max_nodes waits as a spare.
std::unique_ptr<RendezvousHandler> make_c10d_rendezvous(const RendezvousParams& params,
                                                        RendezvousStore store);

// The etcd handler: the c10d protocol on an etcd cluster (store's client must
// have leases and watches: store_capabilities.h); liveness by leases and
// DELETE events, workers' store served by group rank 0's agent
// (RendezvousStore::external). Throws InvalidArgument for a store without them.
std::unique_ptr<RendezvousHandler> make_etcd_rendezvous(const RendezvousParams& params,
                                                        RendezvousStore store);

// A free TCP port on this host (binds port 0 on `host`, reads it, closes).
// Throws NetworkError when no socket can be bound.
std::uint16_t find_free_port(const std::string& host = "0.0.0.0");

}  // namespace ddp
