#include "etcd_connection.h"

#include <fmt/format.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <boost/asio/post.hpp>

#include "ddp/common/host_port.h"
#include "etcd_connection_impl.h"

namespace ddp::etcd {

namespace {

bool is_ip_literal(const std::string& host) {
  error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

}  // namespace

std::string endpoint_text(const EtcdEndpoint& endpoint) {
  return join_host_port(endpoint.host, std::to_string(endpoint.port));
}

std::string failure_text(const error_code& ec, const Deadline& deadline) {
  if (ec == asio::error::timed_out) {
    return deadline.expired() ? "no reply in time" : "timed out";
  }
  if (ec == http::error::end_of_stream || ec == asio::error::eof) return "connection closed";
  return ec.message();
}

[[noreturn]] void throw_read_failure(const error_code& ec, const Deadline& deadline,
                                     const std::string& where, std::size_t limit, bool stale) {
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

HttpReply Connection::post(const std::string& target, const std::string& body,
                           const std::string& token, const Deadline& first_byte,
                           const Deadline& deadline) {
  HttpReply reply;
  reply.status = post_stream(target, body, token, deadline, &first_byte);
  reply.body = stream_rest(deadline);
  return reply;
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

}  // namespace ddp::etcd
