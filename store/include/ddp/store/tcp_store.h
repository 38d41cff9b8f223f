// The TCP client of the store server (StoreServer / ddp-rendezvous).
//
// One connection per TcpStore; calls from several threads are serialized on it.
// The constructor connects with exponential backoff until `connect_timeout`,
// performs the version handshake and, when a token is given, mutual
// authentication (each side proves the token with an HMAC over both sides'
// nonces); it throws NetworkError when the server cannot be reached in time,
// ProtocolError on a version mismatch and AuthError when the token is wrong or
// missing, or when a token was given and the server does not prove it holds it.
//
// A connection that drops (the server's idle timeout, a reset, a network
// blip) is re-established on the next call, with backoff, handshake and
// authentication, and the call is sent again: every operation is safe to
// retry, because add, compare_set, append and delete_key carry a request id
// the server remembers, so a retried one is applied once. A call gives up with
// NetworkError at its deadline, `reconnect_timeout` after the loss, or after
// the server refused new connections for 250 ms (it is gone); it never
// hangs. A server shutting down fails pending waits with ShutdownError. A
// retry the server cannot vouch for (it forgot this client while it was away,
// or restarted) is refused with InvalidArgument ("stale request"), never
// applied twice.
//
// The key lists of wait, check, multi_get and multi_set are sent in runs of
// at most protocol::kMaxKeysPerRequest keys (one request each, the blocking
// ones sharing the call's timeout), so a longer list works as with any Store;
// only a multi_set of more keys is no longer all-or-nothing against the
// server's store limit.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "ddp/store/store.h"

namespace ddp {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  // Shared secret for the server's authentication step; empty means none.
  std::string token;
  // How long the constructor keeps retrying to connect.
  Store::Duration connect_timeout = std::chrono::seconds(60);
  // How long a call keeps trying to re-establish a lost connection.
  Store::Duration reconnect_timeout = std::chrono::seconds(60);
  // Default timeout of blocking calls (Store::timeout()).
  Store::Duration timeout = Store::kDefaultTimeout;
};

class TcpStore final : public Store {
 public:
  explicit TcpStore(const TcpStoreOptions& options);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::string& value) override;
  using Store::get;
  std::string get(const std::string& key, Duration timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  std::int64_t num_keys() override;
  using Store::multi_get;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     Duration timeout) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;
  void append(const std::string& key, const std::string& value) override;

  const TcpStoreOptions& options() const;

 private:
  class Connection;
  std::unique_ptr<Connection> connection_;
};

}  // namespace ddp
