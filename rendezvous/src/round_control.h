// The store side of a running round, shared by the handlers: the end key's
// watcher and writer, each on a thread of its own so that the agent never
// waits for a store that may be frozen or cut off.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "ddp/rendezvous/rendezvous.h"
#include "ddp/rendezvous/round.h"
#include "ddp/store/store.h"

namespace ddp::rendezvous_detail {

// Waits for `key` on `store` (a handle of its own: it blocks there) and calls
// `wake` once the key appeared (the round's end) or the store failed
// (kStoreLost, naming `store_name`). `wake` runs on the watch's thread.
std::unique_ptr<RoundWatch> watch_end_key(std::shared_ptr<Store> store, std::string key,
                                          std::function<void()> wake, std::string store_name);

// Sets `key` to `value` unless it is set already (compare_set from ""), on a
// thread of its own; returns at once.
std::unique_ptr<PendingEnd> set_end_key(std::shared_ptr<Store> store, std::string key,
                                        std::string value);

// Counts this node at round `info`'s exit barrier ("<round prefix>/exit_barrier");
// the last node to arrive sets the round's end to "done", waiting for the store
// until `deadline`. Throws the store's errors, and NetworkError naming `origin`
// when the end could not be set in time.
void arrive_at_exit_barrier(const std::shared_ptr<Store>& store, const RendezvousInfo& info,
                            Clock::time_point deadline, const char* origin);

// A store handle of a background thread's own, opened on that thread at its
// first use (opening may block: a store host that is gone). A TcpStore
// serializes calls on its one connection, so a thread that must not wait
// behind the agent's blocking calls needs its own. Used by one thread only.
class OwnStoreHandle {
 public:
  // `opener` null: `shared` is used as it is.
  OwnStoreHandle(std::shared_ptr<Store> shared, StoreOpener opener)
      : store_(opener ? nullptr : std::move(shared)), opener_(std::move(opener)) {}
  // Opens on first use; throws what the opener throws.
  Store& get() {
    if (!store_) store_ = opener_();
    return *store_;
  }

 private:
  std::shared_ptr<Store> store_;
  StoreOpener opener_;
};

// The round both handlers' join() returns: its end lives at
// "<round prefix>/end" in the agents' store. A `solo` round (a single node)
// has nobody else to end it and touches no store. `grace` answers
// grace_for_membership_change (null: zero, a fixed membership), `needed` needed_by_others (null: false, a
// node that serves nobody; what it throws counts as false). Holds a
// reference to `handler`, which must outlive it.
class StoreRound final : public Round {
 public:
  StoreRound(RendezvousInfo info, RendezvousHandler& handler, bool solo, const char* origin,
             std::function<Duration()> grace = nullptr, std::function<bool()> needed = nullptr);
  std::unique_ptr<RoundWatch> watch(std::function<void()> wake) override;
  std::unique_ptr<PendingEnd> end(const RoundEnd& end) override;
  void arrive_at_exit_barrier(Clock::time_point deadline) override;
  std::chrono::milliseconds grace_for_membership_change() override;
  bool needed_by_others() override;

 private:
  RendezvousHandler& handler_;
  bool solo_;
  const char* origin_;
  std::function<Duration()> grace_;
  std::function<bool()> needed_;
};

// A watch that never ends (a round nobody else can end: a single node).
std::unique_ptr<RoundWatch> inert_watch();
// An end with nobody to tell: already done.
std::unique_ptr<PendingEnd> nothing_to_tell();

}  // namespace ddp::rendezvous_detail
