#include "server.h"

#include <fmt/format.h>

#include "ddp/common/error.h"
#include "ddp/common/logging.h"
#include "session.h"

namespace ddp::server {

namespace {

// After stop(), connections get this long to take their shutdown replies.
constexpr auto kStopGrace = std::chrono::seconds(2);

protocol::Limits limits_of(const StoreServerOptions& options) {
  protocol::Limits limits;
  limits.max_key_size = options.max_key_size;
  limits.max_value_size = options.max_value_size;
  limits.max_frame_size = options.max_frame_size;
  return limits;
}

void validate(const StoreServerOptions& options) {
  const char* origin = "StoreServer";
  if (options.max_clients == 0) throw InvalidArgument(origin, "max_clients must be at least 1");
  if (options.max_key_size == 0) throw InvalidArgument(origin, "max_key_size must be at least 1");
  if (options.max_frame_size < protocol::kMaxHandshakeFrame) {
    throw InvalidArgument(origin, fmt::format("max_frame_size must be at least {} bytes",
                                              protocol::kMaxHandshakeFrame));
  }
  if (options.handshake_timeout <= std::chrono::milliseconds(0)) {
    throw InvalidArgument(origin, "handshake_timeout must be positive");
  }
  if (options.idle_timeout < std::chrono::milliseconds(0)) {
    throw InvalidArgument(origin, "idle_timeout must not be negative");
  }
}

}  // namespace

Server::Server(const StoreServerOptions& options)
    : options_(options),
      limits_(limits_of(options)),
      logger_(log::get("store")),
      acceptor_(io_),
      retry_timer_(io_),
      stop_timer_(io_) {
  validate(options_);
  boost::system::error_code ec;
  auto address = asio::ip::make_address(options_.host, ec);
  if (ec) {
    // Not a literal address: resolve the name (e.g. "localhost").
    asio::ip::tcp::resolver resolver(io_);
    auto results = resolver.resolve(options_.host, std::to_string(options_.port), ec);
    if (ec || results.empty()) {
      throw NetworkError("StoreServer", fmt::format("cannot resolve host '{}': {}", options_.host,
                                                    ec ? ec.message() : "no addresses"));
    }
    address = results.begin()->endpoint().address();
  }
  asio::ip::tcp::endpoint endpoint(address, options_.port);
  auto where = fmt::format("{}:{}", options_.host, options_.port);
  if (acceptor_.open(endpoint.protocol(), ec) ||
      acceptor_.set_option(asio::socket_base::reuse_address(true), ec) ||
      acceptor_.bind(endpoint, ec) ||
      acceptor_.listen(asio::socket_base::max_listen_connections, ec)) {
    throw NetworkError("StoreServer", fmt::format("cannot listen on {}: {}", where, ec.message()));
  }
  port_ = acceptor_.local_endpoint().port();
  sessions_.set_on_empty([this] {
    if (stopping_) stop_timer_.cancel();
  });
  accept();
}

void Server::run() {
  // Handlers catch their own errors; should one escape anyway, log it and keep
  // serving the other connections rather than terminate the thread.
  while (true) {
    try {
      io_.run();
      return;
    } catch (const std::exception& e) {
      logger_->error("store server: unexpected error in a handler: {}", e.what());
    }
  }
}

void Server::stop() {
  if (stop_requested_.exchange(true)) return;
  asio::post(io_, [this] { shutdown(); });
}

void Server::accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, asio::ip::tcp::socket socket) {
    if (ec == asio::error::operation_aborted || stopping_) return;
    try {
      if (ec) {
        // Out of file descriptors and the like: back off instead of spinning.
        logger_->warn("store server: accept failed: {}", ec.message());
        retry_timer_.expires_after(std::chrono::milliseconds(100));
        retry_timer_.async_wait([this](const boost::system::error_code& e) {
          if (!e && !stopping_) accept();
        });
        return;
      }
      auto session = std::make_shared<Session>(std::move(socket), *this);
      if (sessions_.active() >= options_.max_clients) {
        sessions_.add(session, false);
        session->reject(
            protocol::Status::kTooManyClients,
            fmt::format("the server already has its maximum of {} clients", options_.max_clients));
      } else {
        sessions_.add(session, true);
        session->start();
      }
    } catch (const std::exception& e) {
      logger_->error("store server: cannot set up a connection: {}", e.what());
    }
    accept();
  });
}

void Server::shutdown() {
  stopping_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  retry_timer_.cancel();
  try {
    handler_.shutdown("the store server is shutting down");
    // A stuck peer (not reading its socket) must not hold the shutdown forever.
    stop_timer_.expires_after(kStopGrace);
    stop_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec != asio::error::operation_aborted) io_.stop();
    });
    sessions_.stop_all();
  } catch (const std::exception& e) {
    logger_->error("store server: shutdown: {}", e.what());
    io_.stop();
  }
}

}  // namespace ddp::server
