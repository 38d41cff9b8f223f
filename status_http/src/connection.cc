#include "connection.h"

#include <fmt/format.h>

#include <algorithm>

#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>

#include "response_text.h"
#include "server_state.h"

namespace ddp::status_http {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

// After an error response, the client's further input is read and dropped
// for at most this long and this much, then the connection is closed.
constexpr auto kMaxDrainTime = std::chrono::seconds(1);
constexpr std::size_t kMaxDrainBytes = 256 * 1024;
constexpr std::size_t kDrainChunk = 16 * 1024;
// The input buffer holds a request line and headers, a body, and this much
// more (the start of a pipelined request).
constexpr std::size_t kInputSlack = 4096;

bool is_get_or_head(http::verb method) {
  return method == http::verb::get || method == http::verb::head;
}

bool is_http_error(const boost::system::error_code& ec) {
  return ec.category() == http::make_error_code(http::error::bad_target).category();
}

}  // namespace

template <typename Step>
void Connection::guarded(Step&& step) {
  try {
    step();
  } catch (const std::exception& e) {
    state_.log_server_event(spdlog::level::err,
                            std::string("closing a connection after an error: ") + e.what());
    close();
  } catch (...) {
    state_.log_server_event(spdlog::level::err, "closing a connection after an unknown error");
    close();
  }
}

Connection::Connection(tcp::socket socket, ServerState& state)
    : socket_(std::move(socket)), deadline_(socket_.get_executor()), state_(state),
      input_(state.options().max_header_bytes + state.options().max_body_bytes + kInputSlack) {}

void Connection::start() {
  error_code ignored;
  socket_.set_option(tcp::no_delay(true), ignored);
  guarded([&] { wait_for_request(); });
}

void Connection::close() {
  if (closed_) return;
  closed_ = true;
  auto self = shared_from_this();  // the registry may hold the last other reference
  error_code ignored;
  socket_.close(ignored);
  deadline_.cancel();
  state_.registry().remove(*this);
}

void Connection::wait_for_request() {
  state_.registry().mark_idle(*this);
  phase_ = Phase::kReading;
  arm_deadline(state_.options().idle_timeout);
  const ServerOptions& options = state_.options();
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(options.max_header_bytes));
  parser_->body_limit(static_cast<std::uint64_t>(options.max_body_bytes));
  http::async_read_header(socket_, input_, *parser_,
                          [self = shared_from_this()](const error_code& ec, std::size_t) {
                            self->guarded([&] { self->on_header(ec); });
                          });
}

void Connection::on_header(const error_code& ec) {
  if (closed_) return;
  if (ec) {
    on_read_error(ec);
    return;
  }
  if (!is_get_or_head(parser_->get().method())) {
    const std::string method(parser_->get().method_string());
    state_.log_client_event(spdlog::level::debug, "refused a request: method " + method);
    refuse(method_not_allowed_response(method));
    return;
  }
  if (parser_->is_done()) {
    answer_request();
    return;
  }
  http::async_read(socket_, input_, *parser_,
                   [self = shared_from_this()](const error_code& ec, std::size_t) {
                     self->guarded([&] { self->on_body(ec); });
                   });
}

void Connection::on_body(const error_code& ec) {
  if (closed_) return;
  if (ec) {
    on_read_error(ec);
    return;
  }
  answer_request();
}

void Connection::on_read_error(const error_code& ec) {
  const ServerOptions& options = state_.options();
  if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
    state_.log_client_event(spdlog::level::debug, "refused a request: headers too large");
    refuse(error_response(431, fmt::format("the request line and headers exceed {} bytes",
                                           options.max_header_bytes)));
  } else if (ec == http::error::body_limit) {
    // The request line was parsed: the body's size is known from its headers.
    if (!is_get_or_head(parser_->get().method())) {
      const std::string method(parser_->get().method_string());
      state_.log_client_event(spdlog::level::debug, "refused a request: method " + method);
      refuse(method_not_allowed_response(method));
      return;
    }
    state_.log_client_event(spdlog::level::debug, "refused a request: body too large");
    refuse(error_response(
        413, fmt::format("the request body exceeds {} bytes", options.max_body_bytes)));
  } else if (is_http_error(ec) && ec != http::error::end_of_stream &&
             ec != http::error::partial_message) {
    state_.log_client_event(spdlog::level::debug, "refused a malformed request: " + ec.message());
    refuse(error_response(400, "malformed request: " + ec.message()));
  } else {
    close();  // the client left, or the socket failed
  }
}

void Connection::answer_request() {
  state_.registry().mark_busy(*this);
  const auto& message = parser_->get();
  const bool keep_alive = message.version() >= 11 && message.keep_alive();
  Request request;
  request.method = std::string(message.method_string());
  request.target = std::string(message.target());
  if (request.target.empty() || request.target.front() != '/') {
    state_.log_client_event(spdlog::level::debug, "refused a request: target not a path");
    refuse(error_response(400, "the request target must be a path starting with '/'"));
    return;
  }
  const auto question = request.target.find('?');
  request.path = request.target.substr(0, question);
  if (question != std::string::npos) request.query = request.target.substr(question + 1);

  if (const auto& token_check = state_.token_check(); token_check) {
    const auto authorization = message[http::field::authorization];
    if (!token_check->accepts({authorization.data(), authorization.size()}, request.query)) {
      const bool offered =
          !authorization.empty() || query_parameter(request.query, "token").has_value();
      state_.log_client_event(spdlog::level::debug, offered ? "refused a request: wrong token"
                                                            : "refused a request: no token");
      count(state_.counters().rejected_unauthorized);
      // Closed after the answer: a stranger gets one answer per connection,
      // however many requests it pipelines.
      send(unauthorized_response(offered ? "the token is wrong"
                                         : "a token is required: send Authorization: Bearer "
                                           "<token> or add ?token=<token> to the address"),
           true);
      return;
    }
  }
  send(state_.answer(request), !keep_alive);
}

void Connection::refuse(Response response) {
  count(state_.counters().rejected_bad_request);
  send(response, true);
}

void Connection::send(const Response& response, bool close_after) {
  state_.registry().mark_busy(*this);
  count(state_.counters().requests);
  output_ = response_text(response, is_head(), close_after);
  written_ = 0;
  close_after_write_ = close_after;
  phase_ = Phase::kWriting;
  write_rest();
}

void Connection::write_rest() {
  arm_deadline(state_.options().write_progress_timeout);
  socket_.async_write_some(asio::buffer(output_.data() + written_, output_.size() - written_),
                           [self = shared_from_this()](const error_code& ec, std::size_t bytes) {
                             self->guarded([&] { self->on_written(ec, bytes); });
                           });
}

void Connection::on_written(const error_code& ec, std::size_t bytes) {
  if (closed_) return;
  if (ec) {
    close();
    return;
  }
  written_ += bytes;
  if (written_ < output_.size()) {
    write_rest();
    return;
  }
  std::string().swap(output_);
  if (close_after_write_) {
    drain_then_close();
  } else {
    wait_for_request();
  }
}

void Connection::drain_then_close() {
  state_.registry().mark_closing(*this);
  phase_ = Phase::kDraining;
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  arm_deadline(std::min<Clock::duration>(state_.options().idle_timeout, kMaxDrainTime));
  drain_buffer_.resize(kDrainChunk);
  drain();
}

void Connection::drain() {
  socket_.async_read_some(asio::buffer(drain_buffer_),
                          [self = shared_from_this()](const error_code& ec, std::size_t n) {
                            self->guarded([&] { self->on_drained(ec, n); });
                          });
}

void Connection::on_drained(const error_code& ec, std::size_t bytes) {
  if (closed_) return;
  drained_ += bytes;
  if (ec || drained_ >= kMaxDrainBytes) {
    close();
  } else {
    drain();
  }
}

void Connection::arm_deadline(Clock::duration after) {
  deadline_.expires_after(after);
  deadline_.async_wait([self = shared_from_this()](const error_code& ec) {
    self->guarded([&] { self->on_deadline(ec); });
  });
}

void Connection::on_deadline(const error_code& ec) {
  if (closed_ || ec == asio::error::operation_aborted) return;
  // Re-armed after this wait had already completed: the new wait decides.
  if (deadline_.expiry() > Clock::now()) return;
  if (phase_ == Phase::kReading) {
    count(state_.counters().timed_out);
    state_.log_client_event(spdlog::level::debug,
                            "closed a connection: no complete request within idle_timeout");
  } else if (phase_ == Phase::kWriting) {
    count(state_.counters().stalled);
    state_.log_client_event(spdlog::level::debug,
                            "closed a connection: its client took no byte of the response within "
                            "write_progress_timeout");
  }
  close();
}

bool Connection::is_head() const { return parser_ && parser_->get().method() == http::verb::head; }

}  // namespace ddp::status_http
