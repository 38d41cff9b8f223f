// A small HTTP/1.1 GET client for status_bench's scrapes of loopback servers
// (the agent's and the daemon's live view, etcd's /metrics): one connection,
// which may serve several requests (keep-alive) or one (Connection: close).
// It reads bodies framed by Content-Length, chunked transfer coding or the end
// of the connection; no TLS, no redirects, no compression (it sends no
// Accept-Encoding, so servers answer in plain text).
//
// Ownership: a ScrapeConnection owns its socket (not copyable); the destructor
// closes it. Blocking: the constructor connects (at once on loopback); get()
// waits for the whole response, up to its timeout. Thread-safety: one thread
// uses a connection. Errors: the constructor throws std::runtime_error when it
// cannot connect; get() throws none: a request that fails or times out gives
// nullopt and leaves the connection closed.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

#include "net_util.h"
#include "sys_error.h"

namespace ddp::bench {

struct ScrapeResponse {
  int status = 0;
  std::string body;  // decoded (chunks joined)
};

class ScrapeConnection {
 public:
  explicit ScrapeConnection(std::uint16_t port) : port_(port) {
    fd_ = test::connect_loopback(port);
    if (fd_ < 0) throw test::sys_error("connect to 127.0.0.1:" + std::to_string(port));
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~ScrapeConnection() { close(); }
  ScrapeConnection(const ScrapeConnection&) = delete;
  ScrapeConnection& operator=(const ScrapeConnection&) = delete;

  bool is_open() const { return fd_ >= 0; }

  // GET `path`; with keep_alive false the request asks the server to close the
  // connection after its answer (and this side closes it too).
  std::optional<ScrapeResponse> get(const std::string& path, bool keep_alive,
                                    std::chrono::milliseconds timeout) {
    if (fd_ < 0) return std::nullopt;
    deadline_ = std::chrono::steady_clock::now() + timeout;
    const std::string request =
        "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port_) +
        "\r\nAccept: */*\r\n" + (keep_alive ? "" : "Connection: close\r\n") + "\r\n";
    if (!send_all(request)) return fail();
    auto response = read_response();
    if (!response) return fail();
    if (!keep_alive || server_closes_) close();
    return response;
  }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    buffer_.clear();
  }

 private:
  std::optional<ScrapeResponse> fail() {
    close();
    return std::nullopt;
  }

  bool send_all(const std::string& data) {
    std::size_t sent = 0;
    while (sent < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      sent += static_cast<std::size_t>(n);
    }
    return true;
  }

  // Appends what the socket has to buffer_ (waiting up to the deadline);
  // false at the end of the stream, on an error or at the deadline.
  bool fill() {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline_ - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd pfd{fd_, POLLIN, 0};
      const int ready = ::poll(&pfd, 1, static_cast<int>(std::max<long long>(1, left.count())));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) continue;  // the deadline is checked above
      char chunk[16384];
      const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      buffer_.append(chunk, static_cast<std::size_t>(n));
      return true;
    }
  }

  // Waits until buffer_ holds `needle`; its position, or npos.
  std::size_t wait_for(const std::string& needle, std::size_t from = 0) {
    for (;;) {
      const auto at = buffer_.find(needle, from);
      if (at != std::string::npos) return at;
      if (!fill()) return std::string::npos;
    }
  }

  bool wait_for_bytes(std::size_t n) {
    while (buffer_.size() < n) {
      if (!fill()) return false;
    }
    return true;
  }

  static std::string lower(std::string text) {
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return text;
  }

  std::optional<ScrapeResponse> read_response() {
    const auto head_end = wait_for("\r\n\r\n");
    if (head_end == std::string::npos) return std::nullopt;
    const std::string head = buffer_.substr(0, head_end + 2);
    buffer_.erase(0, head_end + 4);
    ScrapeResponse response;
    // "HTTP/1.1 200 OK"
    const auto space = head.find(' ');
    if (head.rfind("HTTP/1.", 0) != 0 || space == std::string::npos) return std::nullopt;
    response.status = std::atoi(head.c_str() + space + 1);
    std::optional<std::size_t> length;
    bool chunked = false;
    server_closes_ = head.rfind("HTTP/1.0", 0) == 0;
    for (auto line_at = head.find("\r\n") + 2; line_at < head.size();) {
      const auto line_end = head.find("\r\n", line_at);
      const std::string line = head.substr(line_at, line_end - line_at);
      line_at = line_end + 2;
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      const std::string name = lower(line.substr(0, colon));
      std::string value = lower(line.substr(colon + 1));
      value.erase(0, value.find_first_not_of(' '));
      if (name == "content-length") length = std::strtoull(value.c_str(), nullptr, 10);
      if (name == "transfer-encoding" && value.find("chunked") != std::string::npos) chunked = true;
      if (name == "connection" && value.find("close") != std::string::npos) server_closes_ = true;
    }
    if (chunked) {
      for (;;) {
        const auto line_end = wait_for("\r\n");
        if (line_end == std::string::npos) return std::nullopt;
        const std::size_t size = std::strtoull(buffer_.c_str(), nullptr, 16);
        buffer_.erase(0, line_end + 2);
        if (size == 0) {
          // Trailers (none expected), then the empty line.
          for (;;) {
            const auto end = wait_for("\r\n");
            if (end == std::string::npos) return std::nullopt;
            buffer_.erase(0, end + 2);
            if (end == 0) return response;
          }
        }
        if (!wait_for_bytes(size + 2)) return std::nullopt;
        response.body.append(buffer_, 0, size);
        buffer_.erase(0, size + 2);
      }
    }
    if (length) {
      if (!wait_for_bytes(*length)) return std::nullopt;
      response.body = buffer_.substr(0, *length);
      buffer_.erase(0, *length);
      return response;
    }
    // Neither: the body runs to the end of the connection.
    while (fill()) {
    }
    if (std::chrono::steady_clock::now() >= deadline_) return std::nullopt;
    response.body = std::move(buffer_);
    buffer_.clear();
    server_closes_ = true;
    return response;
  }

  std::uint16_t port_;
  int fd_ = -1;
  std::string buffer_;  // received, not yet consumed
  bool server_closes_ = false;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace ddp::bench
