// A Connection's requests and replies: a POST, its reply's header, and its
// body read whole (a unary call) or one newline-terminated message at a time
// from an endless chunked body (a watch), each bounded (etcd_connection.h).
#include <fmt/format.h>

#include "etcd_connection.h"
#include "etcd_connection_impl.h"

namespace ddp::etcd {

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

}  // namespace ddp::etcd
