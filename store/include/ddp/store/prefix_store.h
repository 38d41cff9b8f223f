// A Store decorator that puts "<prefix>/" in front of every key (Gloo's
// PrefixStore). Used for one namespace per rendezvous round and per process
// group, so a worker of an old round can never touch the keys of a new one.
// The base store's capabilities (leases(), watches(), tickets(), prefixes())
// are offered here too, prefixed the same way: wrapping an etcd store in a
// prefix keeps its leases and watches.
#pragma once

#include <memory>

#include "ddp/store/forwarding_store.h"

namespace ddp {

class PrefixStore final : public ForwardingStore {
 public:
  // Shares ownership of `base`; its timeout is the initial timeout here.
  // Throws InvalidArgument for a null base.
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  ~PrefixStore() override;

  // The base's capabilities with this prefix (null where the base has none).
  StoreLeases* leases() override;
  StoreWatches* watches() override;
  StoreTickets* tickets() override;
  StorePrefixes* prefixes() override;

  const std::string& prefix() const { return prefix_; }

 private:
  // "<prefix>/<key>": the base's name for every key of this store.
  std::string base_key(const std::string& key) const override { return prefix_ + "/" + key; }

  class Leases;
  class Watches;
  class Tickets;
  class Prefixes;

  std::string prefix_;
  // Created with the store when the base has the capability.
  std::unique_ptr<Leases> leases_;
  std::unique_ptr<Watches> watches_;
  std::unique_ptr<Tickets> tickets_;
  std::unique_ptr<Prefixes> prefixes_;
};

}  // namespace ddp
