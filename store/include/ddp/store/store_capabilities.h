// What a Store may offer beyond key-value calls, each as an interface of its
// own (the way etcd's clientv3 separates KV, Lease and Watch). A caller asks
// the store for one (Store::leases(), watches(), tickets(), prefixes()) and
// gets null when the store does not have it; never a dynamic_cast.
//
// The etcd backend (EtcdStore) has all four; the built-in stores have none.
// The dynamic rendezvous uses them, when its store has them, for liveness:
// a node's keep-alive key lives on its lease, and survivors learn of a death
// from the key's DELETE event instead of polling counters.
//
// Ownership: an interface returned by a store is owned by that store and valid
// as long as it is. Thread-safety: as Store, every method may be called from
// several threads. Errors: as Store (NetworkError, AuthError, TimeoutError, ...).
// Keys are relative to the store that returned the interface: a PrefixStore's
// interfaces put its prefix in front of every key, and take it off the keys of
// the events they push.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ddp/store/store.h"

namespace ddp {

// Keys that live as long as their holder refreshes a lease.
class StoreLeases {
 public:
  using LeaseId = std::int64_t;
  virtual ~StoreLeases() = default;

  // Creates a lease that expires `ttl` after its last refresh (the store may
  // round it up to its minimum). Returns its id.
  virtual LeaseId grant_lease(std::chrono::seconds ttl) = 0;

  // Refreshes `lease` once. Returns false when it no longer exists (it
  // expired, or was revoked): its keys are gone.
  virtual bool refresh_lease(LeaseId lease) = 0;

  // Seconds left before `lease` expires (it rises back to its TTL at every
  // refresh), or -1 when it no longer exists. Any holder of the id may ask.
  virtual std::int64_t lease_time_left(LeaseId lease) = 0;

  // Deletes `lease` and every key attached to it. Unknown leases are ignored.
  virtual void revoke_lease(LeaseId lease) = 0;

  // Creates or replaces `key`, attached to `lease` (deleted with it).
  // Throws InvalidArgument (naming the lease) when the lease does not exist.
  virtual void set_with_lease(const std::string& key, const std::string& value, LeaseId lease) = 0;
};

// One change pushed by a watch. `key` is relative to the store (as passed to set).
struct StoreEvent {
  enum class Kind { kPut, kDelete } kind = Kind::kPut;
  std::string key;
  // The new value of a kPut (empty for kDelete).
  std::string value;
  // The store's revision of the change (increasing).
  std::int64_t revision = 0;
};

// A running watch; destroying it stops it (blocks until its callbacks returned,
// so a callback must not destroy its own watch).
class StoreWatch {
 public:
  virtual ~StoreWatch() = default;
};

// Changes pushed to the caller instead of polled.
class StoreWatches {
 public:
  virtual ~StoreWatches() = default;

  // The store's current revision: a watch from revision()+1 misses no change
  // made after this call.
  virtual std::int64_t revision() = 0;

  // Pushes every change of a key that starts with `key_prefix`, from revision
  // `from_revision` on (0: from now), to `on_event`, in revision order, on a
  // thread of the watch's own. A lost connection is re-established (on
  // another endpoint where there are several) and resumed after the last
  // revision delivered, so no event is lost or repeated. When the watch cannot
  // go on (the store unreachable for longer than the store's retry limit, or
  // the revisions it needs were compacted) `on_error` is called once with the
  // reason and no event follows. Never blocks.
  virtual std::unique_ptr<StoreWatch> watch_prefix(
      const std::string& key_prefix, std::int64_t from_revision,
      std::function<void(const StoreEvent&)> on_event,
      std::function<void(const std::string& reason)> on_error) = 0;
};

// Counters that many callers take from at once without conflicts.
class StoreTickets {
 public:
  virtual ~StoreTickets() = default;

  // Takes a ticket from the counter at `key`: returns how many tickets were
  // taken before this one (0, 1, 2, ...), once even when the call is retried
  // after a lost connection. Unlike Store::add(), concurrent callers never
  // conflict (on etcd: a key per ticket, numbered by creation), so a thousand
  // nodes arriving at once cost a thousand writes, not a thousand races. Keys
  // below "<key>/" hold the tickets; use only these three on them.
  virtual std::int64_t take_ticket(const std::string& key) = 0;
  // How many tickets were taken from `key` (0 when none).
  virtual std::int64_t tickets_taken(const std::string& key) = 0;
  // Deletes every ticket of `key` (the count starts again at 0).
  virtual void delete_tickets(const std::string& key) = 0;
};

// Atomic operations on every key below a prefix.
class StorePrefixes {
 public:
  virtual ~StorePrefixes() = default;

  // Atomically: when `key` holds `expected`, deletes every key that starts
  // with `prefix` (but `key`) and sets `key` to `desired`, returning true;
  // otherwise changes nothing and returns false. `key` must start with
  // `prefix` (InvalidArgument otherwise). What a job does with a dead job's
  // keys when it takes over its run id: nothing the new job writes after its
  // claim can be caught in the deletion.
  virtual bool take_over(const std::string& key, const std::string& expected,
                         const std::string& desired, const std::string& prefix) = 0;
};

}  // namespace ddp
