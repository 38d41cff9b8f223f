// The transport under EtcdStore: HTTP/1.1 (Boost.Beast) to etcd's v3 JSON
// gateway, plain or TLS, with endpoint rotation, retries and authentication.
//
//   Connection  one HTTP connection to one endpoint, owned by one thread at a
//               time; every network operation runs on the connection's own
//               io_context for at most the given deadline, and cancel() (from
//               any thread) aborts whatever it is doing.
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

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ddp/common/error.h"
#include "ddp/common/time.h"
#include "ddp/store_etcd/etcd_store.h"

namespace boost::asio::ssl {
class context;
}

namespace ddp::etcd {

using Json = nlohmann::json;

std::string base64_encode(std::string_view bytes);
// Whether `text` is base64 with its padding (length a multiple of 4, "=" only
// as the last one or two characters), as etcd writes it.
bool is_padded_base64(std::string_view text);
// Throws ProtocolError when `text` is not valid padded base64; never reads or
// writes past either string.
std::string base64_decode(std::string_view text);
// An int64 field of etcd's JSON ("123" or 123); 0 when missing.
std::int64_t json_int(const Json& object, const char* field);
// A bytes field (base64) decoded; "" when missing.
std::string json_bytes(const Json& object, const char* field);
// A boolean field; false when missing or not a boolean (never throws).
bool json_flag(const Json& object, const char* field);
// A string field; `otherwise` when missing or not a string (never throws).
std::string json_string(const Json& object, const char* field, const std::string& otherwise = "");
// etcd's GetPrefixRangeEnd: the prefix with its last byte below 0xff
// incremented ("\0" for an empty prefix or all 0xff: every key).
std::string prefix_range_end(const std::string& prefix);
// "host:port" ("[v6]:port").
std::string endpoint_text(const EtcdEndpoint& endpoint);

// The connection failed (refused, reset, closed, timed out): the call may be
// retried, on this or another endpoint.
class ConnectionFailed : public NetworkError {
 public:
  ConnectionFailed(std::string reason, bool stale)
      : NetworkError("", reason), reason_(std::move(reason)), stale_(stale) {}
  const std::string& reason() const { return reason_; }
  // A reused keep-alive connection failed before any byte of a reply came
  // back: most likely the server had closed it while it was idle.
  bool stale() const { return stale_; }

 private:
  std::string reason_;
  bool stale_;
};

// A reply that is not etcd's: over the size limit, not HTTP, not JSON (or too
// deeply nested), a bytes field that is not base64, a reply from another
// cluster. The call moves to the next endpoint.
class BadReply : public ProtocolError {
 public:
  BadReply(const std::string& where, std::string reason)
      : ProtocolError("", where + " " + reason), reason_(std::move(reason)) {}
  // What was wrong, without the endpoint ("sent a reply body over 64 MiB").
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

// What etcd said in an error reply ({"error","message","code"}) that is not
// "try again". Errors thrown for such replies are ReplyError<Base>: catch
// the ddp error (InvalidArgument, AuthError, ProtocolError) and
// dynamic_cast to ReplyInfo for the details.
class ReplyInfo {
 public:
  ReplyInfo(int code, std::string etcd_message)
      : code_(code), etcd_message_(std::move(etcd_message)) {}
  virtual ~ReplyInfo() = default;
  // The gRPC status code.
  int code() const { return code_; }
  const std::string& etcd_message() const { return etcd_message_; }

 private:
  int code_;
  std::string etcd_message_;
};

template <typename Base>
class ReplyError : public Base, public ReplyInfo {
 public:
  ReplyError(std::string origin, const std::string& message, int code, std::string etcd_message)
      : Base(std::move(origin), message), ReplyInfo(code, std::move(etcd_message)) {}
};

// The ReplyInfo of `error`, if it came from an etcd error reply.
inline const ReplyInfo* reply_info(const Error& error) {
  return dynamic_cast<const ReplyInfo*>(&error);
}

struct HttpReply {
  int status = 0;
  std::string body;
};

// The JSON of a unary reply from `where` to POST `path`: a parsed object whose
// bytes fields are valid base64. Throws BadReply for a reply that is not
// etcd's, ReplyError<...> for etcd's final errors, and (internal) classes
// that make Transport retry or re-authenticate.
Json decode_reply(const std::string& origin, const std::string& where, const std::string& path,
                  const HttpReply& reply);
// One message of a watch stream, checked as decode_reply checks a reply.
// Throws BadReply.
Json decode_stream_message(const std::string& where, const std::string& line);

class Connection {
 public:
  // Replies and stream messages larger than `max_reply_bytes` are BadReply.
  Connection(EtcdEndpoint endpoint, boost::asio::ssl::context* tls, std::size_t max_reply_bytes);
  ~Connection();
  // A connection over an already connected plain socket `fd` (taken over),
  // named `endpoint`: for tests and fuzzing.
  static std::unique_ptr<Connection> adopt(int fd, EtcdEndpoint endpoint,
                                           std::size_t max_reply_bytes);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const EtcdEndpoint& endpoint() const { return endpoint_; }
  const std::string& where() const { return where_; }
  bool is_open() const;

  // Connects (and does the TLS handshake). Throws ConnectionFailed, or
  // AuthError when the server's certificate does not verify.
  void open(const Deadline& deadline);
  // POSTs `body` to `target` and reads the whole reply; the reply must start
  // by `first_byte` (etcd answers once it has applied the request) and end
  // by `deadline`.
  HttpReply post(const std::string& target, const std::string& body, const std::string& token,
                 const Deadline& first_byte, const Deadline& deadline);
  // POSTs and reads the reply's header only (a streaming reply follows, or
  // the rest of a unary one: stream_rest); returns the HTTP status. The
  // header must start by `first_byte` (default: `deadline`).
  // `endless`: a watch, whose chunked body has no end (bounded per message
  // instead of in all).
  int post_stream(const std::string& target, const std::string& body, const std::string& token,
                  const Deadline& deadline, const Deadline* first_byte = nullptr,
                  bool endless = false);
  // The next newline-terminated message of a streaming reply; std::nullopt
  // when the deadline passed first (the stream stays usable). Throws
  // ConnectionFailed when the stream broke or ended, BadReply when a message
  // grows past max_reply_bytes or the stream is not HTTP.
  std::optional<std::string> next_line(const Deadline& deadline);
  // The rest of a streaming reply whose status was not 200.
  std::string stream_rest(const Deadline& deadline);

  // Aborts the current and every later operation. Any thread.
  void cancel();
  void close();

 private:
  struct Impl;
  EtcdEndpoint endpoint_;
  std::string where_;
  std::unique_ptr<Impl> impl_;
};

// Lets another thread stop a streaming call: it cancels the connection
// attached to it and cuts short backoff sleeps.
class Interrupt {
 public:
  void attach(Connection* connection);
  void detach();
  void stop();
  bool stopped() const { return stopped_.load(); }
  // Sleeps `duration`; false when stopped meanwhile.
  bool sleep_for(Duration duration);

 private:
  std::mutex mutex_;
  std::condition_variable woken_;
  Connection* attached_ = nullptr;
  std::atomic<bool> stopped_{false};
};

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

// Maps etcd's error reply (gRPC `code`, `message`) from `where` to a ddp
// error; `retry` is set instead when the call should be retried elsewhere,
// `reauth` when the token expired.
struct ErrorClass {
  bool retry = false;
  bool reauth = false;
};
ErrorClass classify(int code, const std::string& message);
[[noreturn]] void throw_reply_error(const std::string& origin, const std::string& where, int code,
                                    const std::string& message);

}  // namespace ddp::etcd
