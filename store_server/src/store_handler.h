// The store server's request handler: the key-value map and the parked
// requests, with no sockets and no timers (the session owns those).
//
// A get/wait/multi_get whose keys are missing is parked: it is a small record
// registered on one missing key, costing no thread. A write to that key moves
// it to its next missing key or completes it, handing the reply to its Waiter.
// Memory is bounded (StoreHandler::Limits): the bytes the store holds, a value
// grown by append, the size of any reply and the keys parked requests hold.
// A request that would pass a limit gets an error reply (`store full`,
// `reply too large`, `invalid argument`) and changes nothing.
// Not thread-safe: the server calls it from its one io_context thread.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ddp/store/protocol.h"

namespace ddp {

class StoreHandler {
 public:
  // The owner of a parked request (a session). At most one parked request per waiter.
  class Waiter {
   public:
    // The parked request completed (its keys exist, or the server shuts down);
    // `reply` is one complete reply frame. Called from inside a handler method:
    // the waiter must not call back into the handler from here.
    virtual void on_wake(std::string_view reply) = 0;

   protected:
    ~Waiter() = default;
  };

  struct Limits {
    // Keys plus values plus kEntryOverhead per key, over the whole store.
    std::uint64_t max_store_bytes = store_limits::kMaxStoreBytes;
    // The largest value append may grow a key to.
    std::uint64_t max_value_size = store_limits::kMaxValueSize;
    // The largest reply frame payload (a multi_get of many large values).
    std::uint64_t max_reply_size = store_limits::kMaxFrameSize;
    // The keys held by every parked request together.
    std::uint64_t max_parked_bytes = 64ull << 20;
  };
  // What a stored key costs beyond its bytes (map node, string headers).
  static constexpr std::uint64_t kEntryOverhead = 64;

  StoreHandler() = default;
  explicit StoreHandler(const Limits& limits) : limits_(limits) {}
  StoreHandler(const StoreHandler&) = delete;
  StoreHandler& operator=(const StoreHandler&) = delete;

  // Applies an operation (not hello/auth). Returns true when it completed (its
  // reply frame appended to `out`), false when it was parked for `waiter`.
  // Never throws for bad requests: they get an error reply.
  bool handle(const protocol::Request& request, std::string& out, Waiter* waiter);

  // Forgets the parked request of `waiter` (its client disconnected). No-op when none.
  void cancel(Waiter* waiter);

  // The parked request of `waiter` timed out: forgets it and appends the timeout
  // reply naming the missing keys. No-op (returns false) when none is parked.
  bool expire(Waiter* waiter, std::string& out);

  // Fails every parked request with a shutdown error reply (via on_wake).
  void shutdown(std::string_view message);

  bool is_parked(const Waiter* waiter) const;
  std::size_t num_parked() const { return parked_.size(); }
  std::size_t num_keys() const { return data_.size(); }
  // The bytes counted against max_store_bytes, and held by parked requests.
  std::uint64_t stored_bytes() const { return stored_bytes_; }
  std::uint64_t parked_bytes() const { return parked_bytes_; }
  const Limits& limits() const { return limits_; }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Map = std::unordered_map<std::string, std::string, Hash, std::equal_to<>>;

  // The requests parked on one key, in the order they parked: a list, so that
  // a waiter that leaves is taken out in constant time (tens of thousands of
  // clients may wait on one key, and all leave together when a job ends).
  using WaiterList = std::list<Waiter*>;

  struct Parked {
    protocol::Op op;
    std::vector<std::string> keys;
    std::size_t next = 0;  // index of the missing key it is registered on
    std::uint64_t timeout_ms = 0;
    std::uint64_t bytes = 0;        // counted in parked_bytes_
    WaiterList::iterator position;  // in key_waiters_[keys[next]]
  };

  // A request refused by a limit: the status and message of its error reply.
  struct Refused {
    protocol::Status status;
    std::string message;
  };

  static std::uint64_t entry_bytes(std::size_t key, std::size_t value) {
    return key + value + kEntryOverhead;
  }
  // Throws Refused when the store would hold more than max_store_bytes after
  // `added` more bytes and `removed` fewer.
  void reserve(std::uint64_t added, std::uint64_t removed) const;
  void set(std::string_view key, std::string_view value);
  void erase(Map::iterator it);
  // Wakes the requests parked on `key` (which now exists).
  void wake(std::string_view key);
  // Appends the reply of a get/wait/multi_get whose keys all exist.
  void reply_ready(protocol::Op op, const std::vector<std::string_view>& keys, std::string& out);
  bool park(const protocol::Request& request, Waiter* waiter, std::string& out);

  Limits limits_;
  std::uint64_t stored_bytes_ = 0;
  std::uint64_t parked_bytes_ = 0;
  Map data_;
  // Registers `waiter`, whose parked request is `p`, on its next missing key.
  void register_waiter(Waiter* waiter, Parked& p);

  std::unordered_map<std::string, WaiterList, Hash, std::equal_to<>> key_waiters_;
  std::unordered_map<const Waiter*, Parked> parked_;
  std::string scratch_;
  std::vector<std::string_view> views_;       // handle(): the keys of a get/wait/multi_get
  std::vector<std::string_view> wake_views_;  // wake(): the keys of a completed request
};

}  // namespace ddp
