// The store server: Boost.Asio, event-driven, one io_context thread.
//
// A blocked get/wait costs no thread (it is a parked request woken by the
// write that completes it). A client that disconnects while waiting is cleaned
// up. A malformed or oversized frame gets an error reply and its connection
// closed; every other client goes on. Idle connections (no complete frame
// within idle_timeout) are closed. stop() closes the acceptor, fails pending
// waits with a shutdown error, closes every connection and joins the thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "ddp/store/store_limits.h"

namespace ddp {

struct StoreServerOptions {
  // Address to bind; "0.0.0.0" or "::" for all interfaces.
  std::string host = "127.0.0.1";
  // 0 picks a free port; port() tells which.
  std::uint16_t port = 0;
  // Shared secret; when non-empty every client must pass the HMAC challenge.
  std::string token;
  // Connections beyond this are accepted and closed at once with an error reply.
  // Lowered at start to what the open-file limit allows (the soft limit is
  // first raised to the hard one); the log says so.
  std::size_t max_clients = 65536;
  // A connection that sends no complete frame for this long is closed
  // (a client blocked in get/wait is not idle). Zero disables the idle timeout.
  std::chrono::milliseconds idle_timeout = std::chrono::minutes(30);
  // Limits enforced on every request.
  std::uint32_t max_key_size = store_limits::kMaxKeySize;
  std::uint32_t max_value_size = store_limits::kMaxValueSize;
  // Also the largest reply (a multi_get over large values gets `reply too large`).
  std::uint32_t max_frame_size = store_limits::kMaxFrameSize;
  // Keys plus values (plus 64 bytes per key) the store may hold in all; a write
  // that would pass it gets `store full` and changes nothing. A value grown by
  // append is bounded by max_value_size.
  std::uint64_t max_store_bytes = store_limits::kMaxStoreBytes;
  // A client that sends requests without reading its replies is paused (its
  // requests are neither processed nor read) once this much output waits for
  // it, and served again as it reads; one reply may overshoot the bound.
  std::size_t max_pending_output = 16 * 1024 * 1024;
  // A connection must complete the hello (and auth) step within this long.
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(10);
  // The retry record (store/PROTOCOL.md, "Retries"): what the server remembers
  // of a client whose connections all closed is kept this long, for at most
  // this many such clients (the oldest is forgotten first). A client with an
  // open connection is always remembered. A retry of a forgotten client is
  // refused (`stale request`), never applied twice.
  std::chrono::milliseconds retry_record_window = std::chrono::minutes(10);
  std::size_t retry_record_clients = 16384;
};

// What the server holds and did, as its io_context thread saw it at one moment.
struct StoreServerStats {
  std::size_t clients = 0;              // open connections
  std::uint64_t connections_total = 0;  // accepted since start
  std::uint64_t refused_total = 0;      // closed at once: max_clients reached
  std::uint64_t failed_handshakes = 0;  // closed before the hello (and auth) completed
  // Attempts to accept that failed (out of file descriptors and the like);
  // the server retries every 100 ms meanwhile, and logs why.
  std::uint64_t accept_failures = 0;
  std::size_t keys = 0;
  std::uint64_t stored_bytes = 0;   // counted against max_store_bytes
  std::size_t parked_requests = 0;  // get/wait blocked on a missing key
  // Requests after the handshake, by operation ("set", "get", ...).
  std::map<std::string, std::uint64_t> operations;
};

class StoreServer {
 public:
  // Binds and listens at once (so port() is valid when the constructor returns).
  // Throws NetworkError naming the address when it cannot bind.
  explicit StoreServer(const StoreServerOptions& options);
  // Stops the server when it is running.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Serves on a background thread; returns at once.
  void start();
  // Serves on the calling thread until stop() is called (from another thread or
  // a signal handler installed by the caller through the io_context).
  void run();
  // Closes the acceptor, fails pending waits, closes connections, joins the
  // background thread. Idempotent and thread-safe.
  void stop();

  std::uint16_t port() const;
  const StoreServerOptions& options() const;
  // Number of open client connections (for tests and the daemon's logs).
  std::size_t num_clients() const;
  // Asks the serving thread for its figures and waits at most `wait` for
  // them (thread-safe). Throws TimeoutError when that thread does not answer
  // in time (it is stuck, or the server is not serving).
  StoreServerStats stats(std::chrono::milliseconds wait) const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
