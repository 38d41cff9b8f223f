#include "ddp/store/prefix_store.h"

#include <algorithm>

#include "ddp/common/error.h"
#include "ddp/store/store_capabilities.h"

namespace ddp {

// Each capability forwards to the base's with "<prefix>/" in front of its keys.
class PrefixStore::Leases final : public StoreLeases {
 public:
  Leases(const PrefixStore& store, StoreLeases& base) : store_(store), base_(base) {}
  LeaseId grant_lease(std::chrono::seconds ttl) override { return base_.grant_lease(ttl); }
  bool refresh_lease(LeaseId lease) override { return base_.refresh_lease(lease); }
  std::int64_t lease_time_left(LeaseId lease) override { return base_.lease_time_left(lease); }
  void revoke_lease(LeaseId lease) override { base_.revoke_lease(lease); }
  void set_with_lease(const std::string& key, const std::string& value, LeaseId lease) override {
    base_.set_with_lease(store_.base_key(key), value, lease);
  }

 private:
  const PrefixStore& store_;
  StoreLeases& base_;
};

class PrefixStore::Watches final : public StoreWatches {
 public:
  Watches(const PrefixStore& store, StoreWatches& base) : store_(store), base_(base) {}
  std::int64_t revision() override { return base_.revision(); }
  std::unique_ptr<StoreWatch> watch_prefix(
      const std::string& key_prefix, std::int64_t from_revision,
      std::function<void(const StoreEvent&)> on_event,
      std::function<void(const std::string& reason)> on_error) override {
    // Every key the base pushes starts with the prefix: the callback gets it
    // relative to this store, as the caller named it.
    const std::size_t strip = store_.prefix_.size() + 1;
    return base_.watch_prefix(
        store_.base_key(key_prefix), from_revision,
        [strip, on_event = std::move(on_event)](const StoreEvent& event) {
          StoreEvent relative = event;
          relative.key = event.key.substr(std::min(strip, event.key.size()));
          on_event(relative);
        },
        std::move(on_error));
  }

 private:
  const PrefixStore& store_;
  StoreWatches& base_;
};

class PrefixStore::Tickets final : public StoreTickets {
 public:
  Tickets(const PrefixStore& store, StoreTickets& base) : store_(store), base_(base) {}
  std::int64_t take_ticket(const std::string& key) override {
    return base_.take_ticket(store_.base_key(key));
  }
  std::int64_t tickets_taken(const std::string& key) override {
    return base_.tickets_taken(store_.base_key(key));
  }
  void delete_tickets(const std::string& key) override {
    base_.delete_tickets(store_.base_key(key));
  }

 private:
  const PrefixStore& store_;
  StoreTickets& base_;
};

class PrefixStore::Prefixes final : public StorePrefixes {
 public:
  Prefixes(const PrefixStore& store, StorePrefixes& base) : store_(store), base_(base) {}
  bool take_over(const std::string& key, const std::string& expected, const std::string& desired,
                 const std::string& prefix) override {
    return base_.take_over(store_.base_key(key), expected, desired, store_.base_key(prefix));
  }

 private:
  const PrefixStore& store_;
  StorePrefixes& base_;
};

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : ForwardingStore(std::move(base), "PrefixStore"), prefix_(std::move(prefix)) {
  Store& base_store = *this->base();
  if (auto* leases = base_store.leases()) leases_ = std::make_unique<Leases>(*this, *leases);
  if (auto* watches = base_store.watches()) watches_ = std::make_unique<Watches>(*this, *watches);
  if (auto* tickets = base_store.tickets()) tickets_ = std::make_unique<Tickets>(*this, *tickets);
  if (auto* prefixes = base_store.prefixes()) {
    prefixes_ = std::make_unique<Prefixes>(*this, *prefixes);
  }
}

PrefixStore::~PrefixStore() = default;

StoreLeases* PrefixStore::leases() { return leases_.get(); }
StoreWatches* PrefixStore::watches() { return watches_.get(); }
StoreTickets* PrefixStore::tickets() { return tickets_.get(); }
StorePrefixes* PrefixStore::prefixes() { return prefixes_.get(); }

}  // namespace ddp
