#include "server.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddp/common/error.h"
#include "ddp/common/logging.h"
#include "session.h"

namespace ddp::server {

namespace {

// After stop(), connections get this long to take their shutdown replies.
constexpr auto kStopGrace = std::chrono::seconds(2);
// Descriptors kept free for everything else in the process (the agent's worker
// pipes and log files, the server's own acceptor and timers).
constexpr rlim_t kReservedDescriptors = 128;
// The listen queue asked for: the kernel caps it at net.core.somaxconn (4096
// by default since Linux 5.4), so the host's setting decides. Asio's
// max_listen_connections is the SOMAXCONN of the build host's headers (128
// before glibc 2.35), which would cap it below what the host allows.
constexpr int kListenBacklog = 65535;
// How long accepting waits after a failure (out of descriptors) before trying again.
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);
// While accepting keeps failing, a reminder is logged at most this often.
constexpr auto kAcceptLogWindow = std::chrono::seconds(10);

StoreHandler::Limits handler_limits(const StoreServerOptions& options) {
  StoreHandler::Limits limits;
  limits.max_store_bytes = options.max_store_bytes;
  limits.max_value_size = options.max_value_size;
  limits.max_reply_size = options.max_frame_size;
  return limits;
}

// Raises the soft open-file limit to the hard one, and returns how many
// clients the process can hold: max_clients, or fewer when the limit is lower.
std::size_t usable_clients(std::size_t wanted, spdlog::logger& logger) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return wanted;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur == RLIM_INFINITY) return wanted;
  const std::size_t fit = limit.rlim_cur > 2 * kReservedDescriptors
                              ? limit.rlim_cur - kReservedDescriptors
                              : limit.rlim_cur / 2;
  if (wanted <= fit) return wanted;
  logger.info("store server: max_clients lowered from {} to {} to fit the open-file limit of {}",
              wanted, fit, static_cast<std::uint64_t>(limit.rlim_cur));
  return fit;
}

// Options every connection gets, set once on the listening socket: Linux
// copies them into each accepted socket (the keepalive timer included), which
// spares five setsockopt calls per connection. No delay, as replies are small
// and must not wait for the client's ACK; keepalive probes after 60 s of
// silence find half-open connections (a client host that vanished while
// parked in a wait without timeout) in about 90 s.
void set_connection_options(int fd) {
  const int one = 1;
  const int idle = 60;
  const int interval = 10;
  const int count = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

// The open-file limit of this process, or 0 when it cannot be read.
std::uint64_t open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<std::uint64_t>(limit.rlim_cur);
}

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
  if (options.max_store_bytes == 0) {
    throw InvalidArgument(origin, "max_store_bytes must be at least 1");
  }
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
    : options_(options), limits_(limits_of(options)), logger_(log::get("store")), acceptor_(io_),
      retry_timer_(io_), stop_timer_(io_), handler_(handler_limits(options)),
      clients_(ClientRegistry::Options{options.retry_record_clients, options.retry_record_window}) {
  validate(options_);
  options_.max_clients = usable_clients(options_.max_clients, *logger_);
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
  // Asio opens sockets without close-on-exec: the listening socket is made
  // here, so that no process the agent execs inherits the store's port.
  int fd = ::socket(endpoint.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    IPPROTO_TCP);
  if (fd < 0) {
    throw NetworkError("StoreServer",
                       fmt::format("cannot listen on {}:{}: socket: {}", options_.host,
                                   options_.port, std::strerror(errno)));
  }
  auto where = fmt::format("{}:{}", options_.host, options_.port);
  if (acceptor_.assign(endpoint.protocol(), fd, ec)) {
    ::close(fd);
    throw NetworkError("StoreServer", fmt::format("cannot listen on {}: {}", where, ec.message()));
  }
  set_connection_options(fd);
  if (acceptor_.set_option(asio::socket_base::reuse_address(true), ec) ||
      acceptor_.bind(endpoint, ec) || acceptor_.listen(kListenBacklog, ec)) {
    throw NetworkError("StoreServer", fmt::format("cannot listen on {}: {}", where, ec.message()));
  }
  port_ = acceptor_.local_endpoint().port();
  protocol_ = endpoint.protocol();
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
  // Wait for readiness and accept with accept4(SOCK_CLOEXEC) ourselves: Asio
  // 1.74 accepts with plain accept(), and a worker forked in the window before
  // a later fcntl would inherit the connection.
  acceptor_.async_wait(asio::socket_base::wait_read, [this](const boost::system::error_code& ec) {
    if (ec == asio::error::operation_aborted || stopping_) return;
    try {
      if (!ec) accept_ready();
    } catch (const std::exception& e) {
      logger_->error("store server: cannot set up a connection: {}", e.what());
    }
    if (ec || accept_errno_ != 0) {
      // Out of file descriptors and the like: say so (rarely), and back off
      // instead of spinning; the connections wait in the listen queue.
      if (ec) accept_errno_ = ec.value();
      accept_failed(ec ? ec.message() : std::string(std::strerror(accept_errno_)));
      accept_errno_ = 0;
      retry_timer_.expires_after(kAcceptRetry);
      retry_timer_.async_wait([this](const boost::system::error_code& e) {
        if (!e && !stopping_) accept();
      });
      return;
    }
    accept_recovered();
    accept();
  });
}

void Server::accept_failed(const std::string& reason) {
  ++accept_failures_;
  last_accept_errno_ = accept_errno_;
  const auto now = std::chrono::steady_clock::now();
  if (!accept_failing_) {
    accept_failing_ = true;
    accept_failing_since_ = now;
    accept_logged_at_ = now;
    accept_failures_unlogged_ = 0;
    logger_->error("store server: cannot accept connections: {}", describe_accept_failure(reason));
    return;
  }
  ++accept_failures_unlogged_;
  if (now - accept_logged_at_ < kAcceptLogWindow) return;
  logger_->error(
      "store server: still cannot accept connections ({} more attempts failed in the last {} s, "
      "{} connections open): {}",
      accept_failures_unlogged_,
      std::chrono::duration_cast<std::chrono::seconds>(now - accept_logged_at_).count(),
      sessions_.size(), reason);
  accept_logged_at_ = now;
  accept_failures_unlogged_ = 0;
}

std::string Server::describe_accept_failure(const std::string& reason) const {
  const std::uint64_t limit = open_file_limit();
  std::string text = reason;
  if (last_accept_errno_ == EMFILE) {
    text += fmt::format(
        ": this process reached its open-file limit (RLIMIT_NOFILE) of {} descriptors, with {} "
        "connections open (at most {} clients are served); new connections wait in the listen "
        "queue and are accepted as descriptors free up. To serve more clients, raise the hard "
        "open-file limit (ulimit -Hn, or LimitNOFILE= for a systemd service)",
        limit, sessions_.size(), options_.max_clients);
  } else if (last_accept_errno_ == ENFILE) {
    text += fmt::format(
        ": the system-wide limit on open files (fs.file-max) is reached, with {} connections "
        "open here; new connections wait in the listen queue and are accepted as descriptors "
        "free up",
        sessions_.size());
  } else {
    text += "; new connections wait in the listen queue";
  }
  text += fmt::format(" (retrying every {} ms; logged again at most every {} s)",
                      kAcceptRetry.count(), kAcceptLogWindow.count());
  return text;
}

void Server::accept_recovered() {
  if (!accept_failing_) return;
  accept_failing_ = false;
  logger_->warn(
      "store server: accepting connections again after {:.1f} s ({} connections open)",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - accept_failing_since_)
          .count(),
      sessions_.size());
}

void Server::accept_ready() {
  // Take every pending connection (the listening socket is non-blocking).
  for (;;) {
    int fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) accept_errno_ = errno;
      return;
    }
    asio::ip::tcp::socket socket(io_);
    boost::system::error_code ec;
    socket.assign(protocol_, fd, ec);
    if (ec) {
      ::close(fd);
      logger_->warn("store server: cannot adopt a connection: {}", ec.message());
      continue;
    }
    adopt(std::move(socket));
  }
}

bool Server::may_log_client_event() {
  const auto now = std::chrono::steady_clock::now();
  if (now - client_log_window_ >= kClientLogWindow) {
    if (client_log_suppressed_ > 0) {
      logger_->info(
          "store server: {} more client connection(s) closed for errors in the last {} s "
          "(not logged one by one)",
          client_log_suppressed_, kClientLogWindow.count());
    }
    client_log_window_ = now;
    client_log_lines_ = 0;
    client_log_suppressed_ = 0;
  }
  if (client_log_lines_ < kClientLogBurst) {
    ++client_log_lines_;
    return true;
  }
  ++client_log_suppressed_;
  return false;
}

void Server::adopt(asio::ip::tcp::socket socket) {
  auto session = std::make_shared<Session>(std::move(socket), *this);
  ++connections_total_;
  if (sessions_.active() >= options_.max_clients) {
    ++refused_total_;
    sessions_.add(session, false);
    session->reject(
        protocol::Status::kTooManyClients,
        fmt::format("the server already has its maximum of {} clients", options_.max_clients));
  } else {
    sessions_.add(session, true);
    session->start();
  }
}

StoreServerStats Server::stats() const {
  StoreServerStats s;
  s.clients = sessions_.active();
  s.connections_total = connections_total_;
  s.refused_total = refused_total_;
  s.accept_failures = accept_failures_;
  s.failed_handshakes = failed_handshakes_;
  s.keys = handler_.num_keys();
  s.stored_bytes = handler_.stored_bytes();
  s.parked_requests = handler_.num_parked();
  for (std::size_t op = 0; op < op_counts_.size(); ++op) {
    if (op_counts_[op] == 0 || !protocol::is_known_op(static_cast<std::uint8_t>(op))) continue;
    s.operations[std::string(protocol::to_string(static_cast<protocol::Op>(op)))] = op_counts_[op];
  }
  return s;
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
