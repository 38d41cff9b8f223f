// Hostile clients of the store server, for the store attack test
// (tests/store_server/attack_test.cc) and `store_bench --attack`, so that both
// run exactly the same attackers:
//
//   IdleConnections   many connections that never complete the handshake (half
//                     of them send the first half of a hello) and never read.
//   GarbageClient     one thread sending random bytes as fast as the server takes
//                     them, reconnecting whenever the server closes it.
//   PipeliningClient  one client that completes the handshake, stores one large
//                     value and then pipelines gets of it without ever reading
//                     a reply, so every reply piles up on the server.
//   ParkedFlood       one thread that, again and again, connects, completes the
//                     handshake, parks a get of a key that never exists (no
//                     timeout), sends 1.5 MiB more behind it and closes: the
//                     server must still see each of those clients leave (it
//                     once stopped reading past 1 MiB of backlog, so it never
//                     saw the EOF and kept every such session).
//   EmptyKeyAmplifier one client sending waits and multi_gets of many empty
//                     keys (4 bytes each on the wire, a lookup and a view each
//                     on the server) with timeout 0: 8 million of them (32 MiB,
//                     refused by count) and exactly kMaxKeysPerRequest (a
//                     timeout), reading each reply and timing it.
//
// The raw clients build their frames with the wire codec (store/include/ddp/store/
// protocol.h), not by hand, so they follow the protocol as it changes; the one
// exception, EmptyKeyAmplifier's frames of millions of keys, is checked against
// the codec's encoding of a small one. Every socket is closed by the
// destructors; the threads stop within tens of ms.
//
// Ownership: each attacker owns its sockets and threads (not copyable).
// Blocking: the constructors connect (and some hand-shake) at once; the
// attacks run on threads of their own until stop() or the destructor.
// Thread-safety: an attacker's counters may be read from any thread; one
// thread starts and stops it. Errors: the constructors and open() throw
// std::runtime_error when they cannot connect or hand-shake; what goes wrong
// during an attack is counted (its first error kept, where the attacker has a
// first_error()), not thrown.
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
#include "net_util.h"
#include "sys_error.h"

namespace ddp::test::attack {

using Clock = std::chrono::steady_clock;

// Sends all of `bytes` before `deadline` (the socket may be blocking or not);
// false when the peer closed the connection, time ran out or `*stop` was set
// (looked at every 10 ms while the socket is full).
inline bool send_all(int fd, std::string_view bytes, Clock::time_point deadline,
                     const std::atomic<bool>* stop = nullptr) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (stop != nullptr && stop->load()) return false;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLOUT, 0};
    ::poll(&pfd, 1,
           static_cast<int>(std::min<std::int64_t>(left.count(), stop != nullptr ? 10 : 100)));
  }
  return true;
}

// Reads one frame's payload before `deadline`; throws std::runtime_error naming
// what went wrong (closed, timed out, bad frame, `*stop` set: looked at every
// 10 ms).
inline std::string read_frame(int fd, Clock::time_point deadline,
                              const std::atomic<bool>* stop = nullptr) {
  protocol::FrameParser parser(~std::uint32_t{0});
  char buf[4096];
  while (true) {
    if (stop != nullptr && stop->load()) throw std::runtime_error("stopped");
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) throw std::runtime_error("no reply from the server in time");
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1,
               static_cast<int>(
                   std::min<std::int64_t>(left.count(), stop != nullptr ? 10 : 100))) <= 0) {
      continue;
    }
    // Bytes past the frame would be lost, which is fine here: every caller has
    // exactly one reply outstanding.
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) throw std::runtime_error("the server closed the connection");
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      throw sys_error("reading a reply");
    }
    std::string_view input(buf, static_cast<std::size_t>(n));
    switch (parser.consume(input)) {
      case protocol::FrameParser::State::kGood:
        return std::string(parser.payload());
      case protocol::FrameParser::State::kBad:
        throw std::runtime_error("bad reply frame: " + parser.error().message);
      case protocol::FrameParser::State::kNeedMore:
        break;
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

// Sends a hello with a fresh client id and reads the reply; returns the
// server's limits. Throws std::runtime_error when it fails or is refused (a
// server asking for auth is refused too: the attackers know no token).
inline protocol::Limits handshake(int fd, Clock::time_point deadline,
                                  const std::atomic<bool>* stop = nullptr) {
  if (!send_all(fd, hello_frame(), deadline, stop))
    throw std::runtime_error("sending the hello failed");
  const std::string payload = read_frame(fd, deadline, stop);
  protocol::Reply hello;
  const auto result = protocol::decode_reply(protocol::Op::kHello, payload, hello);
  if (!result.ok() || hello.status != protocol::Status::kOk) {
    throw std::runtime_error("hello refused: " +
                             (result.ok() ? std::string(hello.message) : result.message));
  }
  if (!hello.nonce.empty()) throw std::runtime_error("the server asks for a token");
  return hello.limits;
}

// Keeps the largest value stored into `max`.
inline void store_max(std::atomic<std::int64_t>& max, std::int64_t value) {
  std::int64_t seen = max.load();
  while (value > seen && !max.compare_exchange_weak(seen, value)) {
  }
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
      if (fd < 0)
        throw sys_error("idle connection " + std::to_string(i) + " of " + std::to_string(count));
      fds_.push_back(fd);
      if (i % 2 == 1) {
        send_all(fd, std::string_view(hello).substr(0, hello.size() / 2),
                 Clock::now() + std::chrono::seconds(1));
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
      const protocol::Limits limits = handshake(fd_, deadline);
      // Leave room for the frame's own fields under the limit.
      value_bytes_ = std::min<std::size_t>(value_bytes, limits.max_value_size - 64);
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
      const auto result = protocol::decode_reply(protocol::Op::kSet, set_payload, set_reply);
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

// ---------------------------------------------------------------------------

class ParkedFlood {
 public:
  // Starts at once: cycles of connect, handshake (a fresh client id each),
  // a get of `key` with no timeout (parked: the key is never set), then
  // `flood_bytes` more bytes behind it (past the server's 1 MiB bound on what
  // a parked connection may buffer), then close. Stops by itself after
  // `max_cycles` cycles (0: none).
  explicit ParkedFlood(std::uint16_t port, std::size_t flood_bytes = 1536 * 1024,
                       std::uint64_t max_cycles = 0, std::string key = "attack/never-set")
      : port_(port), max_cycles_(max_cycles) {
    protocol::Request get;
    get.op = protocol::Op::kGet;
    get.key = key;
    get.timeout_ms = protocol::kNoTimeout;
    protocol::encode_request(get_and_flood_, get);
    // The bytes behind the get are never parsed by a server that keeps its
    // bound ('x' as a length prefix would be a 2 GiB frame).
    get_and_flood_.append(flood_bytes, 'x');
    thread_ = std::thread([this] { loop(); });
  }
  ~ParkedFlood() { stop(); }
  ParkedFlood(const ParkedFlood&) = delete;
  ParkedFlood& operator=(const ParkedFlood&) = delete;

  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

  // Cycles that got as far as closing a parked, flooded connection.
  std::uint64_t cycles() const { return cycles_.load(); }
  // Of those, the ones the server closed before all the flood was sent (it
  // refused the backlog with `store full` and closed first).
  std::uint64_t cut_short() const { return cut_short_.load(); }
  // Connections refused, and handshakes that failed (the server busy past the
  // deadline, or closing the connection).
  std::uint64_t failed_connects() const { return failed_connects_.load(); }
  std::uint64_t failed_handshakes() const { return failed_handshakes_.load(); }
  // The first handshake failure's message (for a report); empty when none.
  std::string first_error() const {
    std::lock_guard lock(mutex_);
    return first_error_;
  }

 private:
  void loop() {
    while (!stop_.load() && (max_cycles_ == 0 || cycles_.load() < max_cycles_)) {
      const int fd = connect_loopback(port_);
      if (fd < 0) {
        failed_connects_.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      const auto deadline = Clock::now() + std::chrono::seconds(30);
      try {
        handshake(fd, deadline, &stop_);
        const bool all_sent = send_all(fd, get_and_flood_, deadline, &stop_);
        if (!stop_.load()) {
          if (!all_sent) cut_short_.fetch_add(1);
          cycles_.fetch_add(1);
        }
      } catch (const std::exception& e) {
        if (!stop_.load()) {
          failed_handshakes_.fetch_add(1);
          std::lock_guard lock(mutex_);
          if (first_error_.empty()) first_error_ = e.what();
        }
      }
      // A plain close: a FIN behind the flood (or a reset when the server's
      // `store full` reply arrived unread), never an orderly goodbye.
      ::close(fd);
    }
  }

  std::uint16_t port_;
  std::uint64_t max_cycles_;
  std::string get_and_flood_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> cycles_{0};
  std::atomic<std::uint64_t> cut_short_{0};
  std::atomic<std::uint64_t> failed_connects_{0};
  std::atomic<std::uint64_t> failed_handshakes_{0};
  mutable std::mutex mutex_;
  std::string first_error_;  // guarded by mutex_
  std::thread thread_;
};

// ---------------------------------------------------------------------------

// A wait or multi_get frame of `count` empty keys and timeout `timeout_ms`,
// encoded by hand: the codec would need a view per key (millions of them).
// The layout is checked against the codec by EmptyKeyAmplifier.
inline std::string empty_keys_frame(protocol::Op op, std::uint32_t count,
                                    std::uint64_t timeout_ms) {
  const std::uint64_t payload_size = 1 + 8 + 4 + std::uint64_t{count} * 4;
  if (payload_size > ~std::uint32_t{0})
    throw std::invalid_argument("empty_keys_frame: too many keys");
  std::string frame;
  frame.reserve(4 + static_cast<std::size_t>(payload_size));
  const auto put = [&frame](std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) frame.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  };
  put(payload_size, 4);
  frame.push_back(static_cast<char>(op));
  put(timeout_ms, 8);
  put(count, 4);
  frame.append(static_cast<std::size_t>(count) * 4, '\0');  // each key: length 0
  return frame;
}

class EmptyKeyAmplifier {
 public:
  // Starts at once. One connection (reconnected when the server closes it)
  // sends, one at a time, reading each reply: a wait of `many_keys` empty keys
  // (over kMaxKeysPerRequest: refused from its first bytes with `invalid
  // argument` and the connection closed, so it connects again), a multi_get of
  // exactly kMaxKeysPerRequest (`timeout` expected, the connection kept), then
  // the same with the operations swapped, and so on, all with timeout 0;
  // without end, or until `max_requests` were answered (then it closes its
  // connection). Throws std::logic_error when the hand-built frames no longer
  // match the codec.
  explicit EmptyKeyAmplifier(std::uint16_t port, std::uint32_t many_keys = 8u << 20,
                             std::uint64_t max_requests = 0)
      : port_(port), max_requests_(max_requests) {
    for (protocol::Op op : {protocol::Op::kWait, protocol::Op::kMultiGet}) {
      protocol::Request q;
      q.op = op;
      q.timeout_ms = 0;
      q.keys.assign(3, std::string_view());
      std::string encoded;
      protocol::encode_request(encoded, q);
      if (encoded != empty_keys_frame(op, 3, 0)) {
        throw std::logic_error("empty_keys_frame no longer matches the wire codec's " +
                               std::string(protocol::to_string(op)));
      }
    }
    many_ = empty_keys_frame(protocol::Op::kWait, many_keys, 0);
    limit_ = empty_keys_frame(protocol::Op::kWait, protocol::kMaxKeysPerRequest, 0);
    thread_ = std::thread([this] { loop(); });
  }
  ~EmptyKeyAmplifier() { stop(); }
  EmptyKeyAmplifier(const EmptyKeyAmplifier&) = delete;
  EmptyKeyAmplifier& operator=(const EmptyKeyAmplifier&) = delete;

  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

  std::size_t many_bytes() const { return many_.size(); }
  // Replies read with the expected status (`invalid argument` for the long
  // lists, or their connection closed by the server before the whole frame
  // was sent: the reply may be lost to the reset; `timeout` for the ones of
  // exactly the limit), and the others.
  std::uint64_t refused() const { return refused_.load(); }
  std::uint64_t timed_out() const { return timed_out_.load(); }
  std::uint64_t answered() const { return refused() + timed_out(); }
  std::uint64_t unexpected() const { return unexpected_.load(); }
  // Connections that ended in the middle of a request (closed by the server,
  // or no reply within 30 s), and connects or handshakes that failed.
  std::uint64_t lost() const { return lost_.load(); }
  // The longest time from the first byte of a request sent to its reply
  // read, for each kind of request (the 32 MiB ones include their transfer).
  double worst_many_ms() const { return static_cast<double>(worst_many_ns_.load()) / 1e6; }
  double worst_limit_ms() const { return static_cast<double>(worst_limit_ns_.load()) / 1e6; }
  // The first unexpected reply or failure, for a report; empty when none.
  std::string first_error() const {
    std::lock_guard lock(mutex_);
    return first_error_;
  }

 private:
  void note(const std::string& what) {
    std::lock_guard lock(mutex_);
    // Short: a server that lists every missing key would make it megabytes.
    if (first_error_.empty())
      first_error_ = what.size() <= 300 ? what : what.substr(0, 300) + "...";
  }

  void loop() {
    int fd = -1;
    for (std::uint64_t i = 0; !stop_.load() && (max_requests_ == 0 || i < max_requests_);) {
      if (fd < 0) {
        fd = connect_loopback(port_);
        if (fd < 0) {
          lost_.fetch_add(1);
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
        try {
          handshake(fd, Clock::now() + std::chrono::seconds(30), &stop_);
        } catch (const std::exception& e) {
          if (!stop_.load()) {
            lost_.fetch_add(1);
            note(std::string("handshake: ") + e.what());
          }
          ::close(fd);
          fd = -1;
          continue;
        }
      }
      // i % 4: wait of many, multi_get of the limit, multi_get of many, wait of the limit.
      const bool many = i % 2 == 0;
      const protocol::Op op =
          (i % 4 == 0 || i % 4 == 3) ? protocol::Op::kWait : protocol::Op::kMultiGet;
      std::string& frame = many ? many_ : limit_;
      frame[4] = static_cast<char>(op);
      const auto begin = Clock::now();
      const auto deadline = begin + std::chrono::seconds(30);
      if (many) {
        // The server answers from the first bytes and closes: whatever the
        // send managed, read what came back, then start a new connection.
        const bool sent = send_all(fd, frame, deadline, &stop_);
        std::string payload;
        try {
          payload = read_frame(fd, Clock::now() + std::chrono::seconds(5), &stop_);
        } catch (const std::exception&) {
        }
        const auto took =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - begin).count();
        store_max(worst_many_ns_, took);
        protocol::Reply reply;
        const bool decoded = !payload.empty() && protocol::decode_reply(op, payload, reply).ok();
        if ((decoded && reply.status == protocol::Status::kInvalidArgument) ||
            (!decoded && !sent)) {
          refused_.fetch_add(1);
        } else if (!stop_.load()) {
          unexpected_.fetch_add(1);
          note(std::string(protocol::to_string(op)) + " of many keys: " +
               (decoded ? std::string(protocol::to_string(reply.status)) + ": " +
                              std::string(reply.message)
                        : std::string("sent whole, no reply")));
        }
        ::close(fd);
        fd = -1;
        ++i;
        continue;
      }
      try {
        if (!send_all(fd, frame, deadline, &stop_))
          throw std::runtime_error("the server closed the connection");
        const std::string payload = read_frame(fd, deadline, &stop_);
        const auto took =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - begin).count();
        store_max(many ? worst_many_ns_ : worst_limit_ns_, took);
        protocol::Reply reply;
        const auto result = protocol::decode_reply(op, payload, reply);
        const protocol::Status expected =
            many ? protocol::Status::kInvalidArgument : protocol::Status::kTimeout;
        if (result.ok() && reply.status == expected) {
          (many ? refused_ : timed_out_).fetch_add(1);
        } else {
          unexpected_.fetch_add(1);
          note(std::string(protocol::to_string(op)) + " of " + (many ? "many" : "the limit of") +
               " keys: " +
               (result.ok() ? std::string(protocol::to_string(reply.status)) + ": " +
                                  std::string(reply.message)
                            : result.message));
        }
        ++i;
      } catch (const std::exception& e) {
        if (!stop_.load()) {
          lost_.fetch_add(1);
          note(std::string(protocol::to_string(op)) + ": " + e.what());
        }
        ::close(fd);
        fd = -1;
      }
    }
    if (fd >= 0) ::close(fd);
  }

  std::uint16_t port_;
  std::uint64_t max_requests_;
  std::string many_;  // the opcode byte (frame[4]) is set before each send
  std::string limit_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<std::uint64_t> timed_out_{0};
  std::atomic<std::uint64_t> unexpected_{0};
  std::atomic<std::uint64_t> lost_{0};
  std::atomic<std::int64_t> worst_many_ns_{0};
  std::atomic<std::int64_t> worst_limit_ns_{0};
  mutable std::mutex mutex_;
  std::string first_error_;  // guarded by mutex_
  std::thread thread_;
};

}  // namespace ddp::test::attack
