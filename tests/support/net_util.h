// Loopback sockets for tests and benchmarks: free ports, listeners,
// connections.
//
// Ownership: a function that returns a descriptor hands it to the caller, who
// closes it. Blocking: connect_loopback() and port_listens() connect (at once
// on loopback); the others do not block. Thread-safety: every function may be
// called from any thread. Errors: none thrown; see each function.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
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

// A blocking, close-on-exec TCP connection to 127.0.0.1:`port`; -1 with errno
// set when it fails. The caller closes the descriptor.
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

// Whether something accepts TCP connections on loopback `port` (a connection
// is opened and closed at once).
inline bool port_listens(std::uint16_t port) {
  const int fd = connect_loopback(port);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

}  // namespace ddp::test
