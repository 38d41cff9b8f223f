// What the server remembers of each client across its reconnections: the id of
// the last non-idempotent request (add, compare_set, append, delete_key) it
// applied for that client, and that request's reply. A client that lost its
// connection while such a request was in flight sends it again, with the same
// id, after reconnecting; the server then answers from this record instead of
// applying the request twice.
//
// Memory is bounded: at most `max_clients` records (the least recently used
// one is forgotten first), and replies of at most kMaxReplayBytes are kept (a
// retry of a request whose reply was larger gets a `stale request` error saying
// that it was applied once and its reply is lost).
// Not thread-safe: the server's io_context thread only.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <string_view>
#include <unordered_map>

namespace ddp::server {

class ClientRegistry {
 public:
  static constexpr std::size_t kMaxReplayBytes = 1024;

  explicit ClientRegistry(std::size_t max_clients) : max_clients_(max_clients) {}

  // For request `request_id` of `client_id`: when it is the last one applied,
  // appends its recorded reply frame to `out`; when it is older, appends a
  // `stale request` error. Returns true in both cases (the request must not be
  // applied), false for a new request.
  bool replay(std::string_view client_id, std::uint64_t request_id, std::string& out);

  // Records that `request_id` was applied for `client_id` with `reply` (one
  // complete reply frame).
  void record(std::string_view client_id, std::uint64_t request_id, std::string_view reply);

  std::size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::uint64_t last_request = 0;
    std::string reply;  // empty when it was too large to keep
    std::size_t reply_size = 0;
    std::list<std::string>::iterator lru;
  };

  std::size_t max_clients_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> lru_;  // client ids, most recently used first
};

}  // namespace ddp::server
