// Hostile clients of the store server, for `store_bench --attack` and the store
// attack test (tests/store_server/attack_test.cc), which includes this file
// by its relative path so that both run exactly the same attackers:
//
//   IdleConnections   many connections that never complete the handshake (half
//                     of them send the first half of a hello) and never read.
//   GarbageClient     one thread sending random bytes as fast as the server takes
//                     them, reconnecting whenever the server closes it.
//   PipeliningClient  one client that completes the handshake, stores one large
//                     value and then pipelines gets of it without ever reading
//                     a reply, so every reply piles up on the server.
//
// The raw clients build their frames with the wire codec (store/include/ddp/store/
// protocol.h), not by hand, so they follow the protocol as it changes. Every
// socket is closed by the destructors; the threads stop within tens of ms.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ddp/store/protocol.h"

namespace ddp::attack {

using Clock = std::chrono::steady_clock;

inline std::runtime_error sys_error(const std::string& what) {
  return std::runtime_error(what + ": " + std::strerror(errno));
}

// A blocking TCP connection to 127.0.0.1:port (close-on-exec); -1 with errno set
// when it fails.
inline int connect_loopback(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

// Sends all of `bytes` before `deadline` (the socket may be blocking or not);
// false when the peer closed the connection or time ran out.
inline bool send_all(int fd, std::string_view bytes, Clock::time_point deadline) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLOUT, 0};
    ::poll(&pfd, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 100)));
  }
  return true;
}

// Reads one frame's payload before `deadline`; throws std::runtime_error naming
// what went wrong (closed, timed out, bad frame).
inline std::string read_frame(int fd, Clock::time_point deadline) {
  protocol::FrameParser parser(~std::uint32_t{0});
  char buf[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) throw std::runtime_error("no reply from the server in time");
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 100))) <= 0) continue;
    // Bytes past the frame would be lost, which is fine here: the handshake
    // and the single set each have exactly one reply outstanding.
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) throw std::runtime_error("the server closed the connection");
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      throw sys_error("reading a reply");
    }
    std::string_view input(buf, static_cast<std::size_t>(n));
    switch (parser.consume(input)) {
      case protocol::FrameParser::State::kGood: return std::string(parser.payload());
      case protocol::FrameParser::State::kBad:
        throw std::runtime_error("bad reply frame: " + parser.error().message);
      case protocol::FrameParser::State::kNeedMore: break;
    }
  }
}

// The first frame of a well-behaved client: a hello with fresh random fields.
inline std::string hello_frame() {
  const std::string nonce = protocol::make_nonce();
  const std::string client_id = protocol::make_client_id();
  protocol::Request hello;
  hello.op = protocol::Op::kHello;
  hello.nonce = nonce;
  hello.client_id = client_id;
  std::string frame;
  protocol::encode_request(frame, hello);
  return frame;
}

// ---------------------------------------------------------------------------

class IdleConnections {
 public:
  IdleConnections() = default;
  ~IdleConnections() { close_all(); }
  IdleConnections(const IdleConnections&) = delete;
  IdleConnections& operator=(const IdleConnections&) = delete;

  // Opens `count` connections; every other one sends the first half of a hello
  // and stops there. Throws std::runtime_error naming the connection that failed.
  void open(std::uint16_t port, int count) {
    const std::string hello = hello_frame();
    for (int i = 0; i < count; ++i) {
      const int fd = connect_loopback(port);
      if (fd < 0) throw sys_error("idle connection " + std::to_string(i) + " of " + std::to_string(count));
      fds_.push_back(fd);
      if (i % 2 == 1) {
        send_all(fd, std::string_view(hello).substr(0, hello.size() / 2), Clock::now() + std::chrono::seconds(1));
      }
    }
  }

  std::size_t size() const { return fds_.size(); }

  // How many the server has closed (or reset) so far; looks without reading.
  std::size_t closed_by_server() const {
    std::vector<pollfd> pfds;
    for (int fd : fds_) pfds.push_back(pollfd{fd, POLLRDHUP, 0});
    if (pfds.empty() || ::poll(pfds.data(), pfds.size(), 0) < 0) return 0;
    return static_cast<std::size_t>(std::count_if(pfds.begin(), pfds.end(), [](const pollfd& p) {
      return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    }));
  }

  void close_all() {
    for (int fd : fds_) ::close(fd);
    fds_.clear();
  }

 private:
  std::vector<int> fds_;
};

// ---------------------------------------------------------------------------

class GarbageClient {
 public:
  // Starts at once; stops by itself after `max_connections` connections.
  GarbageClient(std::uint16_t port, std::size_t max_connections)
      : port_(port), max_connections_(max_connections) {
    std::mt19937_64 random(0x6172626167);  // fixed seed: the same garbage every run
    noise_.resize(1 << 16);
    for (auto& c : noise_) c = static_cast<char>(random());
    thread_ = std::thread([this] { loop(); });
  }
  ~GarbageClient() { stop(); }
  GarbageClient(const GarbageClient&) = delete;
  GarbageClient& operator=(const GarbageClient&) = delete;

  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

  std::size_t connections() const { return connections_.load(); }
  std::size_t failed_connects() const { return failed_connects_.load(); }
  std::uint64_t bytes_sent() const { return bytes_.load(); }

 private:
  void loop() {
    std::mt19937_64 random(42);
    while (!stop_.load() && connections_.load() < max_connections_) {
      const int fd = connect_loopback(port_);
      if (fd < 0) {
        // Refused or out of ports for a moment: try again, without spinning.
        failed_connects_.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      connections_.fetch_add(1);
      // Reset on close: no TIME_WAIT per connection, so a long run cannot use
      // up the loopback's ephemeral ports.
      linger reset{1, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
      while (!stop_.load()) {
        const std::size_t at = random() % (noise_.size() - 4096);
        const std::size_t len = 1 + random() % 4096;
        const ssize_t n = ::send(fd, noise_.data() + at, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
          bytes_.fetch_add(static_cast<std::uint64_t>(n));
          continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
          // The server is not reading (yet); see whether it closed us meanwhile.
          pollfd pfd{fd, POLLOUT | POLLRDHUP, 0};
          ::poll(&pfd, 1, 10);
          if ((pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) break;
          continue;
        }
        break;  // closed by the server: reconnect
      }
      ::close(fd);
    }
  }

  std::uint16_t port_;
  std::size_t max_connections_;
  std::string noise_;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> connections_{0};
  std::atomic<std::size_t> failed_connects_{0};
  std::atomic<std::uint64_t> bytes_{0};
  std::thread thread_;
};

// ---------------------------------------------------------------------------

class PipeliningClient {
 public:
  // Connects, completes the handshake and sets `key` to `value_bytes` bytes
  // (lowered to the server's max value size when that is smaller), then starts
  // pipelining gets of it from its own thread, never reading a reply: without
  // end, or `max_gets` of them (which bounds what a server without an output
  // limit can be made to queue: max_gets * value_bytes). Throws
  // std::runtime_error naming the step that failed.
  PipeliningClient(std::uint16_t port, std::size_t value_bytes, std::uint64_t max_gets = 0,
                   std::string key = "attack/big")
      : key_(std::move(key)), max_gets_(max_gets) {
    fd_ = connect_loopback(port);
    if (fd_ < 0) throw sys_error("pipelining client: connect");
    try {
      const auto deadline = Clock::now() + std::chrono::seconds(60);
      if (!send_all(fd_, hello_frame(), deadline)) throw std::runtime_error("sending the hello failed");
      const std::string hello_payload = read_frame(fd_, deadline);
      protocol::Reply hello;
      auto result = protocol::decode_reply(protocol::Op::kHello, hello_payload, hello);
      if (!result.ok() || hello.status != protocol::Status::kOk) {
        throw std::runtime_error("hello refused: " + (result.ok() ? std::string(hello.message) : result.message));
      }
      // Leave room for the frame's own fields under the limit.
      value_bytes_ = std::min<std::size_t>(value_bytes, hello.limits.max_value_size - 64);
      std::string frame;
      {
        const std::string value(value_bytes_, 'x');
        protocol::Request set;
        set.op = protocol::Op::kSet;
        set.key = key_;
        set.value = value;
        protocol::encode_request(frame, set);
      }
      if (!send_all(fd_, frame, deadline)) throw std::runtime_error("sending the large set failed");
      std::string().swap(frame);
      const std::string set_payload = read_frame(fd_, deadline);
      protocol::Reply set_reply;
      result = protocol::decode_reply(protocol::Op::kSet, set_payload, set_reply);
      if (!result.ok() || set_reply.status != protocol::Status::kOk) {
        throw std::runtime_error("the large set was refused: " +
                                 (result.ok() ? std::string(set_reply.message) : result.message));
      }
    } catch (const std::exception& e) {
      ::close(fd_);
      fd_ = -1;
      throw std::runtime_error(std::string("pipelining client: ") + e.what());
    }
    protocol::Request get;
    get.op = protocol::Op::kGet;
    get.key = key_;
    get.timeout_ms = 1000;
    protocol::encode_request(get_frame_, get);
    thread_ = std::thread([this] { loop(); });
  }
  ~PipeliningClient() { stop(); }
  PipeliningClient(const PipeliningClient&) = delete;
  PipeliningClient& operator=(const PipeliningClient&) = delete;

  // Safe from any thread, any number of times; the loop closes its socket
  // within tens of ms (a server that stops reading it cannot delay that).
  void abort() { stop_.store(true); }
  // abort() and wait for the thread.
  void stop() {
    abort();
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  std::size_t value_bytes() const { return value_bytes_; }
  std::uint64_t gets_sent() const { return bytes_sent_.load() / get_frame_.size(); }

 private:
  void loop() {
    // A batch of gets per send, as a client pipelining at full speed would.
    std::string batch;
    while (batch.size() < 64 * 1024) batch += get_frame_;
    const std::uint64_t max_bytes = max_gets_ * get_frame_.size();
    std::size_t at = 0;
    while (!stop_.load()) {
      std::size_t len = batch.size() - at;
      if (max_gets_ > 0) {
        const std::uint64_t sent = bytes_sent_.load();
        if (sent >= max_bytes) {
          // All sent: hold the connection open, unread, until stopped.
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          continue;
        }
        len = static_cast<std::size_t>(std::min<std::uint64_t>(len, max_bytes - sent));
      }
      const ssize_t n = ::send(fd_, batch.data() + at, len, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        bytes_sent_.fetch_add(static_cast<std::uint64_t>(n));
        at = (at + static_cast<std::size_t>(n)) % batch.size();
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        pollfd pfd{fd_, POLLOUT, 0};
        ::poll(&pfd, 1, 20);
        continue;
      }
      break;  // the server closed the connection
    }
    ::close(fd_);
    fd_ = -1;
  }

  std::string key_;
  std::uint64_t max_gets_;
  int fd_ = -1;
  std::size_t value_bytes_ = 0;
  std::string get_frame_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::thread thread_;
};

}  // namespace ddp::attack
