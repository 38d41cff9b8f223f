// Hostile clients of a live view (status_http::Server) and the scraper they
// must not lock out, for the server's tests (tests/status_http) and the
// endpoints' real-time tests (tests/status: the agent's and the daemon's):
//
//   PipeliningNonReaders  `count` clients on 127.0.0.1:port, each with a small
//                         fixed receive buffer, pipelining one request (GET /,
//                         say, or one with a wrong token) as fast as the server
//                         takes it and never reading; a client the server
//                         closes connects again after `reconnect_delay` (as a
//                         script's loop would: an attacker reconnecting in a
//                         tight loop evicts its own connections before their
//                         responses stall). One thread drives them all, for
//                         at most `max_duration`.
//   scrape_every          one GET on a fresh connection every `period` for
//                         `duration` (and at least `at_least` of them), each
//                         answered in full or not: what a Prometheus scraping
//                         the view sees.
//
// Ownership: PipeliningNonReaders owns its sockets and its thread (not
// copyable); stop() and the destructor close every socket and join the
// thread, which looks at its stop flag every 10 ms. Blocking: the constructor
// starts the thread and returns at once; scrape_every blocks for `duration`
// plus at most one request's `timeout`, or for `at_least` requests.
// Thread-safety: the counters may be read from any thread; one thread starts
// and stops the attackers. Errors:
// the constructor throws std::system_error when it cannot start its thread;
// what goes wrong during an attack is counted, never thrown.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "net_util.h"

namespace ddp::test::http_attack {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

class PipeliningNonReaders {
 public:
  // Each client's receive buffer: small and fixed, so that the kernel takes
  // little of a response the client never reads.
  static constexpr int kReceiveBuffer = 4096;

  PipeliningNonReaders(std::uint16_t port, int count, std::string request, Millis max_duration,
                       Millis reconnect_delay = Millis(100))
      : port_(port), reconnect_delay_(reconnect_delay), clients_(static_cast<std::size_t>(count)) {
    // Many copies of the request per send: pipelining as fast as the server reads.
    while (burst_.size() < 16 * 1024) burst_ += request;
    const auto until = Clock::now() + max_duration;
    thread_ = std::thread([this, until] { run(until); });
  }
  ~PipeliningNonReaders() { stop(); }
  PipeliningNonReaders(const PipeliningNonReaders&) = delete;
  PipeliningNonReaders& operator=(const PipeliningNonReaders&) = delete;

  // Ends the attack: every socket closed, the thread joined. Idempotent.
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  // Connections opened so far.
  std::uint64_t connections() const { return connections_.load(); }
  // Connections the server closed or reset so far (each one was opened again).
  std::uint64_t closed_by_server() const { return closed_by_server_.load(); }
  // Bytes of requests the server took so far.
  std::uint64_t bytes_sent() const { return bytes_sent_.load(); }
  // Clients connected now (their connection established, not yet closed).
  int connected_now() const { return connected_now_.load(); }

 private:
  struct Client {
    int fd = -1;
    bool connected = false;        // the connection was established
    Clock::time_point retry_at{};  // when a failed connect may be tried again
  };

  void run(Clock::time_point until) {
    std::vector<pollfd> pfds(clients_.size());
    while (!stop_ && Clock::now() < until) {
      const auto now = Clock::now();
      for (std::size_t i = 0; i < clients_.size(); ++i) {
        Client& c = clients_[i];
        if (c.fd < 0 && now >= c.retry_at) open(c);
        // POLLIN is never asked for: these clients read nothing. POLLRDHUP
        // says the server shut its side; POLLERR and POLLHUP come anyway.
        pfds[i] = pollfd{c.fd, static_cast<short>(POLLOUT | POLLRDHUP), 0};
      }
      if (::poll(pfds.data(), pfds.size(), 10) <= 0) continue;
      for (std::size_t i = 0; i < clients_.size(); ++i) {
        Client& c = clients_[i];
        if (c.fd < 0 || pfds[i].revents == 0) continue;
        if ((pfds[i].revents & (POLLERR | POLLHUP | POLLRDHUP)) != 0) {
          drop(c);
          continue;
        }
        if (!c.connected) {
          c.connected = true;
          ++connected_now_;
        }
        const ssize_t n = ::send(c.fd, burst_.data(), burst_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
          bytes_sent_ += static_cast<std::uint64_t>(n);
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          drop(c);
        }
      }
    }
    for (Client& c : clients_) close_client(c);
  }

  void open(Client& c) {
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) {
      c.retry_at = Clock::now() + Millis(10);
      return;
    }
    const int size = kReceiveBuffer;
    ::setsockopt(c.fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);  // before the handshake
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port_);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(c.fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 &&
        errno != EINPROGRESS) {
      close_client(c);
      c.retry_at = Clock::now() + Millis(10);
      return;
    }
    ++connections_;
  }

  // The server closed or reset the connection (or it never opened): again,
  // after the delay.
  void drop(Client& c) {
    if (c.connected) ++closed_by_server_;
    c.retry_at = Clock::now() + reconnect_delay_;
    close_client(c);
  }

  void close_client(Client& c) {
    if (c.fd >= 0) ::close(c.fd);
    if (c.connected) --connected_now_;
    c.fd = -1;
    c.connected = false;
  }

  const std::uint16_t port_;
  const Millis reconnect_delay_;
  std::vector<Client> clients_;
  std::string burst_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> connections_{0};
  std::atomic<std::uint64_t> closed_by_server_{0};
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::atomic<int> connected_now_{0};
  std::thread thread_;
};

// One GET of `path` on a new connection to 127.0.0.1:`port` with
// `extra_headers` (each ending in \r\n) and Connection: close; the status of
// a complete response (its whole body received, as Content-Length says), or
// nullopt when the connection failed, closed early or `timeout` passed.
inline std::optional<int> get_status(std::uint16_t port, const std::string& path,
                                     const std::string& extra_headers, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  const int fd = connect_loopback(port);
  if (fd < 0) return std::nullopt;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: scraper\r\n" + extra_headers +
                              "Connection: close\r\n\r\n";
  std::size_t sent = 0;
  std::string response;
  auto wait_for = [&](short events) {
    for (;;) {
      const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd, events, 0};
      const int n = ::poll(&p, 1, static_cast<int>(left));
      if (n > 0) return true;
      if (n < 0 && errno != EINTR) return false;
    }
  };
  while (sent < request.size()) {
    if (!wait_for(POLLOUT)) return std::nullopt;
    const ssize_t n =
        ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return std::nullopt;
    sent += static_cast<std::size_t>(n);
  }
  for (;;) {
    const auto header_end = response.find("\r\n\r\n");
    if (header_end != std::string::npos) {
      const std::string head = response.substr(0, header_end);
      if (head.rfind("HTTP/1.1 ", 0) != 0 || head.size() < 12) return std::nullopt;
      const auto length_at = head.find("\r\nContent-Length: ");
      if (length_at == std::string::npos) return std::nullopt;
      const std::size_t length = std::stoul(head.substr(length_at + 18));
      if (response.size() >= header_end + 4 + length) return std::stoi(head.substr(9, 3));
    }
    if (!wait_for(POLLIN)) return std::nullopt;
    char chunk[16384];
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return std::nullopt;
    response.append(chunk, static_cast<std::size_t>(n));
  }
}

struct ScrapeLog {
  int asked = 0;
  int answered = 0;      // with status 200
  Millis slowest{0};     // of the answered ones
  std::string failures;  // "scrape 3 at 3.0 s: no answer; ..."
};

// One GET of `path` every `period` for `duration` (the first at once), each
// on a new connection and given `timeout`; a scrape that takes longer than
// `period` delays the next one. At least `at_least` scrapes are made, however
// long they take (under a sanitizer each may take a second).
inline ScrapeLog scrape_every(std::uint16_t port, const std::string& path,
                              const std::string& extra_headers, Millis period, Millis duration,
                              Millis timeout, int at_least = 1) {
  ScrapeLog log;
  const auto start = Clock::now();
  for (auto next = start; next < start + duration || log.asked < at_least;
       next = std::max(next + period, Clock::now())) {
    std::this_thread::sleep_until(next);
    const auto asked = Clock::now();
    const auto status = get_status(port, path, extra_headers, timeout);
    const auto took = std::chrono::duration_cast<Millis>(Clock::now() - asked);
    ++log.asked;
    if (status == 200) {
      ++log.answered;
      if (took > log.slowest) log.slowest = took;
    } else {
      const auto at = std::chrono::duration_cast<Millis>(asked - start).count();
      log.failures +=
          "scrape " + std::to_string(log.asked) + " at " + std::to_string(at) +
          " ms: " + (status ? "status " + std::to_string(*status) : std::string("no answer")) +
          " after " + std::to_string(took.count()) + " ms; ";
    }
  }
  return log;
}

}  // namespace ddp::test::http_attack
