// FakeLeaseStore: an in-memory store with leases, watches, tickets and
// prefix operations (store_capabilities.h; the etcd backend's model) with a
// fake clock, for tests of the rendezvous' liveness without etcd: a
// MemoryStore with leases that expire when expire() runs past their deadline
// (by FakeTime), tickets, take_over, and watches that push every delete
// (direct, revoked or expired) synchronously, before the call returns. Only
// deletes are pushed: the rendezvous watches for deaths.
//
// Ownership: the store holds a reference to the FakeTime, which must outlive
// it; a watch handle must not outlive the store. Blocking: get/wait/multi_get
// block as MemoryStore's (real time); nothing else blocks. Thread-safety:
// every call may come from any thread (the rendezvous deletes old rounds on
// threads of its own); watch callbacks run under the store's lock and may call
// back into it. Errors: as MemoryStore; set_with_lease on an unknown lease and
// take_over of a key outside its prefix throw InvalidArgument.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/common/time.h"
#include "ddp/store/memory_store.h"
#include "ddp/store/store_capabilities.h"

namespace ddp::test {

// Leases expire when expire() runs past their deadline; every delete (direct,
// revoked or expired) is pushed to the watches whose prefix it matches, before
// the call returns.
class FakeLeaseStore final : public Store,
                             public StoreLeases,
                             public StoreWatches,
                             public StoreTickets,
                             public StorePrefixes {
 public:
  explicit FakeLeaseStore(const FakeTime& time) : time_(time) {}

  StoreLeases* leases() override { return this; }
  StoreWatches* watches() override { return this; }
  StoreTickets* tickets() override { return this; }
  StorePrefixes* prefixes() override { return this; }

  void set(const std::string& key, const std::string& value) override {
    note(key);
    data_.set(key, value);
  }
  using Store::get;
  std::string get(const std::string& key, Duration timeout) override {
    return data_.get(key, timeout);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    note(key);
    return data_.add(key, delta);
  }
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    note(key);
    return data_.compare_set(key, expected, desired);
  }
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Duration timeout) override {
    data_.wait(keys, timeout);
  }
  bool check(const std::vector<std::string>& keys) override { return data_.check(keys); }
  bool delete_key(const std::string& key) override {
    std::lock_guard lock(mutex_);
    written_.erase(key);
    const bool existed = data_.delete_key(key);
    if (existed) push_delete(key);
    return existed;
  }
  std::int64_t num_keys() override { return data_.num_keys(); }
  using Store::multi_get;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     Duration timeout) override {
    return data_.multi_get(keys, timeout);
  }
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override {
    for (const auto& key : keys) note(key);
    data_.multi_set(keys, values);
  }
  void append(const std::string& key, const std::string& value) override {
    note(key);
    data_.append(key, value);
  }

  LeaseId grant_lease(std::chrono::seconds ttl) override {
    std::lock_guard lock(mutex_);
    const LeaseId id = next_lease_++;
    leases_[id] = Lease{ttl, time_.now() + ttl, {}};
    return id;
  }
  bool refresh_lease(LeaseId id) override {
    std::lock_guard lock(mutex_);
    auto it = leases_.find(id);
    if (it == leases_.end()) return false;
    it->second.expires = time_.now() + it->second.ttl;
    return true;
  }
  std::int64_t lease_time_left(LeaseId id) override {
    std::lock_guard lock(mutex_);
    auto it = leases_.find(id);
    if (it == leases_.end()) return -1;
    return std::chrono::ceil<std::chrono::seconds>(it->second.expires - time_.now()).count();
  }
  void revoke_lease(LeaseId id) override {
    std::lock_guard lock(mutex_);
    auto it = leases_.find(id);
    if (it == leases_.end()) return;
    const auto keys = it->second.keys;
    leases_.erase(it);
    for (const auto& key : keys) delete_key(key);
  }
  void set_with_lease(const std::string& key, const std::string& value, LeaseId id) override {
    std::lock_guard lock(mutex_);
    auto it = leases_.find(id);
    if (it == leases_.end())
      throw InvalidArgument("FakeLeaseStore", "no lease " + std::to_string(id));
    it->second.keys.insert(key);
    written_.insert(key);
    data_.set(key, value);
  }
  std::int64_t take_ticket(const std::string& key) override {
    std::lock_guard lock(mutex_);
    return tickets_[key]++;
  }
  std::int64_t tickets_taken(const std::string& key) override {
    std::lock_guard lock(mutex_);
    auto it = tickets_.find(key);
    return it == tickets_.end() ? 0 : it->second;
  }
  void delete_tickets(const std::string& key) override {
    std::lock_guard lock(mutex_);
    tickets_.erase(key);
  }
  bool take_over(const std::string& key, const std::string& expected, const std::string& desired,
                 const std::string& prefix) override {
    std::lock_guard lock(mutex_);
    if (key.rfind(prefix, 0) != 0)
      throw InvalidArgument("FakeLeaseStore", "key not below the prefix");
    const bool exists = data_.check({key});
    if (expected.empty() ? exists
                         : !exists || data_.get(key, std::chrono::milliseconds(0)) != expected)
      return false;
    for (const auto& other : std::set<std::string>(written_)) {
      if (other != key && other.rfind(prefix, 0) == 0) delete_key(other);
    }
    for (auto it = tickets_.begin(); it != tickets_.end();) {
      it = it->first.rfind(prefix, 0) == 0 ? tickets_.erase(it) : std::next(it);
    }
    note(key);
    data_.set(key, desired);
    return true;
  }
  // Keys written (set, added, ...) and not deleted since.
  std::set<std::string> keys() const {
    std::lock_guard lock(mutex_);
    return written_;
  }
  std::int64_t revision() override {
    std::lock_guard lock(mutex_);
    return revision_;
  }
  std::unique_ptr<StoreWatch> watch_prefix(const std::string& prefix, std::int64_t,
                                           std::function<void(const StoreEvent&)> on_event,
                                           std::function<void(const std::string&)>) override {
    std::lock_guard lock(mutex_);
    const int id = next_watch_++;
    watches_[id] = Watch{prefix, std::move(on_event)};
    return std::make_unique<WatchHandle>(*this, id);
  }

  // Deletes every lease past its deadline, with its keys.
  void expire() {
    std::lock_guard lock(mutex_);
    std::vector<LeaseId> due;
    for (const auto& [id, lease] : leases_) {
      if (lease.expires <= time_.now()) due.push_back(id);
    }
    for (auto id : due) revoke_lease(id);
  }
  // Watches running now.
  std::size_t watch_count() const {
    std::lock_guard lock(mutex_);
    return watches_.size();
  }

 private:
  struct Lease {
    std::chrono::seconds ttl;
    Clock::time_point expires;
    std::set<std::string> keys;
  };
  struct Watch {
    std::string prefix;
    std::function<void(const StoreEvent&)> on_event;
  };
  struct WatchHandle : StoreWatch {
    WatchHandle(FakeLeaseStore& store, int id) : store(store), id(id) {}
    ~WatchHandle() override {
      std::lock_guard lock(store.mutex_);
      store.watches_.erase(id);
    }
    FakeLeaseStore& store;
    int id;
  };

  void note(const std::string& key) {
    std::lock_guard lock(mutex_);
    written_.insert(key);
  }

  void push_delete(const std::string& key) {
    StoreEvent event;
    event.kind = StoreEvent::Kind::kDelete;
    event.key = key;
    event.revision = ++revision_;
    auto watches = watches_;  // a callback may add or remove watches
    for (const auto& [id, watch] : watches) {
      if (key.rfind(watch.prefix, 0) == 0) watch.on_event(event);
    }
  }

  const FakeTime& time_;
  // The rendezvous deletes old rounds' keys on a thread of its own; callbacks
  // run under the lock and may call back into the store (hence recursive).
  mutable std::recursive_mutex mutex_;
  MemoryStore data_;
  std::map<LeaseId, Lease> leases_;
  LeaseId next_lease_ = 1;
  std::map<int, Watch> watches_;
  int next_watch_ = 1;
  std::map<std::string, std::int64_t> tickets_;
  std::set<std::string> written_;
  std::int64_t revision_ = 1;
};

}  // namespace ddp::test
