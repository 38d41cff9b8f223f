#include "ddp/store/tcp_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "ddp/common/error.h"
#include "ddp/common/time.h"
#include "ddp/store/protocol.h"
#include "ddp/store/store_util.h"

namespace ddp {

namespace {

using protocol::Op;
using protocol::Status;

// Blocking calls wait for the server's reply up to their own timeout plus this
// much (the server answers a timeout itself; this only catches a dead server).
constexpr Store::Duration kReplyGrace = std::chrono::seconds(10);
// Non-blocking calls wait for their reply at least this long.
constexpr Store::Duration kMinReplyTimeout = std::chrono::seconds(30);
// Longer timeouts than this are sent as "forever".
constexpr Store::Duration kForever = std::chrono::hours(24 * 365 * 100);
constexpr std::size_t kReadChunk = 16 * 1024;
// A blocking receive wakes up at least this often to look at its deadline.
constexpr Store::Duration kMaxReceiveTimeout = std::chrono::hours(1);
// A receive timeout at least this long is not shortened for a call with a
// later deadline (waking up once a second to re-check costs nothing).
constexpr Store::Duration kKeptReceiveTimeout = std::chrono::seconds(1);

std::string errno_text(int err) { return std::strerror(err); }

// The connection broke (EOF, reset, no reply in time, or the server closed it
// for a reason unrelated to the request): the request may be retried on a new
// connection. Escapes as a plain NetworkError when it cannot be.
class ConnectionLost : public NetworkError {
 public:
  using NetworkError::NetworkError;
};

// After a drop, a server that refuses connections for this long is gone (no
// listener on its port: it stopped or its host's process died), not briefly
// unreachable: give up then, so that agents notice a dead store host quickly.
constexpr Store::Duration kRefusedGiveUp = std::chrono::milliseconds(250);

// Statuses after which the server closed the connection without applying the
// request: safe to send again on a new connection.
bool retry_after(Status status) {
  return status == Status::kIdleTimeout || status == Status::kTooManyClients ||
         status == Status::kHandshakeTimeout;
}

std::uint64_t wire_timeout(Store::Duration timeout) {
  if (timeout <= Store::Duration(0)) return 0;
  if (timeout >= kForever) return protocol::kNoTimeout;
  return static_cast<std::uint64_t>(timeout.count());
}

// The deadline for a reply to a request that may wait `timeout` on the server.
Deadline reply_deadline(std::uint64_t wire, Store::Duration default_timeout) {
  if (wire == protocol::kNoTimeout) return Deadline::never();
  return Deadline(Store::Duration(static_cast<std::int64_t>(wire)) +
                  std::max(kReplyGrace, std::min(default_timeout, kMinReplyTimeout)));
}

// Waits until `fd` is ready for `events` or the deadline passes (false).
bool wait_fd(int fd, short events, const Deadline& deadline) {
  while (true) {
    auto left = deadline.remaining();
    int ms = left > Store::Duration(std::numeric_limits<int>::max())
                 ? -1
                 : static_cast<int>(left.count());
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let the following call report the error
  }
}

}  // namespace

class TcpStore::Connection {
 public:
  explicit Connection(const TcpStoreOptions& options)
      : options_(options), client_id_(protocol::make_client_id()),
        parser_(protocol::kMaxHandshakeReply), read_buf_(new char[kReadChunk]) {
    where_ = fmt::format("{}:{}", options_.host, options_.port);
    connect(Deadline(options_.connect_timeout), false);
  }

  ~Connection() { close_fd(); }

  const TcpStoreOptions& options() const { return options_; }

  // Sends `request`, reads its reply and returns extract(reply), all under the
  // connection's lock (the reply's views point into this connection's buffers).
  // Error replies and broken connections throw (see tcp_store.h).
  //
  // A lost connection is re-established (with backoff, handshake and
  // authentication) and the request sent again, until `deadline` or
  // options().reconnect_timeout after the loss. Requests that are not
  // idempotent carry a request id that stays the same across the retries, so
  // the server applies them once. A blocking request is re-sent with the time
  // it has left.
  template <typename Extract>
  auto call(const char* origin, protocol::Request request, const Deadline& deadline,
            Extract&& extract) {
    std::lock_guard lock(mutex_);
    if (protocol::carries_request_id(request.op)) request.request_id = ++last_request_id_;
    const auto started = Clock::now();
    const std::uint64_t wire = request.timeout_ms;
    for (;;) {
      try {
        if (fd_ < 0) reconnect(origin, deadline);
        exchange(origin, request, deadline);
        return extract(reply_);
      } catch (const ConnectionLost& e) {
        if (deadline.expired()) throw NetworkError(origin, strip_origin(e));
        lost_reason_ = strip_origin(e);
        // The server may have applied it: it must check the id, not apply blindly.
        if (request.request_id != 0) request.request_id |= protocol::kRetryFlag;
      }
      if (wire != 0 && wire != protocol::kNoTimeout) {
        auto spent = std::chrono::duration_cast<Store::Duration>(Clock::now() - started);
        request.timeout_ms = wire > static_cast<std::uint64_t>(spent.count())
                                 ? wire - static_cast<std::uint64_t>(spent.count())
                                 : 0;
      }
    }
  }

  const protocol::Limits& limits() const { return limits_; }

 private:
  void close_fd() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  [[noreturn]] void broken(const char* origin, std::string reason) {
    broken_ = reason;
    close_fd();
    throw ConnectionLost(origin,
                         fmt::format("connection to the store at {} lost: {}", where_, broken_));
  }

  static std::string strip_origin(const Error& e) {
    std::string what = e.what();
    const std::string prefix = e.origin() + ": ";
    return what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
  }

  // Connects and completes the handshake, retrying with backoff until
  // `deadline`. After a drop (`reconnecting`), a server that refuses
  // connections for kRefusedGiveUp is taken to be gone.
  void connect(const Deadline& deadline, bool reconnecting) {
    Backoff backoff(Store::Duration(10), Store::Duration(1000));
    std::string last_error;
    // When the server started refusing (time_point::max(): it is not refusing).
    Clock::time_point refused_since = Clock::time_point::max();
    while (true) {
      try {
        connect_once(deadline);
        handshake(deadline);
        return;
      } catch (const NetworkError& e) {
        // Refused, reset, too many clients, handshake timeout: the server may be
        // starting or busy; retry until the deadline.
        last_error = strip_origin(e);
        close_fd();
        broken_.clear();
      } catch (...) {  // auth or version: final (and the destructor will not run)
        close_fd();
        throw;
      }
      if (last_errno_ != ECONNREFUSED) {
        refused_since = Clock::time_point::max();
      } else if (refused_since == Clock::time_point::max()) {
        refused_since = Clock::now();
      }
      const bool gone = reconnecting && refused_since != Clock::time_point::max() &&
                        Clock::now() - refused_since >= kRefusedGiveUp;
      if (deadline.expired() || gone) {
        if (reconnecting) {
          throw NetworkError("TcpStore", fmt::format("connection to the store at {} lost ({}) and "
                                                     "not re-established: {}",
                                                     where_, lost_reason_, last_error));
        }
        throw NetworkError(
            "TcpStore", fmt::format("cannot connect to the store at {} within {:.3f} s: {}", where_,
                                    options_.connect_timeout.count() / 1000.0, last_error));
      }
      std::this_thread::sleep_for(std::min(backoff.next(), deadline.remaining()));
    }
  }

  // The connection was lost: a new one within the call's deadline and
  // reconnect_timeout. Throws NetworkError (origin: the call) when it fails.
  void reconnect(const char* origin, const Deadline& call_deadline) {
    Deadline deadline(std::min(call_deadline.remaining(), options_.reconnect_timeout));
    if (lost_reason_.empty()) lost_reason_ = broken_.empty() ? "not connected" : broken_;
    try {
      connect(deadline, true);
    } catch (const NetworkError& e) {
      throw NetworkError(origin, strip_origin(e));
    }
    lost_reason_.clear();
  }

  void connect_once(const Deadline& deadline) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* list = nullptr;
    last_errno_ = 0;
    auto port = std::to_string(options_.port);
    int rc = ::getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &list);
    if (rc != 0) {
      throw NetworkError("TcpStore",
                         fmt::format("cannot resolve '{}': {}", options_.host, ::gai_strerror(rc)));
    }
    std::string error = "no address";
    for (addrinfo* a = list; a != nullptr; a = a->ai_next) {
      int fd =
          ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        error = errno_text(errno);
        continue;
      }
      int err = 0;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS) {
          if (!wait_fd(fd, POLLOUT, deadline)) {
            err = ETIMEDOUT;
          } else {
            socklen_t len = sizeof(err);
            if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
          }
        }
      }
      if (err != 0) {
        error = errno_text(err);
        last_errno_ = err;
        ::close(fd);
        continue;
      }
      // Blocking from here on: receives block (bounded by SO_RCVTIMEO), sends
      // pass MSG_DONTWAIT and poll when the buffer is full.
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      // Keepalive notices a vanished server host during a long (or endless) wait.
      int idle = 30, interval = 10, count = 3;
      ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
      fd_ = fd;
      break;
    }
    ::freeaddrinfo(list);
    if (fd_ < 0) throw NetworkError("TcpStore", error);
    parser_ = protocol::FrameParser(protocol::kMaxHandshakeReply);
    pending_ = {};
    receive_timeout_ = Store::Duration(0);
  }

  void handshake(const Deadline& connect_deadline) {
    // Give the handshake a moment even when connecting used up the deadline.
    Deadline deadline(std::max(connect_deadline.remaining(), Store::Duration(2000)));
    const std::string client_nonce = protocol::make_nonce();
    protocol::Request hello;
    hello.op = Op::kHello;
    hello.nonce = client_nonce;
    hello.client_id = client_id_;
    exchange("TcpStore", hello, deadline);
    limits_ = reply_.limits;
    if (reply_.nonce.empty()) {
      // A server without the token cannot prove it is the real one: with a
      // token, refuse it (it may be a process that took the port first).
      if (!options_.token.empty()) {
        throw AuthError("TcpStore", fmt::format("the store at {} does not authenticate itself, "
                                                "but a token was given: refusing to trust it",
                                                where_));
      }
    } else {
      if (options_.token.empty()) {
        throw AuthError("TcpStore",
                        fmt::format("the store at {} requires a token and none was given", where_));
      }
      const std::string server_nonce(reply_.nonce);
      if (!protocol::verify_auth(protocol::Direction::kServer, options_.token, client_nonce,
                                 server_nonce, reply_.server_mac)) {
        throw AuthError("TcpStore", fmt::format("the store at {} failed to prove it holds the "
                                                "token (a different token, or an impostor)",
                                                where_));
      }
      protocol::Request auth;
      auth.op = Op::kAuth;
      auto mac = protocol::auth_mac(protocol::Direction::kClient, options_.token, client_nonce,
                                    server_nonce);
      auth.mac = mac;
      exchange("TcpStore", auth, deadline);
    }
    parser_.set_max_frame_size(~std::uint32_t{0});
  }

  void check_limits(const char* origin, const protocol::Request& q) {
    auto key_ok = [&](std::string_view k) {
      if (k.size() > limits_.max_key_size) {
        throw InvalidArgument(origin, fmt::format("key of {} bytes exceeds the server's limit "
                                                  "of {} bytes",
                                                  k.size(), limits_.max_key_size));
      }
    };
    auto value_ok = [&](std::string_view v) {
      if (v.size() > limits_.max_value_size) {
        throw InvalidArgument(origin, fmt::format("value of {} bytes exceeds the server's "
                                                  "limit of {} bytes",
                                                  v.size(), limits_.max_value_size));
      }
    };
    key_ok(q.key);
    value_ok(q.value);
    value_ok(q.desired);
    for (auto k : q.keys) key_ok(k);
    for (auto v : q.values) value_ok(v);
  }

  void exchange(const char* origin, const protocol::Request& request, const Deadline& deadline) {
    if (fd_ < 0) {
      throw NetworkError(origin, fmt::format("connection to the store at {} lost: {}", where_,
                                             broken_.empty() ? "not connected" : broken_));
    }
    if (request.op != Op::kHello && request.op != Op::kAuth) check_limits(origin, request);
    out_.clear();
    protocol::encode_request(out_, request);
    if (request.op != Op::kHello && out_.size() - protocol::kHeaderSize > limits_.max_frame_size) {
      throw InvalidArgument(
          origin, fmt::format("request of {} bytes exceeds the server's frame "
                              "limit of {} bytes",
                              out_.size() - protocol::kHeaderSize, limits_.max_frame_size));
    }
    send_all(origin, deadline);
    receive(origin, request.op, deadline);
    if (reply_.status != Status::kOk) {
      std::string message(reply_.message);
      if (protocol::closes_connection(reply_.status)) {
        broken_ = fmt::format("server closed the connection: {}", message);
        close_fd();
        if (retry_after(reply_.status) && request.op != Op::kHello && request.op != Op::kAuth) {
          throw ConnectionLost(
              origin, fmt::format("connection to the store at {} lost: {}", where_, broken_));
        }
      }
      throw_error(protocol::error_kind(reply_.status), origin, message);
    }
  }

  void send_all(const char* origin, const Deadline& deadline) {
    std::size_t sent = 0;
    while (sent < out_.size()) {
      ssize_t n = ::send(fd_, out_.data() + sent, out_.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) {
        sent += static_cast<std::size_t>(n);
        continue;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait_fd(fd_, POLLOUT, deadline)) broken(origin, "timed out sending a request");
        continue;
      }
      broken(origin, errno_text(errno));
    }
  }

  // Sets SO_RCVTIMEO to the time left, unless the current setting does not
  // overshoot the deadline and does not wake up too often: an early wake-up only
  // loops and re-checks the deadline, so a setting of at least
  // kKeptReceiveTimeout (or half the time left) is kept. Consecutive calls with
  // different timeouts (plain calls, blocking gets) thus need no setsockopt.
  void arm_receive_timeout(const Deadline& deadline) {
    auto left = std::clamp(deadline.remaining(), Store::Duration(1), kMaxReceiveTimeout);
    if (receive_timeout_ > Store::Duration(0) && receive_timeout_ <= left + Store::Duration(20) &&
        (receive_timeout_ >= left / 2 || receive_timeout_ >= kKeptReceiveTimeout)) {
      return;
    }
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(left.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((left.count() % 1000) * 1000);
    if (::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0) receive_timeout_ = left;
  }

  void receive(const char* origin, Op op, const Deadline& deadline) {
    while (true) {
      if (!pending_.empty()) {
        auto state = parser_.consume(pending_);
        if (state == protocol::FrameParser::State::kGood) {
          auto result = protocol::decode_reply(op, parser_.payload(), reply_);
          if (!result.ok()) {
            broken_ = "malformed reply: " + result.message;
            close_fd();
            throw ProtocolError(origin, fmt::format("malformed reply from the store at {}: {}",
                                                    where_, result.message));
          }
          return;
        }
        if (state == protocol::FrameParser::State::kBad) {
          broken_ = "bad reply frame: " + parser_.error().message;
          close_fd();
          throw ProtocolError(origin, fmt::format("bad reply frame from the store at {}: {}",
                                                  where_, parser_.error().message));
        }
      }
      // A blocking recv bounded by SO_RCVTIMEO: one syscall per reply instead of
      // poll + recv. It returns at once when the server dies (EOF or reset).
      if (deadline.expired())
        broken(origin, fmt::format("no reply to {} in time", protocol::to_string(op)));
      arm_receive_timeout(deadline);
      ssize_t n = ::recv(fd_, read_buf_.get(), kReadChunk, 0);
      if (n > 0) {
        pending_ = std::string_view(read_buf_.get(), static_cast<std::size_t>(n));
        continue;
      }
      if (n == 0) broken(origin, "the server closed the connection");
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      broken(origin, errno_text(errno));
    }
  }

  TcpStoreOptions options_;
  std::string client_id_;  // the same on every connection of this client
  std::uint64_t last_request_id_ = 0;
  int last_errno_ = 0;       // of the last failed connect
  std::string lost_reason_;  // why the connection being re-established was lost
  std::string where_;
  std::mutex mutex_;
  int fd_ = -1;
  std::string broken_;
  protocol::Limits limits_;
  protocol::FrameParser parser_;
  std::unique_ptr<char[]> read_buf_;
  std::string_view pending_;            // received bytes not parsed yet (inside read_buf_)
  Store::Duration receive_timeout_{0};  // the socket's SO_RCVTIMEO (0: none)
  std::string out_;
  protocol::Reply reply_;
};

// ---- TcpStore ----------------------------------------------------------------------

TcpStore::TcpStore(const TcpStoreOptions& options)
    : Store(options.timeout), connection_(std::make_unique<Connection>(options)) {}

TcpStore::~TcpStore() = default;

const TcpStoreOptions& TcpStore::options() const { return connection_->options(); }

namespace {

Deadline plain_deadline(Store::Duration default_timeout) {
  return Deadline(std::max(default_timeout, kMinReplyTimeout));
}

}  // namespace

void TcpStore::set(const std::string& key, const std::string& value) {
  protocol::Request q;
  q.op = Op::kSet;
  q.key = key;
  q.value = value;
  connection_->call("TcpStore::set", std::move(q), plain_deadline(timeout()),
                    [](auto&) { return 0; });
}

std::string TcpStore::get(const std::string& key, Duration timeout) {
  protocol::Request q;
  q.op = Op::kGet;
  q.key = key;
  q.timeout_ms = wire_timeout(timeout);
  return connection_->call("TcpStore::get", std::move(q),
                           reply_deadline(q.timeout_ms, this->timeout()),
                           [](const protocol::Reply& r) { return std::string(r.value); });
}

std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) {
  protocol::Request q;
  q.op = Op::kAdd;
  q.key = key;
  q.delta = delta;
  return connection_->call("TcpStore::add", std::move(q), plain_deadline(timeout()),
                           [](const protocol::Reply& r) { return r.integer; });
}

std::string TcpStore::compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  protocol::Request q;
  q.op = Op::kCompareSet;
  q.key = key;
  q.value = expected;
  q.desired = desired;
  return connection_->call("TcpStore::compare_set", std::move(q), plain_deadline(timeout()),
                           [](const protocol::Reply& r) { return std::string(r.value); });
}

// The key lists of wait, check, multi_get and multi_set go in runs of at most
// kMaxKeysPerRequest keys, one request each (the server refuses longer ones);
// a blocking run gets the time the call has left.
namespace {

template <typename Run>
void for_each_run(std::size_t count, Run&& run) {
  for (std::size_t begin = 0; begin < count || begin == 0; begin += protocol::kMaxKeysPerRequest) {
    run(begin, std::min(count, begin + protocol::kMaxKeysPerRequest));
    if (count == 0) return;
  }
}

// What is left of `timeout` since `start` (never negative).
Store::Duration time_left(Store::Duration timeout, std::chrono::steady_clock::time_point start) {
  auto spent =
      std::chrono::duration_cast<Store::Duration>(std::chrono::steady_clock::now() - start);
  return spent >= timeout ? Store::Duration(0) : timeout - spent;
}

}  // namespace

void TcpStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  const auto start = std::chrono::steady_clock::now();
  for_each_run(keys.size(), [&](std::size_t begin, std::size_t end) {
    protocol::Request q;
    q.op = Op::kWait;
    q.keys.assign(keys.begin() + static_cast<std::ptrdiff_t>(begin),
                  keys.begin() + static_cast<std::ptrdiff_t>(end));
    q.timeout_ms = wire_timeout(begin == 0 ? timeout : time_left(timeout, start));
    connection_->call("TcpStore::wait", std::move(q), reply_deadline(q.timeout_ms, this->timeout()),
                      [](auto&) { return 0; });
  });
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  bool all = true;
  for_each_run(keys.size(), [&](std::size_t begin, std::size_t end) {
    if (!all) return;
    protocol::Request q;
    q.op = Op::kCheck;
    q.keys.assign(keys.begin() + static_cast<std::ptrdiff_t>(begin),
                  keys.begin() + static_cast<std::ptrdiff_t>(end));
    all = connection_->call("TcpStore::check", std::move(q), plain_deadline(timeout()),
                            [](const protocol::Reply& r) { return r.flag; });
  });
  return all;
}

bool TcpStore::delete_key(const std::string& key) {
  protocol::Request q;
  q.op = Op::kDeleteKey;
  q.key = key;
  return connection_->call("TcpStore::delete_key", std::move(q), plain_deadline(timeout()),
                           [](const protocol::Reply& r) { return r.flag; });
}

std::int64_t TcpStore::num_keys() {
  protocol::Request q;
  q.op = Op::kNumKeys;
  return connection_->call("TcpStore::num_keys", std::move(q), plain_deadline(timeout()),
                           [](const protocol::Reply& r) { return r.integer; });
}

std::vector<std::string> TcpStore::multi_get(const std::vector<std::string>& keys,
                                             Duration timeout) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> values;
  values.reserve(keys.size());
  for_each_run(keys.size(), [&](std::size_t begin, std::size_t end) {
    protocol::Request q;
    q.op = Op::kMultiGet;
    q.keys.assign(keys.begin() + static_cast<std::ptrdiff_t>(begin),
                  keys.begin() + static_cast<std::ptrdiff_t>(end));
    q.timeout_ms = wire_timeout(begin == 0 ? timeout : time_left(timeout, start));
    const std::size_t asked = end - begin;
    connection_->call("TcpStore::multi_get", std::move(q),
                      reply_deadline(q.timeout_ms, this->timeout()), [&](const protocol::Reply& r) {
                        if (r.values.size() != asked) {
                          throw ProtocolError("TcpStore::multi_get",
                                              fmt::format("asked for {} keys, got {} values", asked,
                                                          r.values.size()));
                        }
                        values.insert(values.end(), r.values.begin(), r.values.end());
                        return 0;
                      });
  });
  return values;
}

void TcpStore::multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) {
  store_util::check_multi_set(keys, values, "TcpStore::multi_set");
  for_each_run(keys.size(), [&](std::size_t begin, std::size_t end) {
    protocol::Request q;
    q.op = Op::kMultiSet;
    q.keys.assign(keys.begin() + static_cast<std::ptrdiff_t>(begin),
                  keys.begin() + static_cast<std::ptrdiff_t>(end));
    q.values.assign(values.begin() + static_cast<std::ptrdiff_t>(begin),
                    values.begin() + static_cast<std::ptrdiff_t>(end));
    connection_->call("TcpStore::multi_set", std::move(q), plain_deadline(timeout()),
                      [](auto&) { return 0; });
  });
}

void TcpStore::append(const std::string& key, const std::string& value) {
  protocol::Request q;
  q.op = Op::kAppend;
  q.key = key;
  q.value = value;
  connection_->call("TcpStore::append", std::move(q), plain_deadline(timeout()),
                    [](auto&) { return 0; });
}

}  // namespace ddp
