// How the nodes of a dynamic rendezvous show that they are alive and learn of
// a death: one interface, two strategies, chosen once by what the store offers.
//
//   KeepAliveCounters (any Store: the built-in one). Every node writes its own
//   key P/alive/<member> (an increasing counter) every keep-alive interval; in
//   a round, group rank g reads rank g+1's key every tick and, once it has not
//   moved for interval x max_attempt on g's own clock, ends the round with
//   "lost <g+1> <member>".
//   KeepAliveLeases (a store with leases and watches: etcd). P/alive/<member>
//   holds the id of the node's lease (TTL interval x max_attempt), refreshed
//   every interval; the store deletes the key when the lease expires, and
//   group rank g, watching rank g+1's key, ends the round on its DELETE event.
//
// Both judge others the same three ways: a blocking look over the time that
// declares a node dead (any_alive: is a job that holds a run id still there?),
// a non-blocking look that keeps its observations (any_alive_now: a spare
// behind a full round), and a short look for a round's every member
// (grace_for_membership_change).
//
// Ownership: the handler and its keep-alive worker share the object
// (shared_ptr); the Runtime must outlive it. Thread-safety: tick() runs on the
// keep-alive worker's thread with a store handle of its own; every other
// method on the handler's thread. What they share is behind a mutex.
// Errors: the store's; tick() lets them escape (the worker ignores them: a
// keep-alive that could not be written is a missed one).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/time.h"
#include "ddp/rendezvous/rendezvous.h"
#include "ddp/rendezvous/round.h"
#include "ddp/store/store.h"
#include "membership.h"

namespace ddp::rendezvous_detail {

struct LivenessSettings {
  // "rdzv/<run_id>/": keys are P + "alive/<member>".
  std::string prefix;
  Duration interval{5000};
  int max_attempt = 3;
  const Runtime* runtime = nullptr;
};

// How often the keep-alive worker ticks: a quarter interval, at most every
// 200 ms, so that a death is seen at most that long past its deadline.
Duration tick_period(Duration keep_alive_interval);

class Liveness {
 public:
  // Leases when `store` has leases and watches, counters otherwise (and for a
  // null store: one opened on first use is a built-in store's client).
  static std::shared_ptr<Liveness> create(Store* store, LivenessSettings settings);
  virtual ~Liveness() = default;

  // This node's member id (random; a new one after it was declared lost).
  std::string member() const;
  std::string alive_key(const std::string& member) const {
    return settings_.prefix + "alive/" + member;
  }
  // Whether this strategy's keys live on leases (what a store must offer for it).
  virtual bool uses_leases() const = 0;

  // ---- this node (the handler's thread)

  // At every join: after this node was declared lost in its last round, takes
  // a new member id (its old key is taken away); makes its key exist as the
  // strategy needs (a lease of its own).
  virtual void enter(Store& store, bool declared_lost) = 0;
  // The round at `round_prefix` formed: judges `member` (group rank `rank`),
  // ending the round with "lost" when it dies. `store` is the handler's.
  virtual void watch(const std::shared_ptr<Store>& store, const std::string& round_prefix, int rank,
                     const std::string& member) = 0;
  // This node left its round: nobody to judge.
  virtual void unwatch() = 0;
  // What this node sees of the node it judges (nullopt: none). Any thread.
  virtual std::optional<KeepAliveView> watched(Clock::time_point now) const = 0;
  // What takes this node's key away when it leaves the job, to run on the
  // shutdown's cleanup thread (it owns what it needs).
  virtual std::function<void(Store&)> leave() = 0;

  // ---- the keep-alive worker's thread

  // One tick on the worker's own store handle: writes or refreshes this
  // node's key when due, and judges the watched node.
  virtual void tick(Store& own) = 0;

  // ---- judging others (the handler's thread)

  // Whether any of `members` shows a sign of life; blocks at most the time
  // that declares a node dead.
  virtual bool any_alive(Store& store, const std::vector<std::string>& members) = 0;
  // One look that never waits: whether any of `members` may be alive at
  // `now`, given the earlier looks kept in `seen` (updated).
  virtual bool any_alive_now(Store& store, const std::vector<std::string>& members,
                             Clock::time_point now,
                             std::map<std::string, HeartbeatTracker>& seen) = 0;
  // Blocks about one interval: zero once every one of `members` showed a
  // sign of life, else how long their deaths take to be declared.
  virtual Duration grace_for_membership_change(Store& store,
                                               const std::vector<std::string>& members) = 0;

 protected:
  explicit Liveness(LivenessSettings settings);
  const Runtime& time() const { return *settings_.runtime; }
  // Every node's verdict time: interval x max_attempt.
  Duration verdict() const { return settings_.interval * settings_.max_attempt; }
  // Ends the round at `round_prefix` with "lost <rank> <member>" unless it
  // ended, or unless a node arrived at its exit barrier (the round is ending:
  // a node that finished and left is not lost).
  static void declare_lost(Store& store, const std::string& round_prefix, int rank,
                           const std::string& member);

  const LivenessSettings settings_;
  mutable std::mutex mutex_;
  std::string member_;  // guarded by mutex_
};

}  // namespace ddp::rendezvous_detail
