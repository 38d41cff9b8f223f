// The calls of EtcdStore to etcd's v3 JSON gateway: Transport, with endpoint
// rotation, retries and authentication, over one HTTP connection for unary
// calls (etcd_connection.h) and replies read as etcd_gateway.h reads them.
//
//   Transport   the shared state of one EtcdStore: options, TLS context, the
//               endpoint currently in use, the auth token, and the connection
//               for unary calls (one, serialized). call() retries "try again"
//               failures across endpoints; open_stream() opens a streaming
//               call (watch) on a connection of its own.
//
// Nothing an endpoint sends is trusted: a reply body, and each message of a
// stream, is at most options.max_reply_bytes; JSON is parsed with bounded
// nesting; every bytes field (key, value, range_end) must be valid padded
// base64; and every reply must come from the cluster of the first one. A
// reply that breaks any of these (BadReply) moves the call to the next
// endpoint like a broken connection; a call whose every endpoint sent one
// throws ProtocolError naming them. A fresh connection proves its cluster
// (maintenance/status, which needs no token) before any credential is sent
// on it.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/common/time.h"
#include "ddp/store_etcd/etcd_store.h"
#include "etcd_connection.h"
#include "etcd_gateway.h"

namespace ddp::etcd {

class Transport {
 public:
  // What one call (or one blocking wait, across its watches) remembers of
  // its failed attempts: the endpoints that sent something that is not
  // etcd's (when all did, it fails at once), and re-authentications.
  struct Failures {
    int reauths = 0;
    std::vector<bool> bad;
    std::size_t bad_count = 0;
  };

  // Throws InvalidArgument for unusable options (no endpoints, unreadable
  // TLS files). Warns (log) when a username is given over plain http: the
  // password then crosses the network in clear text.
  explicit Transport(EtcdStoreOptions options);
  ~Transport();

  const EtcdStoreOptions& options() const { return options_; }
  std::string endpoints_text() const;
  // The endpoint the next call starts at.
  EtcdEndpoint current_endpoint();

  // The constructor's check: within options.connect_timeout, some endpoint
  // answers POST /v3/kv/range as an etcd v3 gateway (after authenticating).
  void probe();

  // A unary call: POST `path` with `body` on the shared connection, retried
  // across endpoints until `retry_limit` (options.request_timeout when not
  // given) after the first failure. Returns the reply's JSON. Throws
  // NetworkError naming the endpoints, ReplyError<...> for etcd's final errors,
  // ProtocolError for replies that are not etcd's.
  Json call(const std::string& origin, const std::string& path, const Json& body,
            std::optional<Duration> retry_limit = std::nullopt);

  // Opens a streaming call on a connection of its own, rotating endpoints and
  // retrying until `deadline`, or options.request_timeout after
  // `*failing_since` (set here at the first failure when unset). Returns
  // nullptr when the deadline passed or `interrupt` was stopped.
  // `failures`, when given, is shared with the caller's other attempts.
  std::unique_ptr<Connection> open_stream(const std::string& origin, const std::string& path,
                                          const Json& body, const Deadline& deadline,
                                          std::optional<Clock::time_point>& failing_since,
                                          Interrupt* interrupt, Failures* failures = nullptr);

  // Called from a catch block after an attempt on `endpoint` failed: a broken
  // connection or a bad reply marks the endpoint failed (false: retry after
  // backoff), an expired token is dropped (true: retry at once, at most
  // kMaxReauth times); a bad reply from every endpoint throws ProtocolError;
  // anything else is rethrown (a bad certificate as AuthError). `used` (the
  // unary connection, or null for a stream's own) is dropped unless only the
  // token expired.
  bool after_failed_attempt(const std::string& origin, const EtcdEndpoint& endpoint,
                            Failures& failures, std::unique_ptr<Connection>* used);

  // Whether the member at `endpoint` answers a status request within
  // `deadline` as a member of this cluster that knows a leader: what a watch
  // whose stream went silent asks (a frozen or cut-off member keeps the
  // stream open and sends nothing). `connection` is the watch's own check
  // connection, opened or re-opened here and kept for the next check.
  bool member_answers(const EtcdEndpoint& endpoint, std::unique_ptr<Connection>& connection,
                      const Deadline& deadline, Interrupt* interrupt);

  // Records that the endpoint in use failed (a stream broke): later calls
  // start at the next one.
  void endpoint_failed(const EtcdEndpoint& endpoint, const std::string& reason);
  // false when `reply` (a reply or a watch message's result, with its header)
  // comes from another etcd cluster than the first reply this client got.
  bool from_this_cluster(const Json& reply);
  // A message of a stream carried an error: throws ReplyError for final ones;
  // returns normally when the stream should be re-opened (re-authenticating
  // first when the token expired).
  void stream_error(const std::string& origin, const std::string& where, const Json& error);

 private:
  Json attempt(const std::string& origin, const std::string& path, const std::string& body,
               const Deadline& deadline);
  void authenticate(Connection& connection, const std::string& origin, const Deadline& deadline);
  // A fresh connection's first request: maintenance/status (no token), whose
  // header names the cluster. Throws BadReply when it is another cluster's.
  Json check_member(Connection& connection, const std::string& origin, const Deadline& deadline);
  // Opens `connection`, proves its cluster, then authenticates when a
  // username is given and no token is held.
  void prepare(Connection& connection, const std::string& origin, const Deadline& deadline);
  // Throws BadReply when `reply` comes from another cluster than the first reply did.
  void check_cluster(const Json& reply, const std::string& where);
  std::size_t index_of(const EtcdEndpoint& endpoint) const;
  std::string token();
  [[noreturn]] void give_up(const std::string& origin, Duration limit);

  EtcdStoreOptions options_;
  std::unique_ptr<boost::asio::ssl::context> tls_;

  std::mutex state_mutex_;  // guards the four below
  std::size_t current_ = 0;
  std::string token_;
  std::vector<std::string> last_reasons_;  // per endpoint, for messages
  // The cluster id of the first reply: a member of another cluster is a failed endpoint.
  std::string cluster_id_;

  std::mutex unary_mutex_;  // one unary call at a time
  std::unique_ptr<Connection> unary_;
};

}  // namespace ddp::etcd
