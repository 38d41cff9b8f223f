// Networking helpers shared by test programs.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace ddp::test {

// A close-on-exec TCP socket bound to a free loopback port; `port` gets the
// port. The caller closes the descriptor.
inline int bind_loopback(std::uint16_t& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port = ntohs(addr.sin_port);
  return fd;
}

// A loopback TCP port that was free a moment ago (bound to port 0, then
// released). Another process may take it before the caller does: use it only
// where a test needs a port number up front, never where port 0 would do.
inline std::uint16_t free_port() {
  std::uint16_t port = 0;
  ::close(bind_loopback(port));
  return port;
}

// A socket listening on a free loopback port; `port` gets the port. The caller
// closes the descriptor.
inline int listen_loopback(std::uint16_t& port, int backlog = 16) {
  int fd = bind_loopback(port);
  ::listen(fd, backlog);
  return fd;
}

// Whether something accepts TCP connections on loopback `port` (a connection
// is opened and closed at once).
inline bool port_listens(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

}  // namespace ddp::test
