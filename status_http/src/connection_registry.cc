#include "connection_registry.h"

#include "connection.h"

namespace ddp::status_http {

void ConnectionRegistry::add(const std::shared_ptr<Connection>& connection) {
  Slot& slot = connection->registry_slot();
  if (slot.in != Slot::In::kNone) return;
  slot.at = idle_.insert(idle_.end(), connection);
  slot.in = Slot::In::kIdle;
  size_.fetch_add(1, std::memory_order_relaxed);
}

void ConnectionRegistry::move(Connection& connection, List& to, List::iterator position,
                              Slot::In in) {
  Slot& slot = connection.registry_slot();
  if (slot.in == Slot::In::kNone) return;
  List& from = slot.in == Slot::In::kIdle ? idle_ : busy_;
  to.splice(position, from, slot.at);  // the iterator stays valid, now into `to`
  slot.in = in;
}

void ConnectionRegistry::mark_idle(Connection& connection) {
  move(connection, idle_, idle_.end(), Slot::In::kIdle);
}

void ConnectionRegistry::mark_busy(Connection& connection) {
  move(connection, busy_, busy_.end(), Slot::In::kBusy);
}

void ConnectionRegistry::mark_closing(Connection& connection) {
  move(connection, idle_, idle_.begin(), Slot::In::kIdle);
}

void ConnectionRegistry::remove(Connection& connection) {
  Slot& slot = connection.registry_slot();
  if (slot.in == Slot::In::kNone) return;
  List& from = slot.in == Slot::In::kIdle ? idle_ : busy_;
  slot.in = Slot::In::kNone;
  size_.fetch_sub(1, std::memory_order_relaxed);
  from.erase(slot.at);  // may destroy the connection: nothing touches it after this
}

std::shared_ptr<Connection> ConnectionRegistry::eviction_candidate() const {
  return idle_.empty() ? nullptr : idle_.front();
}

std::vector<std::shared_ptr<Connection>> ConnectionRegistry::all() const {
  std::vector<std::shared_ptr<Connection>> connections(idle_.begin(), idle_.end());
  connections.insert(connections.end(), busy_.begin(), busy_.end());
  return connections;
}

}  // namespace ddp::status_http
