// Owns the open sessions of a server (Asio's connection_manager): keeps them
// alive, counts the active ones, and closes them all on shutdown.
// io_context thread only, except active(), which any thread may read.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <unordered_set>

namespace ddp::server {

class Session;

class SessionManager {
 public:
  // Takes a started or about-to-start session. `counted` sessions count in
  // active() until they begin closing (a rejected connection is not counted).
  void add(std::shared_ptr<Session> session, bool counted);
  // The session closed its socket; drops it (its handlers may still hold it).
  void remove(const std::shared_ptr<Session>& session);
  // A counted session began closing.
  void uncount() { active_.fetch_sub(1, std::memory_order_relaxed); }

  // Server shutdown: asks every session to flush and close.
  void stop_all();

  std::size_t active() const { return active_.load(std::memory_order_relaxed); }
  std::size_t size() const { return sessions_.size(); }
  // Called once the last session is removed (used to end the shutdown early).
  void set_on_empty(std::function<void()> callback) { on_empty_ = std::move(callback); }

 private:
  std::unordered_set<std::shared_ptr<Session>> sessions_;
  std::atomic<std::size_t> active_{0};
  std::function<void()> on_empty_;
};

}  // namespace ddp::server
