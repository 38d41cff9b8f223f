// What the server remembers of each client across its reconnections: the id of
// the last non-idempotent request (add, compare_set, append, delete_key) it
// applied for that client, and that request's reply. A client that lost its
// connection while such a request was in flight sends it again, with the same
// id and the retry flag (protocol::kRetryFlag), after reconnecting; the server
// then answers from this record instead of applying the request twice.
//
// The guarantee holds because a record is never forgotten while it may still
// be needed:
//   - a client's record exists from its first hello on, and is kept while any
//     connection of that client is open (at most max_clients of them);
//   - after its last connection closed it is kept for `idle_window` (longer
//     than any client's reconnect window: TcpStore gives up 60 s after a loss
//     by default), and at most `max_idle` such records are kept (the oldest is
//     forgotten first);
//   - a retry the server cannot vouch for, because its record was created by
//     the very connection the retry arrives on (the client was forgotten, or
//     the server restarted, while it was away), is refused with `stale
//     request` and never applied.
// Replies of at most kMaxReplayBytes are kept (a retry of a request whose
// reply was larger gets `stale request` saying that it was applied once and
// its reply is lost).
//
// Time is passed in (the server's steady clock; tests pass their own).
// Not thread-safe: the server's io_context thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <string>
#include <string_view>
#include <unordered_map>

namespace ddp::server {

class ClientRegistry {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::size_t kMaxReplayBytes = 1024;

  struct Options {
    // Records of clients with no open connection kept at most...
    std::size_t max_idle = 16384;
    // ...and for at most this long after their last connection closed.
    std::chrono::milliseconds idle_window = std::chrono::minutes(10);
  };

  ClientRegistry() = default;
  explicit ClientRegistry(const Options& options) : options_(options) {}

  // A connection of `client_id` completed its handshake; `connection`
  // identifies it among the server's connections (never reused).
  void connected(std::string_view client_id, std::uint64_t connection, Clock::time_point now);
  // That connection closed (once per connected()).
  void disconnected(std::string_view client_id, Clock::time_point now);

  // For request `request_id` (retry flag included) of `client_id` on
  // `connection`: appends the recorded reply to `out` when it is the last one
  // applied, a `stale request` error when it is older, or when it is a retry
  // the record cannot vouch for. Returns true in those cases (the request
  // must not be applied), false for a request to apply.
  bool replay(std::string_view client_id, std::uint64_t connection, std::uint64_t request_id,
              std::string& out);

  // Records that `request_id` was applied for `client_id` with `reply` (one
  // complete reply frame).
  void record(std::string_view client_id, std::uint64_t request_id, std::string_view reply);

  // Records kept, and those of clients without an open connection.
  std::size_t size() const { return entries_.size(); }
  std::size_t idle() const { return idle_.size(); }

 private:
  struct Entry {
    std::uint64_t last_request = 0;
    std::string reply;  // empty when it was too large to keep
    std::size_t reply_size = 0;
    std::size_t connections = 0;
    // The connection whose hello created the record: a retry arriving on it
    // has no history here to be checked against.
    std::uint64_t created_by = 0;
    Clock::time_point idle_since{};
    std::list<std::string>::iterator idle_position;  // valid while connections == 0
  };

  // Forgets idle records past the window, then the oldest past max_idle.
  void forget_idle(Clock::time_point now);

  Options options_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> idle_;  // ids of records without a connection, oldest first
};

}  // namespace ddp::server
