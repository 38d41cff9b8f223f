#include "connection_registry.h"

#include "connection.h"

namespace ddp::status_http {

ConnectionRegistry::List& ConnectionRegistry::list_of(Slot::In in) {
  switch (in) {
    case Slot::In::kClosing:
      return closing_;
    case Slot::In::kBusy:
      return busy_;
    default:
      return idle_;
  }
}

void ConnectionRegistry::add(const std::shared_ptr<Connection>& connection) {
  Slot& slot = connection->registry_slot();
  if (slot.in != Slot::In::kNone) return;
  slot.at = idle_.insert(idle_.end(), connection);
  slot.in = Slot::In::kIdle;
  slot.since = Clock::now();
  size_.fetch_add(1, std::memory_order_relaxed);
}

void ConnectionRegistry::move(Connection& connection, Slot::In in) {
  Slot& slot = connection.registry_slot();
  if (slot.in == Slot::In::kNone) return;
  List& to = list_of(in);
  to.splice(to.end(), list_of(slot.in), slot.at);  // the iterator stays valid, now into `to`
  slot.in = in;
  slot.since = Clock::now();
}

void ConnectionRegistry::mark_idle(Connection& connection) { move(connection, Slot::In::kIdle); }

void ConnectionRegistry::mark_busy(Connection& connection) { move(connection, Slot::In::kBusy); }

void ConnectionRegistry::mark_closing(Connection& connection) {
  move(connection, Slot::In::kClosing);
}

void ConnectionRegistry::remove(Connection& connection) {
  Slot& slot = connection.registry_slot();
  if (slot.in == Slot::In::kNone) return;
  List& from = list_of(slot.in);
  slot.in = Slot::In::kNone;
  size_.fetch_sub(1, std::memory_order_relaxed);
  from.erase(slot.at);  // may destroy the connection: nothing touches it after this
}

std::shared_ptr<Connection> ConnectionRegistry::eviction_candidate() const {
  if (!closing_.empty()) return closing_.front();
  if (idle_.empty()) return busy_.empty() ? nullptr : busy_.front();
  if (busy_.empty()) return idle_.front();
  const auto& idle = idle_.front();
  const auto& busy = busy_.front();
  return busy->registry_slot().since < idle->registry_slot().since ? busy : idle;
}

std::vector<std::shared_ptr<Connection>> ConnectionRegistry::all() const {
  std::vector<std::shared_ptr<Connection>> connections(closing_.begin(), closing_.end());
  connections.insert(connections.end(), idle_.begin(), idle_.end());
  connections.insert(connections.end(), busy_.begin(), busy_.end());
  return connections;
}

}  // namespace ddp::status_http
