// The key-value store that agents and workers meet in (c10d Store semantics).
//
// Keys and values are arbitrary byte strings. Every implementation is
// thread-safe: any method may be called from several threads at once.
// Blocking methods (get, wait, multi_get) wait at most the given timeout, or
// timeout() when none is given, and then throw TimeoutError naming the keys.
// Implementations that talk to a server throw NetworkError when it is gone,
// ShutdownError when it is shutting down, AuthError when it rejects the token.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

// Optional capabilities (store_capabilities.h).
class StoreLeases;
class StoreWatches;
class StoreTickets;
class StorePrefixes;

class Store {
 public:
  using Duration = std::chrono::milliseconds;
  static constexpr Duration kDefaultTimeout = std::chrono::minutes(5);

  virtual ~Store() = default;

  // Creates or replaces `key`.
  virtual void set(const std::string& key, const std::string& value) = 0;

  // The value of `key`, waiting until it exists.
  std::string get(const std::string& key) { return get(key, timeout()); }
  virtual std::string get(const std::string& key, Duration timeout) = 0;

  // Atomically adds `delta` to the integer stored at `key` (a missing key counts
  // as 0; the value is stored as decimal text) and returns the new value.
  // Throws InvalidArgument when the current value is not an integer.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;

  // c10d compare-and-set. Missing key: when `expected` is empty, sets `desired`
  // and returns it; otherwise returns `expected` and changes nothing. Present key:
  // when it equals `expected`, sets `desired`. Returns the value after the call.
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;

  // Waits until every key exists.
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  virtual void wait(const std::vector<std::string>& keys, Duration timeout) = 0;

  // true when every key exists; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Deletes `key`; true when it existed.
  virtual bool delete_key(const std::string& key) = 0;

  // The number of keys in the store (for a PrefixStore: in the whole store below it).
  virtual std::int64_t num_keys() = 0;

  // Values of every key, in order, waiting until all exist.
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) {
    return multi_get(keys, timeout());
  }
  virtual std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                             Duration timeout) = 0;

  // Sets every key to its value; keys.size() must equal values.size().
  virtual void multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) = 0;

  // Appends `value` to `key`, creating it when missing.
  virtual void append(const std::string& key, const std::string& value) = 0;

  // What this store offers beyond these calls (store_capabilities.h): each is
  // null when the store does not have it, else owned by the store and valid as
  // long as it is. The built-in stores have none; EtcdStore has all four.
  virtual StoreLeases* leases() { return nullptr; }
  virtual StoreWatches* watches() { return nullptr; }
  virtual StoreTickets* tickets() { return nullptr; }
  virtual StorePrefixes* prefixes() { return nullptr; }

  // The default timeout of blocking calls. Thread-safe, like every method: a
  // call that starts after set_timeout returned uses the new value.
  Duration timeout() const { return timeout_.load(std::memory_order_relaxed); }
  void set_timeout(Duration timeout) { timeout_.store(timeout, std::memory_order_relaxed); }

 protected:
  Store() = default;
  explicit Store(Duration timeout) : timeout_(timeout) {}

 private:
  std::atomic<Duration> timeout_{kDefaultTimeout};
};

}  // namespace ddp
