#include "status_fetch.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <memory>

#include "ddp/common/error.h"
#include "ddp/common/host_port.h"
#include "ddp/common/text.h"

namespace ddp::launcher::status {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

constexpr std::size_t kMaxHeader = 16 * 1024;

std::string without_scheme(std::string_view text) {
  const auto scheme_end = text.find("://");
  if (scheme_end == std::string_view::npos) return std::string(text);
  const std::string_view scheme = text.substr(0, scheme_end);
  if (scheme != "http") {
    throw InvalidArgument("", "'" + std::string(text) + "': the live view speaks " +
                                  "plain http, not " + std::string(scheme));
  }
  return std::string(text.substr(scheme_end + 3));
}

// The request's path for the live view at `path` ("", "/", "/x/", "/status").
std::string status_target(std::string path) {
  if (path.size() >= 7 && path.compare(path.size() - 7, 7, "/status") == 0) return path;
  while (!path.empty() && path.back() == '/') path.pop_back();
  return path + "/status";
}

// The value of "token=" in a query ("a=b&token=T"); empty when none.
std::string token_of(std::string_view query) {
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view part = query.substr(0, amp);
    if (part.rfind("token=", 0) == 0) return std::string(part.substr(6));
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return "";
}

// One GET, driven by the shared io_context; `reply` is written once, when it
// ends (answered, failed or timed out).
class Fetch : public std::enable_shared_from_this<Fetch> {
 public:
  Fetch(asio::io_context& ioc, const StatusUrl& url, std::string token,
        std::chrono::milliseconds timeout, std::size_t max_body, FetchReply& reply)
      : url_(url), token_(std::move(token)), timeout_(timeout), resolver_(ioc), stream_(ioc),
        timer_(ioc), max_body_(max_body), reply_(reply) {
    parser_.header_limit(kMaxHeader);
    parser_.body_limit(max_body);
  }

  void start() {
    auto self = shared_from_this();
    timer_.expires_after(timeout_);
    timer_.async_wait([self](const error_code& ec) {
      if (!ec) self->time_out();
    });
    resolver_.async_resolve(url_.host, url_.port,
                            [self](const error_code& ec, const tcp::resolver::results_type& r) {
                              self->resolved(ec, r);
                            });
  }

 private:
  void time_out() {
    timed_out_ = true;
    resolver_.cancel();
    stream_.cancel();
  }

  void fail(const std::string& error) {
    if (done_) return;
    done_ = true;
    timer_.cancel();
    error_code ignored;
    stream_.socket().close(ignored);
    reply_.error = timed_out_ ? "no answer within " + seconds_text(timeout_) + " s" : error;
  }

  void resolved(const error_code& ec, const tcp::resolver::results_type& results) {
    if (ec) return fail("cannot resolve '" + url_.host + "': " + ec.message());
    auto self = shared_from_this();
    stream_.async_connect(
        results, [self](const error_code& e, const tcp::endpoint&) { self->connected(e); });
  }

  void connected(const error_code& ec) {
    if (ec == asio::error::connection_refused) return fail("connection refused");
    if (ec) return fail("cannot connect: " + ec.message());
    request_.method(http::verb::get);
    request_.target(url_.target);
    request_.version(11);
    request_.set(http::field::host, join_host_port(url_.host, url_.port));
    request_.set(http::field::user_agent, "ddprun-status");
    request_.set(http::field::connection, "close");
    if (!token_.empty()) request_.set(http::field::authorization, "Bearer " + token_);
    auto self = shared_from_this();
    http::async_write(stream_, request_, [self](const error_code& e, std::size_t) {
      if (e) return self->fail("the request could not be sent: " + e.message());
      self->read();
    });
  }

  void read() {
    auto self = shared_from_this();
    http::async_read_header(stream_, buffer_, parser_,
                            [self](const error_code& e, std::size_t) { self->header_read(e); });
  }

  // Beast 1.74's parser lets a Content-Length over its body limit through (it
  // enforces the limit on chunked bodies only), so the length is checked here.
  void header_read(const error_code& ec) {
    if (ec) return answered(ec);
    if (const auto length = parser_.content_length(); length && *length > max_body_) {
      return answered(http::error::body_limit);
    }
    auto self = shared_from_this();
    http::async_read(stream_, buffer_, parser_,
                     [self](const error_code& e, std::size_t) { self->answered(e); });
  }

  void answered(const error_code& ec) {
    if (ec == http::error::body_limit) {
      return fail("sent a reply over " + std::to_string(max_body_) + " bytes");
    }
    if (ec == http::error::header_limit) return fail("sent a reply header over 16 KiB");
    if (ec == http::error::end_of_stream || ec == asio::error::eof) {
      return fail("closed the connection without answering");
    }
    if (ec && ec.category() == error_code(http::error::bad_version).category()) {
      return fail("answered something that is not HTTP (" + ec.message() + ")");
    }
    if (ec) return fail("the reply broke off: " + ec.message());
    const auto& response = parser_.get();
    const int status = static_cast<int>(response.result_int());
    if (status == 401 || status == 403) {
      return fail(std::to_string(status) + " " + printable(std::string(response.reason())) +
                  (token_.empty() ? ": the live view wants the store's token (--token, "
                                    "--token_file or DDP_STORE_TOKEN)"
                                  : ": the token was refused"));
    }
    if (status != 200) {
      return fail("answered HTTP " + std::to_string(status) + " " +
                  printable(std::string(response.reason())));
    }
    done_ = true;
    timer_.cancel();
    reply_.body = response.body();
  }

  StatusUrl url_;
  std::string token_;
  std::chrono::milliseconds timeout_;
  tcp::resolver resolver_;
  beast::tcp_stream stream_;
  asio::steady_timer timer_;
  beast::flat_buffer buffer_;
  http::request<http::empty_body> request_;
  http::response_parser<http::string_body> parser_;
  std::size_t max_body_;
  FetchReply& reply_;
  bool timed_out_ = false;
  bool done_ = false;
};

}  // namespace

StatusUrl parse_status_url(std::string_view text) {
  StatusUrl url;
  url.text = std::string(text);
  std::string rest = without_scheme(text);
  std::string query;
  if (const auto q = rest.find('?'); q != std::string::npos) {
    query = rest.substr(q + 1);
    rest.resize(q);
  }
  const auto slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  const std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  const HostPort hp = split_host_port(authority, "");
  if (hp.host.empty() || !hp.port || hp.port->empty()) {
    throw InvalidArgument("", "'" + url.text +
                                  "' names no host and port (the live view is at "
                                  "http://HOST:PORT/, PORT the agent's --status_port)");
  }
  int port = 0;
  for (char c : *hp.port) {
    if (c < '0' || c > '9' || port > 65535) {
      port = 0;
      break;
    }
    port = port * 10 + (c - '0');
  }
  if (port < 1 || port > 65535) {
    throw InvalidArgument(
        "", "'" + url.text + "': the port '" + *hp.port + "' is not a number from 1 to 65535");
  }
  url.host = hp.host;
  url.port = std::to_string(port);
  url.target = status_target(path);
  url.token = token_of(query);
  return url;
}

std::vector<FetchReply> fetch_statuses(const std::vector<StatusUrl>& urls, const std::string& token,
                                       std::chrono::milliseconds timeout, std::size_t max_body) {
  std::vector<FetchReply> replies(urls.size());
  asio::io_context ioc;
  for (std::size_t i = 0; i < urls.size(); ++i) {
    const std::string& use = urls[i].token.empty() ? token : urls[i].token;
    std::make_shared<Fetch>(ioc, urls[i], use, timeout, max_body, replies[i])->start();
  }
  ioc.run();
  return replies;
}

}  // namespace ddp::launcher::status
