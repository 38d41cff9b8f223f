// One client connection of the status server: reads requests with Beast's
// parser (bounded by max_header_bytes and max_body_bytes), answers the ones
// the server answers itself (405, 400, 413, 431, 401), hands the others to the
// handler and writes the responses, one request at a time, in order.
//
// Time: idle_timeout to receive a complete request, from when the wait for it
// began (however the bytes dribble in); write_progress_timeout for each part
// of a response, from the last byte the client took (a slow reader that keeps
// reading is never cut off; one that stops is); and a short drain after an
// error response or a 401 (the rest of the client's input is read and
// dropped, at most kMaxDrainBytes, so that the response is not lost to a TCP
// reset) before the socket is closed.
// The registry learns of every change of phase: idle while waiting for a
// request, busy while answering one, closing while draining.
//
// Ownership: shared; every pending operation holds a reference, and so does
// the registry while the connection is open. Blocking: none. Thread-safety:
// the server's thread only. Errors: nothing thrown; every failure closes this
// connection only.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
// clang-format off
#include <utility>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
// clang-format on

#include "connection_registry.h"

namespace ddp::status_http {

class ServerState;
struct Response;

class Connection final : public std::enable_shared_from_this<Connection> {
 public:
  using Clock = std::chrono::steady_clock;
  using error_code = boost::system::error_code;

  Connection(boost::asio::ip::tcp::socket socket, ServerState& state);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Waits for the first request. The connection must be registered.
  void start();
  // Closes the socket now and leaves the registry (eviction, shutdown, the
  // end of the connection). Idempotent.
  void close();

  ConnectionRegistry::Slot& registry_slot() { return slot_; }

 private:
  enum class Phase { kReading, kWriting, kDraining };

  void wait_for_request();
  void on_header(const error_code& ec);
  void on_body(const error_code& ec);
  // The request could not be read: answers what needs an answer, or closes.
  void on_read_error(const error_code& ec);
  // The request is complete: checks it, asks the handler, sends the response.
  void answer_request();
  // Sends an answer of the server's own and closes after it.
  void refuse(Response response);
  void send(const Response& response, bool close_after);
  // Writes what the client has not taken yet, with a fresh progress deadline.
  void write_rest();
  void on_written(const error_code& ec, std::size_t bytes);
  void drain_then_close();
  void drain();
  void on_drained(const error_code& ec, std::size_t bytes);
  void arm_deadline(Clock::duration after);
  void on_deadline(const error_code& ec);
  // Runs one completion's work; an exception (out of memory, say) closes this
  // connection and is logged, never reaching the io_context.
  template <typename Step>
  void guarded(Step&& step);
  // Whether the request being read is a HEAD (known once its line is parsed).
  bool is_head() const;

  boost::asio::ip::tcp::socket socket_;
  boost::asio::steady_timer deadline_;
  ServerState& state_;
  ConnectionRegistry::Slot slot_;
  boost::beast::flat_buffer input_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  std::string output_;
  std::size_t written_ = 0;  // of output_
  std::vector<char> drain_buffer_;
  std::size_t drained_ = 0;
  Phase phase_ = Phase::kReading;
  bool close_after_write_ = false;
  bool closed_ = false;
};

}  // namespace ddp::status_http
