#include "ddp/status_http/server.h"

#include <fmt/format.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
// clang-format off
#include <utility>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
// clang-format on

#include "connection.h"
#include "ddp/common/error.h"
#include "server_state.h"

namespace ddp::status_http {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

constexpr const char* kOrigin = "status_http::Server";
// Limits that keep a connection's buffers sane whatever the options say.
constexpr std::size_t kMaxHeaderLimit = 1024 * 1024;
constexpr std::size_t kMaxBodyLimit = 16 * 1024 * 1024;
// Connections accepted per turn of the io_context. Between turns, the reads
// that completed meanwhile are handled, so that a flood of new connections
// does not evict a client whose request has already arrived (as long as
// max_connections is above this).
constexpr int kAcceptBatch = 16;
// After a failed accept (out of descriptors), the next try waits this long.
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);

void validate(const ServerOptions& options) {
  if (options.max_connections == 0) {
    throw InvalidArgument(kOrigin, "max_connections must be at least 1");
  }
  if (options.max_header_bytes == 0 || options.max_header_bytes > kMaxHeaderLimit) {
    throw InvalidArgument(kOrigin, fmt::format("max_header_bytes must be 1 to {}, not {}",
                                               kMaxHeaderLimit, options.max_header_bytes));
  }
  if (options.max_body_bytes > kMaxBodyLimit) {
    throw InvalidArgument(kOrigin, fmt::format("max_body_bytes must be at most {}, not {}",
                                               kMaxBodyLimit, options.max_body_bytes));
  }
  if (options.idle_timeout <= std::chrono::milliseconds(0)) {
    throw InvalidArgument(kOrigin, "idle_timeout must be positive");
  }
  if (options.write_progress_timeout <= std::chrono::milliseconds(0)) {
    throw InvalidArgument(kOrigin, "write_progress_timeout must be positive");
  }
}

// "host:port", with brackets around an IPv6 address.
std::string host_port(const std::string& host, std::uint16_t port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                             : fmt::format("{}:{}", host, port);
}

tcp::endpoint endpoint_of(asio::io_context& io, const ServerOptions& options) {
  boost::system::error_code ec;
  auto address = asio::ip::make_address(options.host, ec);
  if (!ec) return tcp::endpoint(address, options.port);
  tcp::resolver resolver(io);
  const auto results = resolver.resolve(options.host, std::to_string(options.port), ec);
  if (ec || results.empty()) {
    throw NetworkError(kOrigin, fmt::format("cannot listen on {}: cannot resolve the host: {}",
                                            host_port(options.host, options.port),
                                            ec ? ec.message() : "no addresses"));
  }
  return results.begin()->endpoint();
}

}  // namespace

class Server::Impl {
 public:
  Impl(ServerOptions options, Handler handler);

  void run();
  // Closes the acceptor and every connection and stops the io_context.
  // The server's thread, or the caller's when the server never started.
  void shut_down();
  void accept_batch();

  asio::io_context io{1};
  ServerState state;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  tcp::endpoint::protocol_type protocol = tcp::v4();
  std::uint16_t port = 0;

  std::mutex mutex;  // start() and stop()
  std::thread thread;
  bool started = false;
  bool stopped = false;

 private:
  void listen(const ServerOptions& options);
  void wait_for_connections();
  void retry_accept_later(int error);
  void admit(int fd);
};

Server::Impl::Impl(ServerOptions options, Handler handler)
    : state(std::move(options), std::move(handler)), acceptor(io), accept_retry(io) {
  listen(state.options());
}

void Server::Impl::listen(const ServerOptions& options) {
  const tcp::endpoint endpoint = endpoint_of(io, options);
  const std::string where = host_port(options.host, options.port);
  protocol = endpoint.protocol();
  // Made here with close-on-exec, so that no program the process starts
  // inherits the port (Asio opens sockets without it).
  const int fd =
      ::socket(protocol.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, IPPROTO_TCP);
  if (fd < 0) {
    throw NetworkError(kOrigin,
                       fmt::format("cannot listen on {}: socket: {}", where, std::strerror(errno)));
  }
  boost::system::error_code ec;
  if (acceptor.assign(protocol, fd, ec)) {
    ::close(fd);
    throw NetworkError(kOrigin, fmt::format("cannot listen on {}: {}", where, ec.message()));
  }
  if (acceptor.set_option(asio::socket_base::reuse_address(true), ec) ||
      acceptor.bind(endpoint, ec) ||
      acceptor.listen(asio::socket_base::max_listen_connections, ec)) {
    throw NetworkError(kOrigin, fmt::format("cannot listen on {}: {}", where, ec.message()));
  }
  port = acceptor.local_endpoint().port();
  asio::post(io, [this] { accept_batch(); });
}

void Server::Impl::run() {
  // Nothing a client sends makes a handler throw; should anything escape
  // anyway, log it and go on serving rather than end the thread.
  for (;;) {
    try {
      io.run();
      return;
    } catch (const std::exception& e) {
      state.log_server_event(spdlog::level::err, fmt::format("unexpected error: {}", e.what()));
    } catch (...) {
      state.log_server_event(spdlog::level::err, "unexpected error");
    }
  }
}

void Server::Impl::accept_batch() {
  for (int accepted = 0; accepted < kAcceptBatch; ++accepted) {
    const int fd =
        ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      try {
        admit(fd);
      } catch (const std::exception& e) {
        // Out of memory, say: this connection is lost (its socket closed),
        // the server goes on accepting.
        state.log_server_event(spdlog::level::err,
                               fmt::format("cannot serve a connection: {}", e.what()));
      }
      continue;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_for_connections();
      return;
    }
    if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
    retry_accept_later(errno);
    return;
  }
  // More may be waiting: take them on the next turn.
  asio::post(io, [this] { accept_batch(); });
}

void Server::Impl::wait_for_connections() {
  // The reactor reports new connections as edges: wait only after accept4()
  // said none is pending, or one already queued would wait for the next.
  acceptor.async_wait(tcp::acceptor::wait_read, [this](const boost::system::error_code& ec) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (ec) {
      retry_accept_later(ec.value());
      return;
    }
    accept_batch();
  });
}

void Server::Impl::retry_accept_later(int error) {
  if (!acceptor.is_open()) return;
  // Out of descriptors or memory: the pending connection stays queued.
  state.log_client_event(spdlog::level::warn,
                         fmt::format("cannot accept a connection: {}", std::strerror(error)));
  accept_retry.expires_after(kAcceptRetry);
  accept_retry.async_wait([this](const boost::system::error_code& ec) {
    if (!ec && acceptor.is_open()) accept_batch();
  });
}

void Server::Impl::admit(int fd) {
  tcp::socket socket(io);
  boost::system::error_code ec;
  if (socket.assign(protocol, fd, ec)) {
    ::close(fd);
    state.log_client_event(spdlog::level::warn,
                           fmt::format("cannot take a connection: {}", ec.message()));
    return;
  }
  ConnectionRegistry& registry = state.registry();
  // At the cap, one gives way (connection_registry.h says which): never the
  // newcomer, so that a scraper is served whatever holds the slots.
  if (registry.size() >= state.options().max_connections) {
    auto oldest = registry.eviction_candidate();
    const bool busy = oldest->registry_slot().in == ConnectionRegistry::Slot::In::kBusy;
    count(busy ? state.counters().evicted_busy : state.counters().evicted_idle);
    oldest->close();
  }
  auto connection = std::make_shared<Connection>(std::move(socket), state);
  registry.add(connection);
  connection->start();
}

void Server::Impl::shut_down() {
  boost::system::error_code ignored;
  acceptor.close(ignored);
  accept_retry.cancel();
  for (const auto& connection : state.registry().all()) connection->close();
  io.stop();
}

Server::Server(ServerOptions options, Handler handler) {
  validate(options);
  if (!handler) throw InvalidArgument(kOrigin, "the handler is empty");
  impl_ = std::make_unique<Impl>(std::move(options), std::move(handler));
}

Server::~Server() {
  try {
    stop();
  } catch (...) {
    // Destructors do not throw; stop() fails only on a broken thread library.
  }
}

void Server::start() {
  std::lock_guard lock(impl_->mutex);
  if (impl_->started || impl_->stopped) return;
  impl_->started = true;
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

void Server::stop() {
  std::lock_guard lock(impl_->mutex);
  if (impl_->stopped) return;
  if (impl_->thread.joinable() && impl_->thread.get_id() == std::this_thread::get_id()) {
    throw InternalError(kOrigin, "stop() called on the server's own thread (from the handler)");
  }
  impl_->stopped = true;
  if (impl_->thread.joinable()) {
    asio::post(impl_->io, [impl = impl_.get()] { impl->shut_down(); });
    impl_->thread.join();
  } else {
    impl_->shut_down();  // never started: nothing runs on the io_context
  }
}

std::uint16_t Server::port() const { return impl_->port; }

bool Server::token_required() const { return impl_->state.token_check().has_value(); }

std::size_t Server::connections() const { return impl_->state.registry().size(); }

Server::Counters Server::counters() const { return impl_->state.counters().load(); }

}  // namespace ddp::status_http
