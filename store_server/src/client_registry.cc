#include "client_registry.h"

#include <fmt/format.h>

#include "ddp/store/protocol.h"

namespace ddp::server {

bool ClientRegistry::replay(std::string_view client_id, std::uint64_t request_id,
                            std::string& out) {
  auto it = entries_.find(std::string(client_id));
  if (it == entries_.end() || request_id > it->second.last_request) return false;
  Entry& entry = it->second;
  lru_.splice(lru_.begin(), lru_, entry.lru);
  if (request_id < entry.last_request) {
    protocol::encode_error(out, protocol::Status::kStaleRequest,
                           fmt::format("request {} is older than request {}, the last one this "
                                       "client sent; it is not applied",
                                       request_id, entry.last_request));
  } else if (entry.reply.empty()) {
    protocol::encode_error(out, protocol::Status::kStaleRequest,
                           fmt::format("request {} was applied once, but its reply of {} bytes "
                                       "was lost with the connection and is too large to replay",
                                       request_id, entry.reply_size));
  } else {
    out.append(entry.reply);
  }
  return true;
}

void ClientRegistry::record(std::string_view client_id, std::uint64_t request_id,
                            std::string_view reply) {
  std::string id(client_id);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    if (max_clients_ == 0) return;
    while (entries_.size() >= max_clients_) {
      entries_.erase(lru_.back());
      lru_.pop_back();
    }
    lru_.push_front(id);
    it = entries_.emplace(std::move(id), Entry{}).first;
    it->second.lru = lru_.begin();
  } else {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
  }
  Entry& entry = it->second;
  entry.last_request = request_id;
  entry.reply_size = reply.size();
  if (reply.size() <= kMaxReplayBytes) {
    entry.reply.assign(reply);
  } else {
    std::string().swap(entry.reply);
  }
}

}  // namespace ddp::server
