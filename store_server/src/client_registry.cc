#include "client_registry.h"

#include <fmt/format.h>

#include "ddp/store/protocol.h"

namespace ddp::server {

void ClientRegistry::connected(std::string_view client_id, std::uint64_t connection,
                               Clock::time_point now) {
  forget_idle(now);
  auto [it, created] = entries_.try_emplace(std::string(client_id));
  Entry& entry = it->second;
  if (created) entry.created_by = connection;
  if (entry.connections++ == 0 && !created) idle_.erase(entry.idle_position);
}

void ClientRegistry::disconnected(std::string_view client_id, Clock::time_point now) {
  auto it = entries_.find(std::string(client_id));
  if (it == entries_.end() || it->second.connections == 0) return;
  Entry& entry = it->second;
  if (--entry.connections == 0) {
    entry.idle_since = now;
    entry.idle_position = idle_.insert(idle_.end(), it->first);
  }
  forget_idle(now);
}

void ClientRegistry::forget_idle(Clock::time_point now) {
  while (!idle_.empty()) {
    auto it = entries_.find(idle_.front());
    const bool expired = now - it->second.idle_since > options_.idle_window;
    if (!expired && idle_.size() <= options_.max_idle) return;
    entries_.erase(it);
    idle_.pop_front();
  }
}

bool ClientRegistry::replay(std::string_view client_id, std::uint64_t connection,
                            std::uint64_t request_id, std::string& out) {
  const bool retry = (request_id & protocol::kRetryFlag) != 0;
  const std::uint64_t id = request_id & ~protocol::kRetryFlag;
  if (id == 0) return false;  // "no id": applied as it comes
  auto it = entries_.find(std::string(client_id));
  if (it == entries_.end()) return false;  // not registered (no handshake): nothing to check
  Entry& entry = it->second;
  if (id > entry.last_request) {
    if (!retry || entry.created_by != connection) return false;
    protocol::encode_error(out, protocol::Status::kStaleRequest,
                           fmt::format("request {} is a retry the server cannot check: it does not "
                                       "remember this client's earlier requests (it forgets a "
                                       "client {} s after its last connection closed, or it "
                                       "restarted), so the request may have been applied once "
                                       "already; it is not applied again",
                                       id, options_.idle_window.count() / 1000));
    return true;
  }
  if (id < entry.last_request) {
    protocol::encode_error(out, protocol::Status::kStaleRequest,
                           fmt::format("request {} is older than request {}, the last one this "
                                       "client sent; it is not applied",
                                       id, entry.last_request));
  } else if (entry.reply.empty()) {
    protocol::encode_error(out, protocol::Status::kStaleRequest,
                           fmt::format("request {} was applied once, but its reply of {} bytes "
                                       "was lost with the connection and is too large to replay",
                                       id, entry.reply_size));
  } else {
    out.append(entry.reply);
  }
  return true;
}

void ClientRegistry::record(std::string_view client_id, std::uint64_t request_id,
                            std::string_view reply) {
  auto it = entries_.find(std::string(client_id));
  if (it == entries_.end()) return;
  Entry& entry = it->second;
  entry.last_request = request_id & ~protocol::kRetryFlag;
  entry.reply_size = reply.size();
  if (reply.size() <= kMaxReplayBytes) {
    entry.reply.assign(reply);
  } else {
    std::string().swap(entry.reply);
  }
}

}  // namespace ddp::server
