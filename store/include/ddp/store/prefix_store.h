// A Store decorator that puts "<prefix>/" in front of every key (Gloo's
// PrefixStore). Used for one namespace per rendezvous round and per process
// group, so a worker of an old round can never touch the keys of a new one.
// The base store's capabilities (leases(), watches(), tickets(), prefixes())
// are offered here too, prefixed the same way: wrapping an etcd store in a
// prefix keeps its leases and watches.
#pragma once

#include <memory>

#include "ddp/store/store.h"

namespace ddp {

class PrefixStore final : public Store {
 public:
  // Shares ownership of `base`; its timeout is the initial timeout here.
  // Throws InvalidArgument for a null base.
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  ~PrefixStore() override;

  void set(const std::string& key, const std::string& value) override;
  using Store::get;
  std::string get(const std::string& key, Duration timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  std::int64_t num_keys() override;
  using Store::multi_get;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     Duration timeout) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;
  void append(const std::string& key, const std::string& value) override;

  // The base's capabilities with this prefix (null where the base has none).
  StoreLeases* leases() override;
  StoreWatches* watches() override;
  StoreTickets* tickets() override;
  StorePrefixes* prefixes() override;

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string key(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> keys(const std::vector<std::string>& keys) const;

  class Leases;
  class Watches;
  class Tickets;
  class Prefixes;

  std::string prefix_;
  std::shared_ptr<Store> base_;
  // Created with the store when the base has the capability.
  std::unique_ptr<Leases> leases_;
  std::unique_ptr<Watches> watches_;
  std::unique_ptr<Tickets> tickets_;
  std::unique_ptr<Prefixes> prefixes_;
};

}  // namespace ddp
