// Test helpers shared by the store server's test programs: a raw protocol
// client that speaks the wire protocol by hand (to misbehave on purpose),
// small helpers to start a server and connect TcpStore clients, and a relay
// that loses replies (DroppingProxy).
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ddp/store/protocol.h"
#include "ddp/store/tcp_store.h"
#include "ddp/store_server/store_server.h"
#include "net_util.h"

namespace ddp::test {

using namespace std::chrono_literals;
using protocol::Op;
using protocol::Request;
using protocol::Status;
using Clock = std::chrono::steady_clock;

// ---- a raw protocol client ------------------------------------------------------------

class RawClient {
 public:
  explicit RawClient(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ADD_FAILURE() << "connect: " << std::strerror(errno);
    }
  }
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  void send_bytes(std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return;  // the server may have closed already; reads will tell
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  void send(const Request& q) {
    std::string out;
    protocol::encode_request(out, q);
    send_bytes(out);
  }

  // The next reply frame's payload, or nullopt on EOF/reset/timeout.
  std::optional<std::string> read_payload(std::chrono::milliseconds timeout = 5s) {
    auto deadline = Clock::now() + timeout;
    protocol::FrameParser parser(1u << 30);
    while (true) {
      if (!pending_.empty()) {
        std::string_view input = pending_;
        auto state = parser.consume(input);
        std::string payload(parser.payload());
        pending_ = std::string(input);
        if (state == protocol::FrameParser::State::kGood) return payload;
        if (state == protocol::FrameParser::State::kBad) return std::nullopt;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left <= 0ms) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return std::nullopt;
      pending_.append(buf, static_cast<std::size_t>(n));
    }
  }

  protocol::Reply read_reply(Op op) {
    auto payload = read_payload();
    protocol::Reply reply;
    if (!payload) {
      ADD_FAILURE() << "no reply to " << protocol::to_string(op);
      reply.status = Status::kInternal;
      return reply;
    }
    payload_ = *payload;
    auto result = protocol::decode_reply(op, payload_, reply);
    EXPECT_TRUE(result.ok()) << result.message;
    return reply;
  }

  // Hello (and auth with `token` when the server asks).
  void handshake(const std::string& token = "") {
    Request hello;
    hello.op = Op::kHello;
    const std::string client_nonce = protocol::make_nonce();
    hello.nonce = client_nonce;
    send(hello);
    auto reply = read_reply(Op::kHello);
    ASSERT_EQ(reply.status, Status::kOk) << reply.message;
    if (!reply.nonce.empty()) {
      EXPECT_TRUE(protocol::verify_auth(protocol::Direction::kServer, token, client_nonce,
                                        reply.nonce, reply.server_mac))
          << "the server's proof does not verify";
      Request auth;
      auth.op = Op::kAuth;
      auto mac = protocol::auth_mac(protocol::Direction::kClient, token, client_nonce, reply.nonce);
      auth.mac = mac;
      send(auth);
      ASSERT_EQ(read_reply(Op::kAuth).status, Status::kOk);
    }
  }

  // true when the server closed the connection within `timeout`.
  bool closed_by_server(std::chrono::milliseconds timeout = 3s) {
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;
    }
    return false;
  }

  // Reads the error reply the server sends before closing, and checks the close.
  void expect_error_and_close(Status status, Op op = Op::kNumKeys) {
    auto reply = read_reply(op);
    EXPECT_EQ(reply.status, status)
        << "got " << protocol::to_string(reply.status) << ": " << reply.message;
    EXPECT_FALSE(reply.message.empty());
    EXPECT_TRUE(closed_by_server()) << "connection left open after " << protocol::to_string(status);
  }

 private:
  int fd_ = -1;
  std::string pending_;
  std::string payload_;
};

inline Request op_request(Op op) {
  Request q;
  q.op = op;
  return q;
}

inline std::unique_ptr<StoreServer> start_server(StoreServerOptions options = {}) {
  options.host = "127.0.0.1";
  options.port = 0;
  auto server = std::make_unique<StoreServer>(options);
  server->start();
  return server;
}

inline TcpStoreOptions client_options(std::uint16_t port, const std::string& token = "") {
  TcpStoreOptions options;
  options.port = port;
  options.token = token;
  options.connect_timeout = 2s;
  options.timeout = 5s;
  return options;
}

// Waits until `predicate` holds, at most `timeout`.
template <typename Predicate>
bool eventually(Predicate predicate, std::chrono::milliseconds timeout = 3s) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return predicate();
}

// A client that keeps working while another one misbehaves.
inline void expect_still_serving(std::uint16_t port, const std::string& token = "") {
  TcpStore store(client_options(port, token));
  store.set("still", "serving");
  EXPECT_EQ(store.get("still"), "serving");
}

// A TCP relay between a client and the server that can drop both connections
// after it forwarded a request but before the reply reaches the client: the
// server applied the request, the client never learns it. With hold_after_drop(),
// the client's reconnection then waits until release(), so that a test can
// act between the lost reply and the retry.
class DroppingProxy {
 public:
  explicit DroppingProxy(std::uint16_t server_port) : server_port_(server_port) {
    listen_fd_ = listen_loopback(port_);
    thread_ = std::thread([this] { serve(); });
  }
  ~DroppingProxy() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
      released_.notify_all();
    }
    ::shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    ::close(listen_fd_);
  }

  std::uint16_t port() const { return port_; }
  // The next client frame that starts with opcode `op` is forwarded, and its
  // reply swallowed together with both connections.
  void drop_reply_of(Op op) { drop_op_ = static_cast<int>(op); }
  int drops() const { return drops_; }
  void hold_after_drop() {
    std::lock_guard lock(mutex_);
    hold_ = true;
  }
  void release() {
    std::lock_guard lock(mutex_);
    hold_ = false;
    released_.notify_all();
  }

 private:
  void serve() {
    while (!stop_) {
      int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) return;
      if (drops_ > 0) {
        std::unique_lock lock(mutex_);
        released_.wait(lock, [&] { return !hold_ || stop_; });
      }
      int upstream = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(server_port_);
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(upstream, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        ::close(client);
        ::close(upstream);
        continue;
      }
      relay(client, upstream);
      ::close(client);
      ::close(upstream);
    }
  }

  // One connection at a time (the client makes one at a time).
  void relay(int client, int upstream) {
    bool dropping = false;
    char buf[65536];
    while (!stop_) {
      pollfd fds[2] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}};
      if (::poll(fds, 2, 100) <= 0) continue;
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t n = ::recv(client, buf, sizeof(buf), 0);
        if (n <= 0) return;
        if (drop_op_ >= 0 && n > 4 && static_cast<unsigned char>(buf[4]) == drop_op_) {
          drop_op_ = -1;
          dropping = true;
        }
        ::send(upstream, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL);
      }
      if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t n = ::recv(upstream, buf, sizeof(buf), 0);
        if (n <= 0) return;
        if (dropping) {  // the server applied it; the client never hears
          ++drops_;
          return;
        }
        ::send(client, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL);
      }
    }
  }

  std::uint16_t server_port_;
  std::uint16_t port_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> drop_op_{-1};
  std::atomic<int> drops_{0};
  std::mutex mutex_;
  std::condition_variable released_;
  bool hold_ = false;  // guarded by mutex_
  std::thread thread_;
};

}  // namespace ddp::test
