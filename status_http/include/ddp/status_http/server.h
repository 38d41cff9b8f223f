// A small read-only HTTP/1.1 server for status endpoints (/metrics, /livez,
// /readyz, /status, the status page): Boost.Asio and Beast's request parser,
// one io_context thread, every connection bounded in time and size.
//
// What reaches the handler: only complete GET and HEAD requests whose target
// starts with '/' and, when a token is required, that carry it. The server
// answers everything else itself: another method 405 (with Allow: GET, HEAD),
// a malformed request 400, a request line and headers over max_header_bytes
// 431, a body over max_body_bytes 413 (each of these closes the connection), a
// missing or wrong token 401 with WWW-Authenticate and a one-line JSON body. A
// HEAD gets the headers the GET would get, without the body. Every response
// carries Content-Length, Cache-Control: no-store and X-Content-Type-Options:
// nosniff. Keep-alive follows HTTP/1.1 (Connection: close ends it); HTTP/1.0
// connections close after one response, and so does every 401. Pipelined
// requests are answered in order.
//
// The token: required iff options.token is non-empty and the host is not a
// loopback address (is_loopback). A client sends it as
// `Authorization: Bearer <token>` or as the query parameter `token=<token>`
// (percent-decoded; '+' is taken literally), so a browser can open
// /?token=... . It is compared in constant time.
//
// Connections: a connection is busy from the moment its request is complete
// until its response is written, and idle otherwise (also while a request is
// only partly received, so that slow clients cannot hold slots). At most
// max_connections are open. A new one arriving at the cap closes one to make
// room: a connection closing after an error response if there is one, else
// the connection that has been in its state longest, idle (waiting for a
// request: evicted_idle) or busy (its response not taken: evicted_busy), so
// that neither idle strangers nor clients that never read can lock out a
// scraper (a fresh connection is the last to go). A connection gets
// idle_timeout to deliver a complete request, counted from when the server
// started waiting for it (a client dribbling bytes gains nothing); then it is
// closed (timed_out). A response that makes no progress (no byte taken by the
// client) for write_progress_timeout closes its connection (stalled); a slow
// reader that keeps taking bytes may take as long as it needs. Connections
// that close after an error response (and a 401) are drained briefly first,
// so that the response is not lost to a TCP reset.
//
// Ownership: the Server owns its socket, its thread and its connections; the
// handler is copied in. Blocking: the constructor binds and listens (port()
// is valid at once) and never waits for a client; start() returns at once;
// stop() and the destructor wait for the thread. Thread-safety: stop(),
// port(), token_required(), connections() and counters() may be called from
// any thread; the handler runs on the server's thread only, one request at a
// time, and must not call stop() or destroy the server. Errors: the
// constructor throws InvalidArgument for unusable options and NetworkError
// naming host:port when it cannot listen. Nothing a client sends makes the
// server throw or stop: a handler that throws gets 500 (logged, rate-limited),
// and bad requests are logged at debug level only, rate-limited too. Logs go
// to spdlog's default logger (ddp::log::init sets it), prefixed with
// options.name.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddp::status_http {

struct Request {
  std::string method;  // "GET" or "HEAD"
  std::string target;  // as sent, e.g. "/metrics?x=1"
  std::string path;    // the target without its query: "/metrics"
  std::string query;   // what follows '?', raw (not decoded); empty when none
};

struct Response {
  // 200 to 599, but not 204 or 304 (every response has a Content-Length and a
  // body, possibly empty); anything else is answered 500 and logged.
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  // Extra headers. Names must be HTTP tokens, values free of CR, LF and NUL,
  // and none may be one the server writes itself (Content-Type,
  // Content-Length, Transfer-Encoding, Connection, Cache-Control,
  // X-Content-Type-Options): a response breaking this is answered 500.
  std::vector<std::pair<std::string, std::string>> headers;
};

// Called on the server's thread for every request that reaches it; it must be
// quick (it holds up every other client) and should not throw: an exception
// becomes a 500 and a log line.
using Handler = std::function<Response(const Request&)>;

struct ServerOptions {
  // The address to bind: an IPv4 or IPv6 literal or a name ("localhost").
  std::string host = "127.0.0.1";
  // 0 picks a free port; port() tells which.
  std::uint16_t port = 0;
  // See the top of the file: asked of clients only when `host` is not loopback.
  std::string token;
  // Open connections at most (at least 1).
  std::size_t max_connections = 64;
  // The request line and headers together (1 to 1 MiB); more: 431, closed.
  std::size_t max_header_bytes = 8 * 1024;
  // A GET or HEAD body larger than this (at most 16 MiB; a body is read and
  // ignored): 413, closed.
  std::size_t max_body_bytes = 1024;
  // For a complete request (positive).
  std::chrono::milliseconds idle_timeout = std::chrono::seconds(10);
  // A response of which the client takes no byte for this long closes its
  // connection (positive): a client that never reads holds a slot no longer.
  std::chrono::milliseconds write_progress_timeout = std::chrono::milliseconds(1500);
  // Names the server in log lines ("<name> server: ...").
  std::string name = "status";
};

class Server {
 public:
  // Binds and listens; serves nothing before start().
  Server(ServerOptions options, Handler handler);
  // Stops the server.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves on a thread of its own; returns at once. Does nothing when already
  // started or stopped.
  void start();
  // Closes the listening socket and every connection, and joins the thread.
  // Idempotent; once stopped, a server cannot be started again.
  void stop();

  std::uint16_t port() const;
  bool token_required() const;
  // Connections open now.
  std::size_t connections() const;

  // Counts since construction.
  struct Counters {
    std::uint64_t requests = 0;               // requests answered, with any status
    std::uint64_t rejected_unauthorized = 0;  // answered 401
    std::uint64_t rejected_bad_request = 0;   // answered 400, 405, 413 or 431
    std::uint64_t evicted_idle = 0;           // idle (or closing) connections closed to make room
    std::uint64_t evicted_busy = 0;           // busy connections closed to make room
    std::uint64_t timed_out = 0;              // connections closed by idle_timeout
    std::uint64_t stalled = 0;                // closed by write_progress_timeout
  };
  Counters counters() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether `host` names the loopback interface only: an address in
// 127.0.0.0/8 (also IPv4-mapped, ::ffff:127.x.y.z), ::1, or "localhost" (any
// case). "0.0.0.0", "::", every other address and every other name: false.
bool is_loopback(const std::string& host);

}  // namespace ddp::status_http
