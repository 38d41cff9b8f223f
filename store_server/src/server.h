// The store server's core (Asio's HTTP server example shape): an acceptor, a
// SessionManager owning the connections, and one StoreHandler holding the data.
// Everything runs on one io_context thread; nothing here is thread-safe except
// stop(), which posts to that thread.
#pragma once

#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
// clang-format off
#include <utility>
#include <boost/asio.hpp>
// clang-format on

#include "client_registry.h"
#include "ddp/store/protocol.h"
#include "ddp/store_server/store_server.h"
#include "session_manager.h"
#include "store_handler.h"

namespace ddp::server {

namespace asio = boost::asio;

class Server {
 public:
  // Binds and listens; throws NetworkError naming the address when it cannot.
  explicit Server(const StoreServerOptions& options);
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Runs the io_context on the calling thread until the shutdown completes.
  void run();
  // Thread-safe: closes the acceptor, fails parked requests with a shutdown
  // error, flushes and closes every connection (forcefully after a grace period).
  void stop();

  std::uint16_t port() const { return port_; }
  const StoreServerOptions& options() const { return options_; }
  const protocol::Limits& limits() const { return limits_; }
  std::size_t num_clients() const { return sessions_.active(); }

  // The figures of StoreServerStats (io_context thread only).
  StoreServerStats stats() const;
  // A request the session is about to apply (io_context thread only).
  void count_operation(protocol::Op op) {
    const auto index = static_cast<std::size_t>(op);
    if (index < op_counts_.size()) ++op_counts_[index];
  }
  void count_failed_handshake() { ++failed_handshakes_; }

  // Moves one connection's buffered input from `before` to `after` bytes in
  // the server-wide total; false when growing it passed max_buffered_input()
  // (the total is updated either way). io_context thread only.
  bool account_input(std::size_t before, std::size_t after) {
    buffered_input_ = buffered_input_ - before + after;
    return after <= before || buffered_input_ <= max_buffered_input();
  }
  // Incomplete frames and backlogs of every connection together: twice the
  // largest frame, so that one maximal request always fits.
  std::uint64_t max_buffered_input() const { return 2ull * options_.max_frame_size; }

  // Serves an already connected socket as if it had been accepted (a socket
  // pair in the session fuzzer and tests); it keeps its own socket options
  // (accepted ones inherit the listener's: no delay, keepalive). io_context
  // thread only.
  void adopt(asio::ip::tcp::socket socket);

  // For sessions (io_context thread only).
  asio::io_context& io_context() { return io_; }
  StoreHandler& handler() { return handler_; }
  SessionManager& sessions() { return sessions_; }
  ClientRegistry& clients() { return clients_; }
  // A number for a new connection, never reused (ClientRegistry tells them apart).
  std::uint64_t next_session_serial() { return ++session_serials_; }
  // Whether a line about something a client caused (a connection closed for
  // an error, a failed handshake) may be logged: at most kClientLogBurst per
  // kClientLogWindow; the rest are counted and summed up in one line when the
  // next window opens, so that clients cannot flood the log (or the disk).
  bool may_log_client_event();
  static constexpr int kClientLogBurst = 20;
  static constexpr std::chrono::seconds kClientLogWindow{10};
  spdlog::logger& logger() { return *logger_; }
  bool stopping() const { return stopping_; }

 private:
  void accept();
  std::array<std::uint64_t, 256> op_counts_{};
  std::uint64_t connections_total_ = 0;
  std::uint64_t refused_total_ = 0;
  std::uint64_t failed_handshakes_ = 0;
  std::uint64_t accept_failures_ = 0;
  // accept4() every pending connection; sets accept_errno_ on a hard error.
  void accept_ready();
  // Accepting failed (out of descriptors and the like): counts it and logs,
  // the first time and then at most once per kAcceptLogWindow.
  void accept_failed(const std::string& reason);
  // What an accept failure means for the server, naming the limit it hit.
  std::string describe_accept_failure(const std::string& reason) const;
  // Accepting works again after failures: says so once.
  void accept_recovered();
  void shutdown();

  StoreServerOptions options_;
  protocol::Limits limits_;
  std::shared_ptr<spdlog::logger> logger_;
  asio::io_context io_{1};
  asio::ip::tcp::acceptor acceptor_;
  asio::steady_timer retry_timer_;
  asio::steady_timer stop_timer_;
  StoreHandler handler_;
  SessionManager sessions_;
  ClientRegistry clients_;
  std::uint16_t port_ = 0;
  bool stopping_ = false;                         // io_context thread
  asio::ip::tcp protocol_ = asio::ip::tcp::v4();  // of the listening socket
  int accept_errno_ = 0;       // of the failure in the last accept_ready(); 0: none
  int last_accept_errno_ = 0;  // of the failure being reported (describe_accept_failure)
  bool accept_failing_ = false;
  std::chrono::steady_clock::time_point accept_failing_since_{};
  std::chrono::steady_clock::time_point accept_logged_at_{};
  std::uint64_t accept_failures_unlogged_ = 0;
  std::uint64_t buffered_input_ = 0;
  std::uint64_t session_serials_ = 0;
  std::chrono::steady_clock::time_point client_log_window_{};
  int client_log_lines_ = 0;
  std::uint64_t client_log_suppressed_ = 0;
  std::atomic<bool> stop_requested_{false};
};

}  // namespace ddp::server
