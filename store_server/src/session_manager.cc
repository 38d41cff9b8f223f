#include "session_manager.h"

#include <vector>

#include "session.h"

namespace ddp::server {

void SessionManager::add(std::shared_ptr<Session> session, bool counted) {
  if (counted) active_.fetch_add(1, std::memory_order_relaxed);
  sessions_.insert(std::move(session));
}

void SessionManager::remove(const std::shared_ptr<Session>& session) {
  if (sessions_.erase(session) > 0 && sessions_.empty() && on_empty_) on_empty_();
}

void SessionManager::stop_all() {
  // Copy: stopping a session may remove it from sessions_.
  std::vector<std::shared_ptr<Session>> all(sessions_.begin(), sessions_.end());
  for (auto& session : all) session->stop();
  if (sessions_.empty() && on_empty_) on_empty_();
}

}  // namespace ddp::server
