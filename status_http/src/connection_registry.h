// The server's open connections, in the order the cap evicts them: a
// connection closing after an error first of all, then the one that has been
// in its state longest, idle (waiting for its request) or busy (a complete
// request being answered, its response not yet taken by the client). A fresh
// connection is the newest of all, so a flood of new ones, idle or never
// reading, pushes out its own before a scraper that has just arrived.
//
// Ownership: holds a reference to every open connection; remove() drops it.
// Blocking: none. Thread-safety: the server's thread only, but size(), which
// any thread may read. Errors: none.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <list>
#include <memory>
#include <vector>

namespace ddp::status_http {

class Connection;

class ConnectionRegistry {
 public:
  using Clock = std::chrono::steady_clock;
  using List = std::list<std::shared_ptr<Connection>>;
  // Where a connection is in the registry; kept in the connection, touched by
  // the registry only.
  struct Slot {
    enum class In { kNone, kClosing, kIdle, kBusy };
    In in = In::kNone;
    List::iterator at;
    Clock::time_point since{};  // when it entered its state
  };

  // Registers a new connection as the newest idle one.
  void add(const std::shared_ptr<Connection>& connection);
  // The connection waits for a request from now on (the newest idle one).
  void mark_idle(Connection& connection);
  // The connection answers a complete request from now on (the newest busy one).
  void mark_busy(Connection& connection);
  // The connection is closing (draining after an error): evicted first.
  void mark_closing(Connection& connection);
  // Forgets the connection; does nothing when it is not registered.
  void remove(Connection& connection);

  // The connection to evict to make room (see the top of the file); null
  // when none is open.
  std::shared_ptr<Connection> eviction_candidate() const;
  // Every open connection (for the shutdown).
  std::vector<std::shared_ptr<Connection>> all() const;
  std::size_t size() const { return size_.load(std::memory_order_relaxed); }

 private:
  List& list_of(Slot::In in);
  // Moves the connection to the end of the list of `in` (registered already).
  void move(Connection& connection, Slot::In in);

  // Each list in the order its connections entered it: the front is the oldest.
  List closing_;
  List idle_;
  List busy_;
  std::atomic<std::size_t> size_{0};
};

}  // namespace ddp::status_http
