// One client connection of the store server (Asio's `connection`).
//
// Reads frames, runs the handshake, hands operations to the StoreHandler and
// writes the replies, batching every reply produced by one read into one write.
// The socket is non-blocking: a reply is written directly when the socket takes
// it (the common case), through async_write only for what does not fit, so no
// write completion has to be scheduled per request.
// A parked request keeps reading (to notice a disconnect) and buffers further
// frames until it completes, up to a bound past which the connection is
// closed; a client whose unread replies exceed the output limit is neither
// served nor read until it reads (its leaving fails the pending write). Each
// turn of the io_context thread serves a bounded amount of one connection's
// work (frames, keys); the rest waits for its next turn, and is not read
// further meanwhile.
// Buffers: read_buf_ is only resized in read(), when no read is pending and no
// frame being processed points into it; writing_buf_ is only touched by the
// write in flight and its completion. Errors close only this connection: an error reply is
// flushed, the write side shut down, and the rest of the input drained briefly (1 s,
// 64 KiB at most) so the reply is not lost to a reset. No handler throws: every one catches all.
// io_context thread only.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
// clang-format off
#include <utility>
#include <boost/asio.hpp>
// clang-format on

#include "ddp/store/protocol.h"
#include "store_handler.h"

namespace ddp::server {

namespace asio = boost::asio;
class Server;

class Session final : public std::enable_shared_from_this<Session>, public StoreHandler::Waiter {
 public:
  Session(asio::ip::tcp::socket socket, Server& server);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Starts serving (sets socket options, arms the handshake timer, reads).
  void start();
  // Answers `status` at once and closes (used for connections over max_clients).
  void reject(protocol::Status status, const std::string& message);
  // Server shutdown: flushes queued replies (parked requests were already
  // failed through on_wake) and closes.
  void stop();

  void on_wake(std::string_view reply) override;

 private:
  enum class State { kOpen, kClosing, kClosed };
  // start()'s work; throws when the connection cannot be set up.
  void begin_serving();
  using Clock = std::chrono::steady_clock;

  // Sets a flag for the lifetime of a scope (processing_).
  class Processing {
   public:
    explicit Processing(bool& flag) : flag_(flag) { flag_ = true; }
    ~Processing() { flag_ = false; }
    Processing(const Processing&) = delete;
    Processing& operator=(const Processing&) = delete;

   private:
    bool& flag_;
  };

  void read();
  // true while frames must not be processed: a request is parked, or the
  // client's unread replies exceed the output limit.
  bool input_paused() const;
  // The client's unread replies exceed the output limit.
  bool output_full() const;
  void on_read(const boost::system::error_code& ec, std::size_t n);
  void process(std::string_view input);
  void handle_frame(std::string_view payload);
  // Processes backlogged frames until none is left or the connection pauses
  // (a parked request, or output over the bound). Call inside Processing.
  void serve_backlog();
  // Serves the backlog (one turn's budget of it) and reads again, after a
  // pause ends or on the connection's next turn.
  void resume();
  // Posts resume() once (not re-entering the handler that calls it).
  void schedule_resume();
  // Input left over when the turn's budget ran out: served on a next turn.
  void schedule_turn();
  void flush();
  void on_write(const boost::system::error_code& ec);
  void arm_idle_timer();
  void on_idle_timer();
  void on_wait_timer(std::uint64_t generation);
  // Frees request_'s vectors after a request that named many keys.
  void release_large_request();
  // Queues an error reply and closes after it is written.
  void fail(protocol::Status status, const std::string& message);
  // Reports this connection's buffered input (an incomplete frame, the
  // backlog) to the server; fails the connection when every connection's
  // together would pass the server's bound.
  void account_input();
  void begin_close();
  void begin_linger();
  void close_now();
  // Takes the connection out of the server's count (once); one that had not
  // completed its handshake counts as a failed handshake.
  void uncount();
  void touch();

  Server& server_;
  asio::ip::tcp::socket socket_;
  asio::steady_timer idle_timer_;  // handshake/idle deadline, then the linger limit
  asio::steady_timer wait_timer_;  // timeout of the parked request
  std::vector<char> read_buf_;
  std::string backlog_;  // bytes received while a request was parked
  protocol::FrameParser parser_;
  std::optional<protocol::ServerHandshake> handshake_;
  protocol::Request request_;   // reused: keeps its vectors' capacity
  std::string client_id_;       // from the hello: the client across reconnections
  const std::uint64_t serial_;  // this connection among the server's (ClientRegistry)
  bool registered_ = false;     // counted as a connection of client_id_ in the registry
  std::string out_;             // replies waiting for the next write
  std::string writing_buf_;     // the write in flight
  Clock::time_point deadline_;  // handshake or idle deadline
  Clock::time_point armed_at_;  // when idle_timer_ fires
  std::uint64_t wait_generation_ = 0;
  std::size_t accounted_input_ = 0;  // counted in Server::account_input
  std::size_t turn_work_ = 0;        // frames and keys handled in this turn (kTurnBudget)
  std::size_t lingered_ = 0;         // bytes drained while closing (kMaxLingerBytes)
  State state_ = State::kOpen;
  bool counted_ = false;
  bool reading_ = false;
  bool processing_ = false;     // inside process(): read() must not start a read
  bool grow_read_buf_ = false;  // the last read filled read_buf_
  bool writing_ = false;
  bool parked_ = false;
  bool resume_posted_ = false;
};

}  // namespace ddp::server
