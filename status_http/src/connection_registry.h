// The server's open connections, in the order the cap evicts them: idle
// connections by how long they have waited for their request (a connection
// closing after an error first of all), busy ones (a complete request being
// answered) never.
//
// Ownership: holds a reference to every open connection; remove() drops it.
// Blocking: none. Thread-safety: the server's thread only, but size(), which
// any thread may read. Errors: none.
#pragma once

#include <atomic>
#include <cstddef>
#include <list>
#include <memory>
#include <vector>

namespace ddp::status_http {

class Connection;

class ConnectionRegistry {
 public:
  using List = std::list<std::shared_ptr<Connection>>;
  // Where a connection is in the registry; kept in the connection, touched by
  // the registry only.
  struct Slot {
    enum class In { kNone, kIdle, kBusy };
    In in = In::kNone;
    List::iterator at;
  };

  // Registers a new connection as the newest idle one.
  void add(const std::shared_ptr<Connection>& connection);
  // The connection waits for a request from now on (the newest idle one).
  void mark_idle(Connection& connection);
  // The connection has a complete request: it is not evicted.
  void mark_busy(Connection& connection);
  // The connection is closing (draining after an error): evicted first.
  void mark_closing(Connection& connection);
  // Forgets the connection; does nothing when it is not registered.
  void remove(Connection& connection);

  // The connection to evict to make room: the idle one that has waited
  // longest; null when every connection is busy.
  std::shared_ptr<Connection> eviction_candidate() const;
  // Every open connection (for the shutdown).
  std::vector<std::shared_ptr<Connection>> all() const;
  std::size_t size() const { return size_.load(std::memory_order_relaxed); }

 private:
  // Moves the connection to `position` in `to` (registered already).
  void move(Connection& connection, List& to, List::iterator position, Slot::In in);

  List idle_;  // the front has waited longest
  List busy_;
  std::atomic<std::size_t> size_{0};
};

}  // namespace ddp::status_http
