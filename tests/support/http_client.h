// A minimal HTTP/1.1 client for loopback servers (etcd's /health and /v3/ JSON
// API), and a scan for the values of a JSON field: enough to ask a test's
// etcd what it holds, not a general client (no TLS, no chunked decoding, no
// redirects).
//
// Ownership: each request opens and closes its own connection. Blocking: up to
// the request's timeout. Thread-safety: both functions may be called from any
// thread. Errors: none thrown; a request that fails or times out gives nullopt.
#pragma once

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "net_util.h"

namespace ddp::test {

// One request to 127.0.0.1:`port` (Connection: close, a JSON body); the whole
// response (status line, headers and body), or nullopt when none came within
// `timeout`.
inline std::optional<std::string> http_request(std::uint16_t port, const std::string& method,
                                               const std::string& path, const std::string& body,
                                               std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const int fd = connect_loopback(port);
  if (fd < 0) return std::nullopt;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  // Each send and recv waits at most the whole timeout; the loop below checks
  // the deadline between them.
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  const std::string request =
      method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nConnection: close\r\n\r\n" + body;
  std::size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    sent += static_cast<std::size_t>(n);
  }
  std::string response;
  char chunk[8192];
  while (std::chrono::steady_clock::now() < deadline) {
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) return response;
    response.append(chunk, static_cast<std::size_t>(n));
  }
  return std::nullopt;
}

// Every value of the JSON field `name` in `text` that is a number or an
// int64 in a string, as etcd writes them ("ID":"123" or "TTL":123).
inline std::vector<std::string> json_values(const std::string& text, const std::string& name) {
  std::vector<std::string> values;
  const std::string needle = "\"" + name + "\":";
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    auto from = at + needle.size();
    if (from < text.size() && text[from] == '"') ++from;
    auto to = from;
    while (to < text.size() &&
           (std::isdigit(static_cast<unsigned char>(text[to])) || text[to] == '-')) {
      ++to;
    }
    if (to > from) values.push_back(text.substr(from, to - from));
  }
  return values;
}

}  // namespace ddp::test
