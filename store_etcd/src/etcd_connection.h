// One HTTP/1.1 connection (Boost.Beast, plain or TLS) to one etcd endpoint,
// and what stops it from another thread.
//
//   Connection  owned by one thread at a time; every network operation runs
//               on the connection's own io_context for at most the given
//               deadline, and cancel() (from any thread) aborts whatever it is
//               doing. A unary POST reads the whole reply; a streaming one
//               (a watch) reads its chunked body a message (a line) at a time
//               (etcd_chunked.cc).
//   Interrupt   lets another thread stop a streaming call.
//
// Nothing an endpoint sends is trusted: a reply body, and each message of a
// stream, is at most max_reply_bytes, and a chunk header or trailer is
// bounded too; a reply that breaks this is BadReply.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "ddp/common/error.h"
#include "ddp/common/time.h"
#include "ddp/store_etcd/etcd_store.h"

namespace boost::asio::ssl {
class context;
}

namespace ddp::etcd {

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

// The server's certificate did not verify: final, not retried.
class CertificateError : public AuthError {
 public:
  explicit CertificateError(const std::string& message) : AuthError("", message) {}
};

struct HttpReply {
  int status = 0;
  std::string body;
};

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

}  // namespace ddp::etcd
