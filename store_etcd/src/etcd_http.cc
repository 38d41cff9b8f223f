#include "etcd_http.h"

#include <fmt/format.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <functional>
#include <limits>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/core/detail/base64.hpp>
#include <boost/beast/http.hpp>

#include <boost/beast/ssl.hpp>
#include "ddp/common/json.h"
#include "ddp/common/host_port.h"
#include "ddp/common/logging.h"
#include "ddp/common/text.h"

namespace ddp::etcd {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

namespace {

// One attempt of a unary call (connect, authenticate, request, reply) takes at
// most this long; a dead or partitioned member is left after it.
constexpr Duration kMaxAttempt = std::chrono::seconds(15);
constexpr Duration kMinAttempt = std::chrono::seconds(1);
// etcd answers a request once it is applied, within milliseconds when the
// cluster is healthy. A member without a leader holds a request for its own
// timeout (7 s at the default election timeout): a reply that has not started
// after this long (plus a second per MiB sent) is given up on and the
// request is sent to the next endpoint.
constexpr Duration kReplyStart = std::chrono::seconds(3);

Deadline first_byte_deadline(const Deadline& attempt, std::size_t request_bytes) {
  Duration wait = kReplyStart + Duration(1000 * static_cast<std::int64_t>(request_bytes >> 20));
  return Deadline(std::min(wait, attempt.remaining()));
}
// The token expired more often than this within one call: give up.
constexpr int kMaxReauth = 3;
// The constructor's check that the endpoint serves the KV API (and that the
// credentials work): a count of the single key "\0" (base64 "AA==").
constexpr const char* kProbePath = "/v3/kv/range";
const std::string kProbeBody = R"({"count_only":true,"key":"AA=="})";
// A fresh connection's first request: the member's status, which etcd answers
// without a token and whose header names the cluster, so that no credential
// is sent to a member of another cluster. It also says whether the member
// knows a leader.
constexpr const char* kStatusPath = "/v3/maintenance/status";
const std::string kStatusBody = "{}";

// The server's certificate did not verify: final, not retried.
class CertificateError : public AuthError {
 public:
  explicit CertificateError(const std::string& message) : AuthError("", message) {}
};

// What a connection buffers before the parser takes it (a read's worth).
constexpr std::size_t kMaxUnparsed = 64 * 1024;

// The token was refused as expired or invalid: authenticate again and retry.
class TokenExpired : public std::exception {};

bool is_ip_literal(const std::string& host) {
  error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

// {"error":"...","message":"...","code":N} (unary) or
// {"error":{"grpc_code":N,"message":"..."}} (a message of a stream).
// Fields of any type are read without throwing (a reply is not trusted).
std::pair<int, std::string> error_fields(const Json& reply) {
  auto string_of = [](const Json& object, const char* field) -> std::string {
    auto it = object.find(field);
    return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto code_of = [](const Json& object, const char* field) {
    auto it = object.find(field);
    if (it == object.end() || !it->is_number_integer()) return 2;  // gRPC's "unknown"
    const auto code = it->get<std::int64_t>();
    return code >= 0 && code <= 16 ? static_cast<int>(code) : 2;
  };
  const Json& error = reply.at("error");
  if (error.is_object()) {
    std::string message = string_of(error, "message");
    return {code_of(error, "grpc_code"), message.empty() ? "unknown error" : message};
  }
  std::string message = string_of(reply, "message");
  if (message.empty() && error.is_string()) message = error.get<std::string>();
  return {code_of(reply, "code"), message};
}

// The fields of etcd's replies that carry bytes (base64 in the JSON).
bool is_bytes_field(const std::string& name) {
  return name == "key" || name == "value" || name == "range_end";
}

// Throws BadReply naming the first bytes field of `document` that is not
// valid padded base64. Iterative: the document's depth is bounded, but a
// wide one should not cost recursion either.
void check_bytes_fields(const Json& document, const std::string& where) {
  std::vector<const Json*> pending{&document};
  while (!pending.empty()) {
    const Json* node = pending.back();
    pending.pop_back();
    if (node->is_array()) {
      for (const auto& item : *node) pending.push_back(&item);
    } else if (node->is_object()) {
      for (auto it = node->begin(); it != node->end(); ++it) {
        if (it->is_string() && is_bytes_field(it.key()) &&
            !is_padded_base64(it->get_ref<const std::string&>())) {
          throw BadReply(where,
                         fmt::format("sent a \"{}\" that is not valid padded base64", it.key()));
        }
        if (it->is_structured()) pending.push_back(&*it);
      }
    }
  }
}

// `text` as a JSON object whose bytes fields are base64; std::nullopt when it
// is not JSON at all. Throws BadReply for JSON that is not etcd's.
std::optional<Json> parse_object(const std::string& text, const std::string& where) {
  json::Parsed parsed = json::parse_bounded(text);
  if (!parsed.valid) return std::nullopt;
  if (parsed.too_deep) {
    throw BadReply(where, fmt::format("sent JSON nested deeper than {} levels", json::kMaxDepth));
  }
  if (!parsed.value.is_object()) throw BadReply(where, "sent JSON that is not an object");
  check_bytes_fields(parsed.value, where);
  return std::move(parsed.value);
}

}  // namespace

Json decode_reply(const std::string& origin, const std::string& where, const std::string& path,
                  const HttpReply& reply) {
  auto parsed = parse_object(reply.body, where);
  if (parsed && parsed->contains("error")) {
    auto [code, message] = error_fields(*parsed);
    ErrorClass cls = classify(code, message);
    if (cls.reauth) throw TokenExpired();
    if (cls.retry) throw ConnectionFailed(message, false);
    throw_reply_error(origin, where, code, message);
  }
  if (reply.status == 200 && parsed) return *std::move(parsed);
  if (reply.status >= 500 && !parsed) {
    throw ConnectionFailed(fmt::format("HTTP {} from POST {}", reply.status, path), false);
  }
  throw BadReply(
      where, fmt::format("is not an etcd v3 HTTP gateway (POST {} answered HTTP {}{})", path,
                         reply.status, reply.status == 200 ? " with a body that is not JSON" : ""));
}

Json decode_stream_message(const std::string& where, const std::string& line) {
  auto parsed = parse_object(line, where);
  if (!parsed) throw BadReply(where, "sent a watch message that is not JSON");
  return *std::move(parsed);
}

// ---------------------------------------------------------------------------
// Helpers

std::string base64_encode(std::string_view bytes) {
  std::string out(beast::detail::base64::encoded_size(bytes.size()), '\0');
  out.resize(beast::detail::base64::encode(out.data(), bytes.data(), bytes.size()));
  return out;
}

namespace {

// The value of a base64 digit, or -1.
int base64_digit(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

bool is_padded_base64(std::string_view text) {
  if (text.size() % 4 != 0) return false;
  std::size_t padding = 0;
  while (padding < 2 && padding < text.size() && text[text.size() - 1 - padding] == '=') ++padding;
  for (std::size_t i = 0; i + padding < text.size(); ++i) {
    if (base64_digit(text[i]) < 0) return false;
  }
  return true;
}

std::string base64_decode(std::string_view text) {
  if (!is_padded_base64(text)) {
    throw ProtocolError("EtcdStore", "etcd sent bytes that are not valid padded base64");
  }
  std::size_t padding = 0;
  while (padding < 2 && padding < text.size() && text[text.size() - 1 - padding] == '=') ++padding;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  std::uint32_t bits = 0;
  int have = 0;
  for (std::size_t i = 0; i + padding < text.size(); ++i) {
    bits = (bits << 6) | static_cast<std::uint32_t>(base64_digit(text[i]));
    have += 6;
    if (have >= 8) {
      have -= 8;
      out.push_back(static_cast<char>((bits >> have) & 0xff));
    }
  }
  return out;
}

std::int64_t json_int(const Json& object, const char* field) {
  auto it = object.find(field);
  if (it == object.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_string()) {
    const auto& text = it->get_ref<const std::string&>();
    std::int64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec == std::errc() && end == text.data() + text.size() && !text.empty()) return value;
  }
  throw ProtocolError("EtcdStore",
                      fmt::format("etcd sent a field {} that is not an integer", field));
}

std::string json_bytes(const Json& object, const char* field) {
  auto it = object.find(field);
  if (it == object.end() || !it->is_string()) return {};
  return base64_decode(it->get<std::string>());
}

bool json_flag(const Json& object, const char* field) {
  auto it = object.find(field);
  return it != object.end() && it->is_boolean() && it->get<bool>();
}

std::string json_string(const Json& object, const char* field, const std::string& otherwise) {
  auto it = object.find(field);
  return it != object.end() && it->is_string() ? it->get<std::string>() : otherwise;
}

std::string prefix_range_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

std::string endpoint_text(const EtcdEndpoint& endpoint) {
  return join_host_port(endpoint.host, std::to_string(endpoint.port));
}

ErrorClass classify(int code, const std::string& message) {
  if (message.find("invalid auth token") != std::string::npos) return {false, true};
  if (code == 14 || code == 4) return {true, false};
  if (code == 8 && message.find("too many requests") != std::string::npos) return {true, false};
  for (const char* again : {"leader changed", "no leader", "server stopped", "request timed out",
                            "raft proposal dropped"}) {
    if (message.find(again) != std::string::npos) return {true, false};
  }
  return {};
}

void throw_reply_error(const std::string& origin, const std::string& where, int code,
                       const std::string& message) {
  const std::string text = fmt::format("etcd at {} refused the request: {}", where, message);
  const bool auth = code == 7 || code == 16 ||
                    message.find("authentication failed") != std::string::npos ||
                    message.find("user name is empty") != std::string::npos ||
                    message.find("permission denied") != std::string::npos;
  if (auth) throw ReplyError<AuthError>(origin, text, code, message);
  if (code == 3 || code == 5 || code == 6 || code == 9 || code == 11) {
    throw ReplyError<InvalidArgument>(origin, text, code, message);
  }
  throw ReplyError<ProtocolError>(origin, text, code, message);
}

// ---------------------------------------------------------------------------
// Connection

struct Connection::Impl {
  asio::io_context ioc;
  ssl::context* tls = nullptr;
  std::unique_ptr<beast::tcp_stream> plain;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> secure;
  // Bytes read but not parsed yet. Bounded: Beast limits the header and the
  // body, not a chunk header or a trailer, which a peer could make endless.
  beast::flat_buffer buffer{kMaxUnparsed};
  std::optional<http::response_parser<http::string_body>> parser;
  std::size_t scanned = 0;  // bytes of the stream's body searched for '\n'
  int requests = 0;
  std::size_t max_reply_bytes = 0;
  std::atomic<bool> cancelled{false};

  bool has_stream() const { return plain || secure; }
  beast::tcp_stream& lowest() { return secure ? beast::get_lowest_layer(*secure) : *plain; }

  template <typename F>
  void with_stream(F&& f) {
    if (secure) {
      f(*secure);
    } else {
      f(*plain);
    }
  }

  void abort_socket() {
    if (!has_stream()) return;
    error_code ec;
    lowest().socket().cancel(ec);
    lowest().socket().close(ec);
  }

  // Cancels what is pending on the socket, which stays open.
  void cancel_socket() {
    if (!has_stream()) return;
    error_code ec;
    lowest().socket().cancel(ec);
  }

  // Starts an asynchronous operation (start(handler)) and runs the io_context
  // until it completes or the deadline passes; then abort() and timed_out,
  // unless `keep` (abort() only cancelled it) and it completed after all.
  template <typename Start, typename Abort>
  error_code run(const Deadline& deadline, Start&& start, Abort&& abort, bool keep = false) {
    if (cancelled) return asio::error::operation_aborted;
    std::optional<error_code> result;
    start([&result](error_code ec, auto&&...) { result = ec; });
    ioc.restart();
    while (!result) {
      Duration left = deadline.remaining();
      if (left <= Duration(0)) break;
      ioc.run_for(std::min<Duration>(left, std::chrono::hours(1)));
      if (ioc.stopped()) ioc.restart();
    }
    if (!result) {
      // Abort until the operation has completed: a composed read (Beast's)
      // may start a new socket read from its completion handler after a
      // partial chunk header, which the first cancel never reached.
      while (!result) {
        abort();
        ioc.restart();
        ioc.run_one();
      }
      ioc.restart();
      ioc.poll();
      if (keep && !*result) return *result;
      return asio::error::timed_out;
    }
    return *result;
  }

  template <typename Start>
  error_code run(const Deadline& deadline, Start&& start) {
    return run(deadline, std::forward<Start>(start), [this] { abort_socket(); });
  }

  void reset() {
    abort_socket();
    plain.reset();
    secure.reset();
    buffer.clear();
    parser.reset();
    scanned = 0;
  }
};

namespace {

std::string failure_text(const error_code& ec, const Deadline& deadline) {
  if (ec == asio::error::timed_out) {
    return deadline.expired() ? "no reply in time" : "timed out";
  }
  if (ec == http::error::end_of_stream || ec == asio::error::eof) return "connection closed";
  return ec.message();
}

// A failed read of a reply: the peer sent something that is not an HTTP reply
// within the limits (BadReply), or the connection broke (ConnectionFailed).
[[noreturn]] void throw_read_failure(const error_code& ec, const Deadline& deadline,
                                     const std::string& where, std::size_t limit,
                                     bool stale = false) {
  if (ec == http::error::body_limit) {
    throw BadReply(where,
                   fmt::format("sent a reply body of more than {} bytes (max_reply_bytes)", limit));
  }
  if (ec == http::error::buffer_overflow) {
    throw BadReply(
        where, fmt::format("sent a chunk header or trailer of more than {} bytes", kMaxUnparsed));
  }
  const bool from_parser = ec.category() == error_code(http::error::end_of_stream).category();
  const bool broken =
      !from_parser || ec == http::error::end_of_stream || ec == http::error::partial_message;
  if (!broken) throw BadReply(where, "sent a reply that is not HTTP/1.1: " + ec.message());
  throw ConnectionFailed(failure_text(ec, deadline), stale);
}

}  // namespace

Connection::Connection(EtcdEndpoint endpoint, boost::asio::ssl::context* tls,
                       std::size_t max_reply_bytes)
    : endpoint_(std::move(endpoint)), where_(endpoint_text(endpoint_)), impl_(new Impl) {
  impl_->tls = tls;
  impl_->max_reply_bytes = max_reply_bytes;
}

std::unique_ptr<Connection> Connection::adopt(int fd, EtcdEndpoint endpoint,
                                              std::size_t max_reply_bytes) {
  auto connection = std::make_unique<Connection>(std::move(endpoint), nullptr, max_reply_bytes);
  Impl& d = *connection->impl_;
  d.plain = std::make_unique<beast::tcp_stream>(d.ioc);
  error_code ec;
  d.plain->socket().assign(tcp::v4(), fd, ec);
  if (ec) {
    ::close(fd);
    throw ConnectionFailed("cannot adopt the socket: " + ec.message(), false);
  }
  return connection;
}

Connection::~Connection() { impl_->reset(); }

bool Connection::is_open() const {
  return impl_->has_stream() && impl_->lowest().socket().is_open() && !impl_->cancelled;
}

void Connection::open(const Deadline& deadline) {
  Impl& d = *impl_;
  d.reset();
  std::vector<tcp::endpoint> targets;
  error_code ec;
  auto address = asio::ip::make_address(endpoint_.host, ec);
  if (!ec) {
    targets.emplace_back(address, endpoint_.port);
  } else {
    tcp::resolver resolver(d.ioc);
    tcp::resolver::results_type results;
    ec = d.run(
        deadline,
        [&](auto handler) {
          resolver.async_resolve(
              endpoint_.host, std::to_string(endpoint_.port),
              [&results, handler](error_code e, tcp::resolver::results_type r) mutable {
                results = std::move(r);
                handler(e);
              });
        },
        [&] { resolver.cancel(); });
    if (ec) throw ConnectionFailed("cannot resolve the host: " + failure_text(ec, deadline), false);
    for (const auto& entry : results) targets.push_back(entry.endpoint());
  }
  if (d.tls) {
    d.secure = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(d.ioc, *d.tls);
  } else {
    d.plain = std::make_unique<beast::tcp_stream>(d.ioc);
  }
  ec = d.run(deadline, [&](auto handler) {
    d.lowest().async_connect(targets,
                             [handler](error_code e, const tcp::endpoint&) mutable { handler(e); });
  });
  if (ec) throw ConnectionFailed(failure_text(ec, deadline), false);
  d.lowest().socket().set_option(tcp::no_delay(true), ec);
  if (!d.secure) return;

  SSL* ssl = d.secure->native_handle();
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (is_ip_literal(endpoint_.host)) {
    X509_VERIFY_PARAM_set1_ip_asc(param, endpoint_.host.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl, endpoint_.host.c_str());
    X509_VERIFY_PARAM_set1_host(param, endpoint_.host.c_str(), 0);
  }
  d.secure->set_verify_mode(ssl::verify_peer);
  ec = d.run(deadline,
             [&](auto handler) { d.secure->async_handshake(ssl::stream_base::client, handler); });
  if (!ec) return;
  long verify = SSL_get_verify_result(ssl);
  if (verify != X509_V_OK) {
    throw CertificateError(fmt::format("the TLS certificate of {} failed verification: {}", where_,
                                       X509_verify_cert_error_string(verify)));
  }
  throw ConnectionFailed("TLS handshake failed: " + failure_text(ec, deadline), false);
}

namespace {

http::request<http::string_body> make_request(const std::string& where, const std::string& target,
                                              const std::string& body, const std::string& token) {
  http::request<http::string_body> request{http::verb::post, target, 11};
  request.set(http::field::host, where);
  request.set(http::field::content_type, "application/json");
  if (!token.empty()) request.set(http::field::authorization, token);
  request.keep_alive(true);
  request.body() = body;
  request.prepare_payload();
  return request;
}

}  // namespace

int Connection::post_stream(const std::string& target, const std::string& body,
                            const std::string& token, const Deadline& deadline,
                            const Deadline* first_byte, bool endless) {
  Impl& d = *impl_;
  if (!is_open()) throw ConnectionFailed("connection closed", false);
  const bool reused = d.requests++ > 0;
  auto request = make_request(where_, target, body, token);
  error_code ec = d.run(deadline, [&](auto handler) {
    d.with_stream([&](auto& stream) { http::async_write(stream, request, handler); });
  });
  if (ec) {
    d.reset();
    throw ConnectionFailed(failure_text(ec, deadline), reused);
  }
  d.parser.emplace();
  // Set before the header is read: Beast checks a Content-Length against it
  // there, and the body's string reserves that length right after. The
  // header keeps Beast's own bound (8 KiB).
  d.parser->body_limit(static_cast<std::uint64_t>(d.max_reply_bytes));
  d.scanned = 0;
  const Deadline& header_deadline = first_byte ? *first_byte : deadline;
  ec = d.run(header_deadline, [&](auto handler) {
    d.with_stream(
        [&](auto& stream) { http::async_read_header(stream, d.buffer, *d.parser, handler); });
  });
  if (ec) {
    // Stale: a kept-alive connection the server had closed answers at once
    // with a reset or an EOF. A reply that did not start in time is the
    // member's silence, not staleness: no second try on it.
    const bool stale = reused && !d.parser->got_some() && ec != asio::error::timed_out;
    d.reset();
    throw_read_failure(ec, header_deadline, where_, d.max_reply_bytes, stale);
  }
  // A watch's chunked body never ends: it is bounded per message instead (next_line).
  if (endless && d.parser->chunked()) d.parser->body_limit(boost::none);
  return static_cast<int>(d.parser->get().result_int());
}

std::string Connection::stream_rest(const Deadline& deadline) {
  Impl& d = *impl_;
  if (!d.parser) throw ConnectionFailed("no reply", false);
  if (!d.parser->is_done()) {
    error_code ec = d.run(deadline, [&](auto handler) {
      d.with_stream([&](auto& stream) { http::async_read(stream, d.buffer, *d.parser, handler); });
    });
    if (ec) {
      d.reset();
      throw_read_failure(ec, deadline, where_, d.max_reply_bytes);
    }
  }
  std::string body = std::move(d.parser->get().body());
  if (!d.parser->keep_alive()) d.reset();
  return body;
}

HttpReply Connection::post(const std::string& target, const std::string& body,
                           const std::string& token, const Deadline& first_byte,
                           const Deadline& deadline) {
  HttpReply reply;
  reply.status = post_stream(target, body, token, deadline, &first_byte);
  reply.body = stream_rest(deadline);
  return reply;
}

std::optional<std::string> Connection::next_line(const Deadline& deadline) {
  Impl& d = *impl_;
  if (!d.parser) throw ConnectionFailed("no stream", false);
  for (;;) {
    std::string& body = d.parser->get().body();
    auto newline = body.find('\n', d.scanned);
    if (newline != std::string::npos) {
      std::string line = body.substr(0, newline);
      body.erase(0, newline + 1);
      d.scanned = 0;
      if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
      return line;
    }
    d.scanned = body.size();
    if (body.size() > d.max_reply_bytes) {
      d.reset();
      throw BadReply(where_,
                     fmt::format("sent a watch message of more than {} bytes (max_reply_bytes)",
                                 d.max_reply_bytes));
    }
    if (d.parser->is_done()) {
      if (!body.empty()) {
        std::string line = std::move(body);
        body.clear();
        d.scanned = 0;
        return line;
      }
      d.reset();
      throw ConnectionFailed("the stream ended", false);
    }
    // At the deadline the read is cancelled, not the connection: a silent
    // stream stays usable while the caller checks on its member.
    error_code ec = d.run(
        deadline,
        [&](auto handler) {
          d.with_stream(
              [&](auto& stream) { http::async_read_some(stream, d.buffer, *d.parser, handler); });
        },
        [&d] { d.cancel_socket(); }, /*keep=*/true);
    // (run() reports timed_out only for the deadline, which may be a fraction
    // of a millisecond short of expired() then.)
    if (ec == asio::error::timed_out && d.has_stream()) return std::nullopt;
    if (ec) {
      d.reset();
      throw_read_failure(ec, deadline, where_, d.max_reply_bytes);
    }
  }
}

void Connection::cancel() {
  impl_->cancelled = true;
  Impl* d = impl_.get();
  asio::post(d->ioc, [d] { d->abort_socket(); });
}

void Connection::close() { impl_->reset(); }

// ---------------------------------------------------------------------------
// Interrupt

void Interrupt::attach(Connection* connection) {
  std::lock_guard lock(mutex_);
  attached_ = connection;
  if (stopped_ && attached_) attached_->cancel();
}

void Interrupt::detach() {
  std::lock_guard lock(mutex_);
  attached_ = nullptr;
}

void Interrupt::stop() {
  std::lock_guard lock(mutex_);
  stopped_ = true;
  if (attached_) attached_->cancel();
  woken_.notify_all();
}

bool Interrupt::sleep_for(Duration duration) {
  std::unique_lock lock(mutex_);
  woken_.wait_for(lock, duration, [&] { return stopped_.load(); });
  return !stopped_;
}

// ---------------------------------------------------------------------------
// Transport

namespace {

std::unique_ptr<ssl::context> make_tls_context(const EtcdStoreOptions& options) {
  auto context = std::make_unique<ssl::context>(ssl::context::tls_client);
  context->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3);
  auto load = [](const char* what, const std::string& file, auto&& fn) {
    try {
      fn();
    } catch (const boost::system::system_error& e) {
      throw InvalidArgument("EtcdStore",
                            fmt::format("cannot load the TLS {} {}: {}", what, file, e.what()));
    }
  };
  if (options.ca_file.empty()) {
    load("default CA paths", "", [&] { context->set_default_verify_paths(); });
  } else {
    load("CA file", options.ca_file, [&] { context->load_verify_file(options.ca_file); });
  }
  if (!options.cert_file.empty()) {
    load("certificate", options.cert_file,
         [&] { context->use_certificate_chain_file(options.cert_file); });
    const std::string& key = options.key_file.empty() ? options.cert_file : options.key_file;
    load("key", key, [&] { context->use_private_key_file(key, ssl::context::pem); });
  }
  context->set_verify_mode(ssl::verify_peer);
  return context;
}

Duration attempt_limit(Duration retry_limit,
                       const std::optional<Clock::time_point>& failing_since) {
  Duration limit = std::clamp(retry_limit, kMinAttempt, kMaxAttempt);
  if (!failing_since) return limit;
  auto spent = std::chrono::duration_cast<Duration>(Clock::now() - *failing_since);
  return std::clamp(retry_limit - spent, Duration(200), limit);
}

}  // namespace

Transport::Transport(EtcdStoreOptions options) : options_(std::move(options)) {
  if (options_.endpoints.empty()) throw InvalidArgument("EtcdStore", "no etcd endpoints given");
  for (const auto& endpoint : options_.endpoints) {
    if (endpoint.host.empty() || endpoint.port == 0) {
      throw InvalidArgument("EtcdStore",
                            fmt::format("bad etcd endpoint '{}'", endpoint_text(endpoint)));
    }
  }
  if (options_.max_reply_bytes < 4096) {
    throw InvalidArgument("EtcdStore", "max_reply_bytes must be at least 4096");
  }
  if (options_.watch_check_interval <= Duration(0)) {
    throw InvalidArgument("EtcdStore", "watch_check_interval must be positive");
  }
  last_reasons_.resize(options_.endpoints.size());
  if (options_.tls) tls_ = make_tls_context(options_);
  if (!options_.tls && !options_.username.empty()) {
    log::get("etcd")->warn(
        "etcd user '{}' authenticates over plain http: its password crosses the "
        "network to {} in clear text (use --rdzv_conf protocol=https)",
        options_.username, endpoints_text());
  }
}

Transport::~Transport() = default;

std::string Transport::endpoints_text() const {
  std::string text;
  for (const auto& endpoint : options_.endpoints) {
    if (!text.empty()) text += ',';
    text += endpoint_text(endpoint);
  }
  return text;
}

EtcdEndpoint Transport::current_endpoint() {
  std::lock_guard lock(state_mutex_);
  return options_.endpoints[current_];
}

std::string Transport::token() {
  std::lock_guard lock(state_mutex_);
  return token_;
}

std::size_t Transport::index_of(const EtcdEndpoint& endpoint) const {
  for (std::size_t i = 0; i < options_.endpoints.size(); ++i) {
    const auto& e = options_.endpoints[i];
    if (e.host == endpoint.host && e.port == endpoint.port) return i;
  }
  return options_.endpoints.size();
}

void Transport::endpoint_failed(const EtcdEndpoint& endpoint, const std::string& reason) {
  const std::size_t i = index_of(endpoint);
  if (i == options_.endpoints.size()) return;
  std::lock_guard lock(state_mutex_);
  last_reasons_[i] = reason;
  if (current_ == i) current_ = (i + 1) % options_.endpoints.size();
}

void Transport::give_up(const std::string& origin, Duration limit) {
  std::string reasons;
  {
    std::lock_guard lock(state_mutex_);
    for (std::size_t i = 0; i < options_.endpoints.size(); ++i) {
      if (!reasons.empty()) reasons += "; ";
      reasons += endpoint_text(options_.endpoints[i]) + ": " +
                 (last_reasons_[i].empty() ? std::string("not tried") : last_reasons_[i]);
    }
  }
  throw NetworkError(origin, fmt::format("no etcd endpoint answered within {} s ({})",
                                         seconds_text(limit), reasons));
}

void Transport::authenticate(Connection& connection, const std::string& origin,
                             const Deadline& deadline) {
  Json body = {{"name", options_.username}, {"password", options_.password}};
  HttpReply reply = connection.post("/v3/auth/authenticate", body.dump(), "",
                                    first_byte_deadline(deadline, 0), deadline);
  Json result;
  try {
    result = decode_reply(origin, connection.where(), "/v3/auth/authenticate", reply);
  } catch (const InvalidArgument& e) {
    const ReplyInfo* info = reply_info(e);
    if (!info || info->etcd_message().find("authentication is not enabled") == std::string::npos)
      throw;
    return;  // the cluster has no authentication: go on without a token
  }
  auto token = result.find("token");
  std::lock_guard lock(state_mutex_);
  token_ = token != result.end() && token->is_string() ? token->get<std::string>() : std::string();
}

Json Transport::check_member(Connection& connection, const std::string& origin,
                             const Deadline& deadline) {
  HttpReply reply =
      connection.post(kStatusPath, kStatusBody, "", first_byte_deadline(deadline, 0), deadline);
  Json status = decode_reply(origin, connection.where(), kStatusPath, reply);
  check_cluster(status, connection.where());
  return status;
}

void Transport::prepare(Connection& connection, const std::string& origin,
                        const Deadline& deadline) {
  connection.open(deadline);
  // The cluster first: no password goes to a member of another cluster.
  check_member(connection, origin, deadline);
  if (!options_.username.empty() && token().empty()) authenticate(connection, origin, deadline);
}

bool Transport::from_this_cluster(const Json& reply) {
  auto header = reply.find("header");
  if (header == reply.end() || !header->is_object()) return true;
  auto field = header->find("cluster_id");
  if (field == header->end() || !field->is_string()) return true;
  const std::string& id = field->get_ref<const std::string&>();
  if (id.empty()) return true;
  std::lock_guard lock(state_mutex_);
  if (cluster_id_.empty()) cluster_id_ = id;
  return id == cluster_id_;
}

void Transport::check_cluster(const Json& reply, const std::string& where) {
  // Not a member of the cluster this client talks to (a misconfigured list,
  // or a port another etcd took over): never mix two clusters' keys.
  if (!from_this_cluster(reply)) throw BadReply(where, "belongs to another etcd cluster");
}

Json Transport::attempt(const std::string& origin, const std::string& path, const std::string& body,
                        const Deadline& deadline) {
  const EtcdEndpoint endpoint = current_endpoint();
  const bool same = unary_ && unary_->endpoint().host == endpoint.host &&
                    unary_->endpoint().port == endpoint.port;
  for (int tries = 0;; ++tries) {
    if (!same || !unary_->is_open() || tries > 0) {
      unary_ = std::make_unique<Connection>(endpoint, tls_.get(), options_.max_reply_bytes);
      prepare(*unary_, origin, deadline);
    } else if (!options_.username.empty() && token().empty()) {
      authenticate(*unary_, origin, deadline);  // its cluster was proven when it opened
    }
    try {
      HttpReply reply =
          unary_->post(path, body, token(), first_byte_deadline(deadline, body.size()), deadline);
      Json result = decode_reply(origin, unary_->where(), path, reply);
      check_cluster(result, unary_->where());
      return result;
    } catch (const ConnectionFailed& e) {
      // A kept-alive connection the server had closed: once more on a new one.
      if (!e.stale() || tries > 0) throw;
    }
  }
}

bool Transport::after_failed_attempt(const std::string& origin, const EtcdEndpoint& endpoint,
                                     Failures& failures, std::unique_ptr<Connection>* used) {
  auto drop = [used] {
    if (used) used->reset();
  };
  try {
    throw;
  } catch (const ConnectionFailed& e) {
    drop();
    endpoint_failed(endpoint, e.reason());
    return false;
  } catch (const BadReply& e) {
    drop();
    endpoint_failed(endpoint, e.reason());
    const std::size_t i = index_of(endpoint);
    if (failures.bad.empty()) failures.bad.resize(options_.endpoints.size(), false);
    if (i < failures.bad.size() && !failures.bad[i]) {
      failures.bad[i] = true;
      ++failures.bad_count;
    }
    if (failures.bad_count < options_.endpoints.size()) return false;
    // Every endpoint answered with something that is not etcd's: waiting
    // will not make them etcd.
    std::string reasons;
    {
      std::lock_guard lock(state_mutex_);
      for (std::size_t j = 0; j < options_.endpoints.size(); ++j) {
        reasons += (j ? "; " : "") + endpoint_text(options_.endpoints[j]) + " " + last_reasons_[j];
      }
    }
    throw ProtocolError(origin, reasons);
  } catch (const TokenExpired&) {
    std::lock_guard state(state_mutex_);
    token_.clear();
    if (++failures.reauths <= kMaxReauth) return true;
    throw AuthError(origin, fmt::format("etcd at {} keeps refusing fresh auth tokens",
                                        endpoint_text(endpoint)));
  } catch (const CertificateError& e) {
    drop();
    throw AuthError(origin, e.what());
  } catch (...) {
    drop();
    throw;
  }
}

Json Transport::call(const std::string& origin, const std::string& path, const Json& body,
                     std::optional<Duration> retry_limit) {
  std::lock_guard lock(unary_mutex_);
  const std::string text = body.dump();
  const Duration limit = retry_limit.value_or(options_.request_timeout);
  std::optional<Clock::time_point> failing_since;
  Backoff backoff(Duration(20), Duration(500));
  Failures failures;
  for (;;) {
    const EtcdEndpoint endpoint = current_endpoint();
    try {
      return attempt(origin, path, text, Deadline(attempt_limit(limit, failing_since)));
    } catch (...) {
      if (after_failed_attempt(origin, endpoint, failures, &unary_)) continue;
    }
    auto now = Clock::now();
    if (!failing_since) failing_since = now;
    auto spent = std::chrono::duration_cast<Duration>(now - *failing_since);
    if (spent >= limit) give_up(origin, limit);
    std::this_thread::sleep_for(std::min(backoff.next(), limit - spent));
  }
}

void Transport::probe() {
  std::lock_guard lock(unary_mutex_);
  const Duration limit = options_.connect_timeout;
  Deadline deadline(limit);
  Backoff backoff(Duration(20), Duration(500));
  Failures failures;
  for (bool first = true;; first = false) {
    const EtcdEndpoint endpoint = current_endpoint();
    // A last attempt cut to a few milliseconds would only replace the reason
    // of the previous failure with a timeout.
    if (!first && deadline.remaining() < Duration(100)) give_up("EtcdStore", limit);
    try {
      attempt("EtcdStore", kProbePath, kProbeBody,
              Deadline(std::min(deadline.remaining(), kMaxAttempt)));
      return;
    } catch (...) {
      if (after_failed_attempt("EtcdStore", endpoint, failures, &unary_)) continue;
    }
    if (deadline.expired()) give_up("EtcdStore", limit);
    std::this_thread::sleep_for(std::min(backoff.next(), deadline.remaining()));
  }
}

std::unique_ptr<Connection> Transport::open_stream(const std::string& origin,
                                                   const std::string& path, const Json& body,
                                                   const Deadline& deadline,
                                                   std::optional<Clock::time_point>& failing_since,
                                                   Interrupt* interrupt, Failures* shared) {
  const std::string text = body.dump();
  const Duration limit = options_.request_timeout;
  Backoff backoff(Duration(20), Duration(500));
  Failures own;
  Failures& failures = shared ? *shared : own;
  for (;;) {
    if (interrupt && interrupt->stopped()) return nullptr;
    const EtcdEndpoint endpoint = current_endpoint();
    auto connection = std::make_unique<Connection>(endpoint, tls_.get(), options_.max_reply_bytes);
    if (interrupt) interrupt->attach(connection.get());
    try {
      Deadline attempt(std::min(deadline.remaining(), attempt_limit(limit, failing_since)));
      prepare(*connection, origin, attempt);
      // etcd answers a watch at once (its "created" message): a member that
      // does not is left like a unary call's.
      const Deadline first_byte = first_byte_deadline(attempt, text.size());
      int status =
          connection->post_stream(path, text, token(), attempt, &first_byte, /*endless=*/true);
      if (status == 200) return connection;
      HttpReply reply{status, connection->stream_rest(attempt)};
      decode_reply(origin, connection->where(), path, reply);
      throw BadReply(connection->where(),
                     fmt::format("answered POST {} with HTTP {}", path, status));
    } catch (...) {
      if (interrupt) interrupt->detach();
      // Stopped meanwhile: the failure is ours (the connection was cancelled),
      // not the endpoint's.
      if (interrupt && interrupt->stopped()) return nullptr;
      if (after_failed_attempt(origin, endpoint, failures, nullptr)) continue;
    }
    auto now = Clock::now();
    if (!failing_since) failing_since = now;
    auto spent = std::chrono::duration_cast<Duration>(now - *failing_since);
    if (spent >= limit) give_up(origin, limit);
    if (deadline.expired()) return nullptr;
    Duration pause = std::min({backoff.next(), limit - spent, deadline.remaining()});
    if (interrupt) {
      if (!interrupt->sleep_for(pause)) return nullptr;
    } else {
      std::this_thread::sleep_for(pause);
    }
  }
}

bool Transport::member_answers(const EtcdEndpoint& endpoint,
                               std::unique_ptr<Connection>& connection, const Deadline& deadline,
                               Interrupt* interrupt) {
  try {
    if (!connection || !connection->is_open()) {
      connection = std::make_unique<Connection>(endpoint, tls_.get(), options_.max_reply_bytes);
      if (interrupt) interrupt->attach(connection.get());
      connection->open(deadline);
    } else if (interrupt) {
      interrupt->attach(connection.get());
    }
    HttpReply reply = connection->post(kStatusPath, kStatusBody, "", deadline, deadline);
    if (interrupt) interrupt->detach();
    Json status = decode_reply("EtcdStore", connection->where(), kStatusPath, reply);
    if (!from_this_cluster(status)) return false;
    // A member cut off from the others has no leader: it will see no new write.
    auto leader = status.find("leader");
    return leader != status.end() && leader->is_string() && *leader != "0";
  } catch (const std::exception&) {
    if (interrupt) interrupt->detach();
    connection.reset();
    return false;
  }
}

void Transport::stream_error(const std::string& origin, const std::string& where,
                             const Json& message) {
  auto [code, text] = error_fields(message);
  ErrorClass cls = classify(code, text);
  if (cls.reauth) {
    std::lock_guard lock(state_mutex_);
    token_.clear();
    return;
  }
  if (cls.retry) return;
  throw_reply_error(origin, where, code, text);
}

}  // namespace ddp::etcd
