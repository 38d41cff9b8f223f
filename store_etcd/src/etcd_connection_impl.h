// The state of a Connection (etcd_connection.h), shared by its two source
// files: etcd_connection.cc (connecting, TLS, cancelling) and etcd_chunked.cc
// (requests, and replies read whole or a line at a time). Private to them.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "etcd_connection.h"

namespace ddp::etcd {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

// What a connection buffers before the parser takes it (a read's worth).
constexpr std::size_t kMaxUnparsed = 64 * 1024;

struct Connection::Impl {
  asio::io_context ioc;
  ssl::context* tls = nullptr;
  std::unique_ptr<beast::tcp_stream> plain;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> secure;
  // Bytes read but not parsed yet. Bounded: Beast limits the header and the
  // body, not a chunk header or a trailer, which a peer could make endless.
  beast::flat_buffer buffer{kMaxUnparsed};
  std::optional<http::response_parser<http::string_body>> parser;
  std::size_t scanned = 0;  // bytes of the stream's body searched for '\n'
  int requests = 0;
  std::size_t max_reply_bytes = 0;
  std::atomic<bool> cancelled{false};

  bool has_stream() const { return plain || secure; }
  beast::tcp_stream& lowest() { return secure ? beast::get_lowest_layer(*secure) : *plain; }

  template <typename F>
  void with_stream(F&& f) {
    if (secure) {
      f(*secure);
    } else {
      f(*plain);
    }
  }

  void abort_socket() {
    if (!has_stream()) return;
    error_code ec;
    lowest().socket().cancel(ec);
    lowest().socket().close(ec);
  }

  // Cancels what is pending on the socket, which stays open.
  void cancel_socket() {
    if (!has_stream()) return;
    error_code ec;
    lowest().socket().cancel(ec);
  }

  // Starts an asynchronous operation (start(handler)) and runs the io_context
  // until it completes or the deadline passes; then abort() and timed_out,
  // unless `keep` (abort() only cancelled it) and it completed after all.
  template <typename Start, typename Abort>
  error_code run(const Deadline& deadline, Start&& start, Abort&& abort, bool keep = false) {
    if (cancelled) return asio::error::operation_aborted;
    std::optional<error_code> result;
    start([&result](error_code ec, auto&&...) { result = ec; });
    ioc.restart();
    while (!result) {
      Duration left = deadline.remaining();
      if (left <= Duration(0)) break;
      ioc.run_for(std::min<Duration>(left, std::chrono::hours(1)));
      if (ioc.stopped()) ioc.restart();
    }
    if (!result) {
      // Abort until the operation has completed: a composed read (Beast's)
      // may start a new socket read from its completion handler after a
      // partial chunk header, which the first cancel never reached.
      while (!result) {
        abort();
        ioc.restart();
        ioc.run_one();
      }
      ioc.restart();
      ioc.poll();
      if (keep && !*result) return *result;
      return asio::error::timed_out;
    }
    return *result;
  }

  template <typename Start>
  error_code run(const Deadline& deadline, Start&& start) {
    return run(deadline, std::forward<Start>(start), [this] { abort_socket(); });
  }

  void reset() {
    abort_socket();
    plain.reset();
    secure.reset();
    buffer.clear();
    parser.reset();
    scanned = 0;
  }
};

// A failure of a network operation, in words ("connection closed", "no reply in time").
std::string failure_text(const error_code& ec, const Deadline& deadline);

// A failed read of a reply: the peer sent something that is not an HTTP reply
// within the limits (BadReply), or the connection broke (ConnectionFailed).
[[noreturn]] void throw_read_failure(const error_code& ec, const Deadline& deadline,
                                     const std::string& where, std::size_t limit,
                                     bool stale = false);

}  // namespace ddp::etcd
