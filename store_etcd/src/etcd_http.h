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
// Throws ProtocolError when `text` is not base64.
std::string base64_decode(std::string_view text);
// An int64 field of etcd's JSON ("123" or 123); 0 when missing.
std::int64_t json_int(const Json& object, const char* field);
// A bytes field (base64) decoded; "" when missing.
std::string json_bytes(const Json& object, const char* field);
// etcd's GetPrefixRangeEnd: the prefix with its last byte below 0xff
// incremented ("\0" for an empty prefix or all 0xff: every key).
std::string prefix_range_end(const std::string& prefix);
// "host:port" ("[v6]:port").
std::string endpoint_text(const EtcdEndpoint& endpoint);
// "2 s", "0.25 s".
std::string seconds_text(Duration duration);

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

// What etcd said in an error reply ({"error","message","code"}) that is not
// "try again". Errors thrown for such replies are ReplyError<Base>: catch
// the ddp error (InvalidArgument, AuthError, ProtocolError) and
// dynamic_cast to ReplyInfo for the details.
class ReplyInfo {
 public:
  ReplyInfo(int code, std::string etcd_message) : code_(code), etcd_message_(std::move(etcd_message)) {}
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
inline const ReplyInfo* reply_info(const Error& error) { return dynamic_cast<const ReplyInfo*>(&error); }

struct HttpReply {
  int status = 0;
  std::string body;
};

class Connection {
 public:
  Connection(EtcdEndpoint endpoint, boost::asio::ssl::context* tls);
  ~Connection();
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
  // POSTs and reads the reply's header only (a streaming reply follows);
  // returns the HTTP status.
  int post_stream(const std::string& target, const std::string& body, const std::string& token,
                  const Deadline& deadline, const Deadline* first_byte = nullptr);
  // The next newline-terminated message of a streaming reply; std::nullopt
  // when the deadline passed first. Throws ConnectionFailed when the stream
  // broke or ended.
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
  // Throws InvalidArgument for unusable options (no endpoints, unreadable
  // TLS files).
  explicit Transport(EtcdStoreOptions options);
  ~Transport();

  const EtcdStoreOptions& options() const { return options_; }
  std::string endpoints_text() const;

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
  std::unique_ptr<Connection> open_stream(const std::string& origin, const std::string& path,
                                          const Json& body, const Deadline& deadline,
                                          std::optional<Clock::time_point>& failing_since,
                                          Interrupt* interrupt);

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
  // Called from a catch block after a unary attempt on `endpoint` failed: a
  // broken connection marks the endpoint failed (false: retry after backoff),
  // an expired token is dropped (true: retry at once, at most kMaxReauth
  // times); anything else is rethrown (a bad certificate as AuthError).
  bool after_failed_attempt(const std::string& origin, const EtcdEndpoint& endpoint, int& reauths);
  // Throws ConnectionFailed when `reply` comes from another cluster than the first reply did.
  void check_cluster(const Json& reply, const std::string& where);
  std::string token();
  EtcdEndpoint current_endpoint();
  void rotate_from(std::size_t index);
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
