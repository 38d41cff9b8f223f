#include "liveness.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "ddp/common/error.h"
#include "ddp/store/store_capabilities.h"
#include "dynamic_keys.h"
#include "records.h"

namespace ddp::rendezvous_detail {
namespace {

std::string random_member() {
  std::random_device device;
  char text[17];
  std::snprintf(text, sizeof(text), "%08x%08x", device(), device());
  return text;
}

// ---- keep-alive counters (any store) -----------------------------------------------------------

class KeepAliveCounters final : public Liveness {
 public:
  explicit KeepAliveCounters(LivenessSettings settings) : Liveness(std::move(settings)) {}

  bool uses_leases() const override { return false; }

  void enter(Store& store, bool declared_lost) override {
    if (!declared_lost) return;
    std::string old;
    {
      std::lock_guard lock(mutex_);
      old = member_;
      member_ = random_member();
    }
    store.delete_key(alive_key(old));
  }

  void watch(const std::shared_ptr<Store>&, const std::string& round_prefix, int rank,
             const std::string& member) override {
    std::lock_guard lock(mutex_);
    watched_.emplace(
        Watched{round_prefix, rank, member,
                HeartbeatTracker(settings_.interval, settings_.max_attempt, time().now())});
  }

  void unwatch() override {
    std::lock_guard lock(mutex_);
    watched_.reset();
  }

  std::optional<KeepAliveView> watched(Clock::time_point now) const override {
    std::lock_guard lock(mutex_);
    if (!watched_) return std::nullopt;
    KeepAliveView view;
    view.group_rank = watched_->group_rank;
    view.age = std::chrono::duration_cast<std::chrono::milliseconds>(std::max(
        Duration(0), std::chrono::duration_cast<Duration>(now - watched_->tracker.last_change())));
    view.lost_after = std::chrono::duration_cast<std::chrono::milliseconds>(verdict());
    return view;
  }

  std::function<void(Store&)> leave() override {
    return [key = alive_key(member())](Store& store) { store.delete_key(key); };
  }

  void tick(Store& store) override {
    const auto now = time().now();
    std::string member, watched_member, watched_round;
    int watched_rank = -1;
    bool write = false;
    std::int64_t beat = 0;
    {
      std::lock_guard lock(mutex_);
      member = member_;
      if (now >= next_write_) {
        write = true;
        beat = ++beats_;
        next_write_ = now + settings_.interval;
      }
      if (watched_) {
        watched_member = watched_->member;
        watched_round = watched_->round_prefix;
        watched_rank = watched_->group_rank;
      }
    }
    if (write) store.set(alive_key(member), std::to_string(beat));
    if (watched_member.empty()) return;
    const auto value = try_get(store, alive_key(watched_member));
    {
      std::lock_guard lock(mutex_);
      if (!watched_ || watched_->member != watched_member) return;
      watched_->tracker.observe(value, now);
      if (!watched_->tracker.dead(now)) return;
      watched_.reset();
    }
    declare_lost(store, watched_round, watched_rank, watched_member);
  }

  bool any_alive(Store& store, const std::vector<std::string>& members) override {
    // Alive when a counter moves within the time that declares a node dead.
    const auto first = read(store, members);
    const auto until = time().now() + verdict();
    while (time().now() < until) {
      time().sleep_for(tick_period(settings_.interval));
      const auto now = read(store, members);
      for (std::size_t i = 0; i < members.size(); ++i) {
        if (now[i] && now[i] != first[i]) return true;
      }
    }
    return false;
  }

  bool any_alive_now(Store& store, const std::vector<std::string>& members, Clock::time_point now,
                     std::map<std::string, HeartbeatTracker>& seen) override {
    bool any = false;
    for (const auto& m : members) {
      auto [it, first_look] = seen.try_emplace(m, settings_.interval, settings_.max_attempt, now);
      it->second.observe(try_get(store, alive_key(m)), now);
      any = any || first_look || !it->second.dead(now);
    }
    return any;
  }

  Duration grace_for_membership_change(Store& store,
                                       const std::vector<std::string>& members) override {
    // Every member's counter must move within about one interval.
    std::vector<std::string> keys;
    for (const auto& m : members) keys.push_back(alive_key(m));
    const auto first = store.multi_get(keys, Duration(0));
    std::vector<bool> moved(keys.size(), false);
    const auto until = time().now() + settings_.interval + settings_.interval / 2;
    while (time().now() < until) {
      time().sleep_for(tick_period(settings_.interval));
      const auto now = store.multi_get(keys, Duration(0));
      bool all = true;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (now[i] != first[i]) moved[i] = true;
        all = all && moved[i];
      }
      if (all) return Duration(0);
    }
    return settings_.interval * (settings_.max_attempt + 1);
  }

 private:
  struct Watched {
    std::string round_prefix;
    int group_rank = -1;
    std::string member;
    HeartbeatTracker tracker;
  };

  std::vector<std::optional<std::string>> read(Store& store,
                                               const std::vector<std::string>& members) {
    std::vector<std::optional<std::string>> values;
    for (const auto& m : members) values.push_back(try_get(store, alive_key(m)));
    return values;
  }

  // Guarded by mutex_.
  std::int64_t beats_ = 0;
  Clock::time_point next_write_{};
  std::optional<Watched> watched_;
};

// ---- leases (a store with leases and watches: etcd) -------------------------------------------

class KeepAliveLeases final : public Liveness {
 public:
  explicit KeepAliveLeases(LivenessSettings settings) : Liveness(std::move(settings)) {}
  ~KeepAliveLeases() override { unwatch(); }

  bool uses_leases() const override { return true; }

  void enter(Store& store, bool declared_lost) override {
    StoreLeases& leases = capability(store.leases());
    std::string member;
    StoreLeases::LeaseId old = 0;
    {
      std::lock_guard lock(mutex_);
      if (declared_lost) member_ = random_member();
      member = member_;
      if (lease_ != 0 && leased_member_ == member) return;
      old = lease_;
    }
    if (old != 0) leases.revoke_lease(old);  // the old member id's key goes with it
    const auto lease = leases.grant_lease(std::chrono::seconds(ttl_seconds()));
    leases.set_with_lease(alive_key(member), std::to_string(lease), lease);
    std::lock_guard lock(mutex_);
    lease_ = lease;
    leased_member_ = member;
    next_refresh_ = time().now() + settings_.interval;
  }

  void watch(const std::shared_ptr<Store>& store, const std::string& round_prefix, int rank,
             const std::string& member) override {
    StoreWatches& watches = capability(store->watches());
    const std::string key = alive_key(member);
    auto declare = [store, round_prefix, rank, member] {
      try {
        declare_lost(*store, round_prefix, rank, member);
      } catch (const std::exception&) {
        // The store is gone: the round's watch reports that.
      }
    };
    // From a revision read before the check below: a delete after it is
    // pushed, one before it is seen by the check.
    const auto from = watches.revision() + 1;
    auto watch = watches.watch_prefix(
        key, from,
        [key, declare](const StoreEvent& event) {
          if (event.kind == StoreEvent::Kind::kDelete && event.key == key) declare();
        },
        [](const std::string&) {
          // The store cannot be watched any more: the round's watch reports a lost store.
        });
    {
      std::lock_guard lock(mutex_);
      death_watch_ = std::move(watch);
      watched_rank_ = rank;
    }
    if (!store->check({key})) declare();
  }

  void unwatch() override {
    std::unique_ptr<StoreWatch> watch;
    {
      std::lock_guard lock(mutex_);
      watch = std::move(death_watch_);
      watched_rank_ = -1;
    }
    watch.reset();  // outside the lock: it waits for its callbacks
  }

  std::optional<KeepAliveView> watched(Clock::time_point) const override {
    std::lock_guard lock(mutex_);
    if (watched_rank_ < 0) return std::nullopt;
    KeepAliveView view;  // no age: the store expires the lease
    view.group_rank = watched_rank_;
    view.lost_after = std::chrono::duration_cast<std::chrono::milliseconds>(verdict());
    return view;
  }

  std::function<void(Store&)> leave() override {
    StoreLeases::LeaseId lease = 0;
    {
      std::lock_guard lock(mutex_);
      lease = lease_;
    }
    unwatch();
    return [lease, key = alive_key(member())](Store& store) {
      if (lease != 0 && store.leases()) {
        store.leases()->revoke_lease(lease);  // its key goes with it
      } else {
        store.delete_key(key);
      }
    };
  }

  void tick(Store& store) override {
    StoreLeases::LeaseId lease = 0;
    {
      std::lock_guard lock(mutex_);
      const auto now = time().now();
      if (lease_ == 0 || now < next_refresh_) return;
      lease = lease_;
      next_refresh_ = now + settings_.interval;
    }
    if (capability(store.leases()).refresh_lease(lease)) return;
    // Expired (this node could not refresh it in time): its key is gone and
    // its round ends; the next join puts a new lease under it.
    std::lock_guard lock(mutex_);
    if (lease_ == lease) lease_ = 0;
  }

  bool any_alive(Store& store, const std::vector<std::string>& members) override {
    return any_key(store, members);  // a leased key exists exactly as long as it is refreshed
  }

  bool any_alive_now(Store& store, const std::vector<std::string>& members, Clock::time_point,
                     std::map<std::string, HeartbeatTracker>&) override {
    return any_key(store, members);
  }

  Duration grace_for_membership_change(Store& store,
                                       const std::vector<std::string>& members) override {
    // A member is alive when its lease's time left rises (it was refreshed);
    // etcd counts it in whole seconds, hence the extra second of patience.
    StoreLeases& leases = capability(store.leases());
    const Duration verdict =
        std::chrono::seconds(ttl_seconds()) + settings_.interval + std::chrono::seconds(1);
    std::vector<std::string> keys;
    for (const auto& m : members) keys.push_back(alive_key(m));
    std::vector<StoreLeases::LeaseId> ids;
    const auto values = store.multi_get(keys, Duration(0));
    for (std::size_t i = 0; i < values.size(); ++i)
      ids.push_back(parse_lease_id(values[i], keys[i]));
    std::vector<std::int64_t> lowest;
    for (auto id : ids) {
      lowest.push_back(leases.lease_time_left(id));
      if (lowest.back() < 0) return verdict;  // already gone: the watch reports it
    }
    std::vector<bool> refreshed(ids.size(), false);
    const auto until = time().now() + settings_.interval * 3 / 2 + std::chrono::seconds(1);
    while (time().now() < until) {
      time().sleep_for(tick_period(settings_.interval));
      bool all = true;
      for (std::size_t i = 0; i < ids.size(); ++i) {
        if (refreshed[i]) continue;
        const auto left = leases.lease_time_left(ids[i]);
        if (left < 0) return verdict;
        refreshed[i] = left > lowest[i];
        lowest[i] = std::min(lowest[i], left);
        all = all && refreshed[i];
      }
      if (all) return Duration(0);
    }
    return verdict;
  }

 private:
  template <typename Capability>
  static Capability& capability(Capability* offered) {
    if (!offered)
      throw InvalidArgument("rendezvous liveness", "the store has no leases or watches");
    return *offered;
  }
  // The lease lasts as long as the keep-alives a node may miss, in whole
  // seconds (what etcd counts in); etcd raises it to its own minimum.
  std::int64_t ttl_seconds() const {
    return std::max<std::int64_t>(1, (verdict().count() + 999) / 1000);
  }
  bool any_key(Store& store, const std::vector<std::string>& members) {
    return std::any_of(members.begin(), members.end(),
                       [&](const auto& m) { return try_get(store, alive_key(m)).has_value(); });
  }

  // Guarded by mutex_: this node's lease (0: none yet, or it expired) and the
  // member whose key it holds; the watch on the watched member's key and
  // the watched node's group rank (-1: none).
  StoreLeases::LeaseId lease_ = 0;
  std::string leased_member_;
  Clock::time_point next_refresh_{};
  std::unique_ptr<StoreWatch> death_watch_;
  int watched_rank_ = -1;
};

}  // namespace

Duration tick_period(Duration keep_alive_interval) {
  return std::clamp<Duration>(keep_alive_interval / 4, Duration(1), std::chrono::milliseconds(200));
}

Liveness::Liveness(LivenessSettings settings)
    : settings_(std::move(settings)), member_(random_member()) {}

std::shared_ptr<Liveness> Liveness::create(Store* store, LivenessSettings settings) {
  if (store && store->leases() && store->watches())
    return std::make_shared<KeepAliveLeases>(std::move(settings));
  return std::make_shared<KeepAliveCounters>(std::move(settings));
}

std::string Liveness::member() const {
  std::lock_guard lock(mutex_);
  return member_;
}

void Liveness::declare_lost(Store& store, const std::string& round_prefix, int rank,
                            const std::string& member) {
  // A node whose workers all succeeded arrives at the exit barrier and may
  // leave after --exit_barrier_timeout; its keep-alives then stop. Once any
  // node arrived there the round is ending: nobody is declared lost, so that
  // the nodes still running finish (a departure never stops them, as under
  // torchrun).
  if (store.check({round_prefix + "/exit_barrier"})) return;
  RoundEnd lost;
  lost.kind = RoundEnd::Kind::kNodeLost;
  lost.node = rank;
  lost.member = member;
  end_round_once(store, round_prefix, lost);
}

}  // namespace ddp::rendezvous_detail
