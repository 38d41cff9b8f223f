#include "session.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include "server.h"

namespace ddp::server {

namespace {

// Sessions start with a small read buffer (tens of thousands of them may be
// open; a request of the rendezvous is well under this) and grow it when a
// read fills it (a client sending large values).
constexpr std::size_t kReadBufferInitial = 512;
constexpr std::size_t kReadBufferMax = 256 * 1024;
// While a request is parked, the client should send nothing (TcpStore sends
// one request at a time). Its input is still read, so that its leaving is seen
// at once; past this much of it the connection is closed: a client cannot make
// us buffer without bound, nor hide its EOF behind a full backlog.
constexpr std::size_t kMaxBacklog = 16 * 1024;
// The work one connection may do in one turn of the server's only thread: a
// frame counts one, plus one per key it names. Past it, the rest of its
// input waits for its next turn, behind every other connection: a client
// that pipelines requests of thousands of keys delays others by one turn.
constexpr std::size_t kTurnBudget = protocol::kMaxKeysPerRequest + 64;
// A request naming many keys leaves vectors of that capacity behind in
// request_; past this many they are released, so that an idle connection
// holds no more than a small request's worth.
constexpr std::size_t kKeptRequestKeys = 1024;
// How long, and how much, a closing connection is drained so that its error
// reply is not lost to a reset: a client that keeps sending past that is not
// reading the reply anyway, and draining it would cost the server its reads.
constexpr auto kLinger = std::chrono::seconds(1);
constexpr std::size_t kMaxLingerBytes = 64 * 1024;
// Timers further out than this are not armed (a "forever" wait).
constexpr std::uint64_t kMaxTimerMs = 100ull * 365 * 24 * 3600 * 1000;

// now + timeout; zero, negative or absurdly long timeouts mean "never".
std::chrono::steady_clock::time_point after(std::chrono::milliseconds timeout) {
  if (timeout <= std::chrono::milliseconds(0) ||
      timeout.count() > static_cast<std::int64_t>(kMaxTimerMs)) {
    return std::chrono::steady_clock::time_point::max();
  }
  return std::chrono::steady_clock::now() + timeout;
}

}  // namespace

Session::Session(asio::ip::tcp::socket socket, Server& server)
    : server_(server), socket_(std::move(socket)), idle_timer_(server.io_context()),
      wait_timer_(server.io_context()), read_buf_(kReadBufferInitial),
      parser_(protocol::kMaxHandshakeFrame), serial_(server.next_session_serial()) {}

void Session::start() {
  counted_ = true;
  try {
    begin_serving();
  } catch (const std::exception& e) {
    // The RNG failed (no nonce) or the socket is unusable: this connection
    // ends here, uncounted, rather than linger half set up.
    server_.logger().error("store session: cannot start: {}", e.what());
    close_now();
  }
}

void Session::begin_serving() {
  // No delay and keepalive come from the listening socket (Server): accepted
  // sockets inherit them. Direct writes (flush) must never block the
  // io_context thread.
  boost::system::error_code ignored;
  socket_.non_blocking(true, ignored);
  // The nonce costs a trip to the RNG: only made when there is an auth step.
  const auto& token = server_.options().token;
  handshake_.emplace(token, token.empty() ? std::string() : protocol::make_nonce(),
                     server_.limits());
  deadline_ = after(server_.options().handshake_timeout);
  arm_idle_timer();
  read();
}

void Session::reject(protocol::Status status, const std::string& message) {
  counted_ = false;
  boost::system::error_code ignored;
  socket_.non_blocking(true, ignored);
  fail(status, message);
}

void Session::stop() {
  if (state_ == State::kClosed) return;
  if (state_ == State::kOpen) begin_close();
  if (!writing_ && out_.empty()) close_now();
}

void Session::touch() {
  if (handshake_) return;
  deadline_ = after(server_.options().idle_timeout);
  // The timer fires at armed_at_ and then looks at deadline_; re-arm only when
  // the deadline moved earlier (after the handshake, with a short idle timeout).
  if (deadline_ < armed_at_) arm_idle_timer();
}

// ---- reading -------------------------------------------------------------------

void Session::read() {
  // Never while a read is pending (its buffer must stay put), and never from
  // inside processing: the frame being handled may point into read_buf_, and
  // Asio 1.74 receives speculatively inside async_read_some. The caller of
  // process() reads once processing is over.
  if (reading_ || processing_ || state_ == State::kClosed) return;
  // A parked client is still read from (to notice a disconnect; its backlog
  // is bounded in on_read); a client not reading its replies is not (its
  // leaving breaks the write that is pending to it); nor is one whose input
  // waits for its next turn (resume() reads again once it is served).
  if (state_ == State::kOpen && (output_full() || (!parked_ && !backlog_.empty()))) return;
  if (grow_read_buf_) {
    // Only here, with no read pending, may the buffer be replaced.
    grow_read_buf_ = false;
    read_buf_.resize(std::min(read_buf_.size() * 4, kReadBufferMax));
  }
  reading_ = true;
  // Asio 1.74 tries a read op speculatively (one recv that usually finds the
  // socket empty right after a reply). A wait op instead re-arms the descriptor
  // with epoll_ctl, one syscall as well (measured with strace -c): the plain read
  // is kept, as it also takes a request that already arrived without an epoll round.
  socket_.async_read_some(asio::buffer(read_buf_),
                          [self = shared_from_this()](const boost::system::error_code& ec,
                                                      std::size_t n) { self->on_read(ec, n); });
}

// A client that sends requests but does not read its replies stops being served
// (its frames are neither processed nor read) once this much output waits for it:
// backpressure, not unbounded memory.
bool Session::output_full() const {
  return out_.size() + writing_buf_.size() > server_.options().max_pending_output;
}

bool Session::input_paused() const { return parked_ || output_full(); }

void Session::on_read(const boost::system::error_code& ec, std::size_t n) {
  reading_ = false;
  try {
    if (state_ == State::kClosed) return;
    if (ec) {
      // EOF, reset or shutdown: the client is gone (or we are closing); a parked
      // request of it is forgotten in close_now().
      if (ec != asio::error::eof && ec != asio::error::operation_aborted &&
          ec != asio::error::connection_reset) {
        server_.logger().debug("store session: read failed: {}", ec.message());
      }
      close_now();
      return;
    }
    if (state_ == State::kClosing) {  // draining: input is ignored
      lingered_ += n;
      if (lingered_ > kMaxLingerBytes) {
        close_now();
        return;
      }
      read();
      return;
    }
    // A full buffer suggests a client sending large values: grow it before the
    // next read (read() does, when no read is pending).
    if (n == read_buf_.size() && read_buf_.size() < kReadBufferMax) grow_read_buf_ = true;
    std::string_view input(read_buf_.data(), n);
    turn_work_ = 0;
    {
      Processing guard(processing_);
      if (input_paused() || !backlog_.empty()) {
        backlog_.append(input);
      } else {
        process(input);
      }
      if (parked_ && backlog_.size() > kMaxBacklog) {
        // Told once, not drained: a client sending this much behind a request
        // it waits on is not reading, and draining it would cost our reads.
        fail(protocol::Status::kStoreFull,
             fmt::format("store full: more than {} bytes of requests arrived behind a waiting "
                         "request (send one request at a time)",
                         kMaxBacklog));
        lingered_ = kMaxLingerBytes;
      }
      account_input();
      flush();
      serve_backlog();
    }
    schedule_turn();
    read();
  } catch (const std::exception& e) {
    server_.logger().error("store session: {}", e.what());
    close_now();
  }
}

void Session::schedule_turn() {
  if (state_ == State::kOpen && !input_paused() && !backlog_.empty()) schedule_resume();
}

void Session::schedule_resume() {
  if (resume_posted_) return;
  resume_posted_ = true;
  asio::post(server_.io_context(), [self = shared_from_this()] { self->resume(); });
}

void Session::process(std::string_view input) {
  // Frames are handled while the connection is open and not paused: a parked
  // request, or a client not reading its replies (output over the limit),
  // stops processing - not only reading - so one read of pipelined requests
  // cannot queue more than one reply beyond the limit.
  while (state_ == State::kOpen && !input_paused() && !input.empty() && turn_work_ < kTurnBudget) {
    auto result = parser_.consume(input);
    if (result == protocol::FrameParser::State::kNeedMore) break;
    if (result == protocol::FrameParser::State::kBad) {
      fail(parser_.error().status, parser_.error().message);
      return;
    }
    ++turn_work_;
    handle_frame(parser_.payload());
  }
  // What follows a pause waits in the backlog.
  if (state_ == State::kOpen && !input.empty()) backlog_.append(input);
}

void Session::handle_frame(std::string_view payload) {
  auto decoded = protocol::decode_request(payload, server_.limits(), request_);
  if (!decoded.ok()) {
    // A sound frame whose request the server refuses (too many keys) is
    // answered and the connection goes on; anything else ends it.
    if (!handshake_ && !protocol::closes_connection(decoded.status)) {
      protocol::encode_error(out_, decoded.status, decoded.message);
      release_large_request();
      touch();
      return;
    }
    fail(decoded.status, decoded.message);
    return;
  }
  if (handshake_) {
    auto result = handshake_->on_request(request_, out_);
    if (!result.ok()) {
      // The handshake already queued its error reply.
      if (server_.may_log_client_event()) {
        server_.logger().info("store session: handshake failed: {}", result.message);
      }
      begin_close();
      return;
    }
    if (handshake_->done()) {
      client_id_ = handshake_->client_id();
      server_.clients().connected(client_id_, serial_, Clock::now());
      registered_ = true;
      handshake_.reset();
      parser_.set_max_frame_size(server_.limits().max_frame_size);
      parser_.check_request_heads(true);
    }
    touch();
    return;
  }
  touch();
  turn_work_ += request_.keys.size();
  server_.count_operation(request_.op);
  if (request_.op == protocol::Op::kHello || request_.op == protocol::Op::kAuth) {
    fail(protocol::Status::kUnexpected,
         fmt::format("{} after the handshake completed", protocol::to_string(request_.op)));
    return;
  }
  if (protocol::carries_request_id(request_.op) && request_.request_id != 0) {
    // Not idempotent: a retry after a reconnection is answered from the record.
    if (server_.clients().replay(client_id_, serial_, request_.request_id, out_)) return;
    const std::size_t before = out_.size();
    server_.handler().handle(request_, out_, this);  // these operations never park
    server_.clients().record(client_id_, request_.request_id,
                             std::string_view(out_).substr(before));
    return;
  }
  const bool done = server_.handler().handle(request_, out_, this);
  release_large_request();
  if (done) return;
  parked_ = true;
  auto generation = ++wait_generation_;
  if (request_.timeout_ms != protocol::kNoTimeout && request_.timeout_ms < kMaxTimerMs) {
    wait_timer_.expires_after(std::chrono::milliseconds(request_.timeout_ms));
    wait_timer_.async_wait(
        [self = shared_from_this(), generation](const boost::system::error_code& ec) {
          if (ec != asio::error::operation_aborted) self->on_wait_timer(generation);
        });
  }
}

void Session::release_large_request() {
  // The parked request keeps copies of its keys (StoreHandler::Parked): the
  // views may go.
  if (request_.keys.capacity() > kKeptRequestKeys)
    std::vector<std::string_view>().swap(request_.keys);
  if (request_.values.capacity() > kKeptRequestKeys) {
    std::vector<std::string_view>().swap(request_.values);
  }
}

void Session::on_wake(std::string_view reply) {
  out_.append(reply);
  parked_ = false;
  ++wait_generation_;
  wait_timer_.cancel();
  touch();
  flush();
  // Further frames of this client may wait in the backlog, or reading may be
  // paused: continue outside the handler's call (it must not be re-entered).
  if (state_ == State::kOpen && (!backlog_.empty() || !reading_)) schedule_resume();
}

void Session::resume() {
  resume_posted_ = false;
  turn_work_ = 0;
  try {
    if (state_ != State::kOpen || input_paused()) return;
    {
      Processing guard(processing_);
      flush();  // a reply queued before resuming (an expired wait's)
      serve_backlog();
    }
    schedule_turn();
    read();
  } catch (const std::exception& e) {
    server_.logger().error("store session: {}", e.what());
    close_now();
  }
}

void Session::serve_backlog() {
  // A flush that wrote everything at once ends the pause with no write pending
  // to come back here, and a read would wait for input the client already sent:
  // the backlog is served until it is empty or the connection pauses again.
  while (state_ == State::kOpen && !input_paused() && !backlog_.empty() &&
         turn_work_ < kTurnBudget) {
    std::string pending;
    pending.swap(backlog_);
    process(pending);
    account_input();
    flush();
  }
}

void Session::on_wait_timer(std::uint64_t generation) {
  try {
    if (generation != wait_generation_ || !parked_ || state_ != State::kOpen) return;
    if (!server_.handler().expire(this, out_)) return;
    parked_ = false;
    ++wait_generation_;
    touch();
    resume();
  } catch (const std::exception& e) {
    server_.logger().error("store session: {}", e.what());
    close_now();
  }
}

// ---- writing ----------------------------------------------------------------------

void Session::flush() {
  if (writing_ || out_.empty() || state_ == State::kClosed) return;
  // Replies are small and the socket buffer is usually empty: write directly
  // (no completion handler to schedule). On a partial write or an error, the
  // rest goes through async_write, which also reports the error (via on_write)
  // outside of the caller's context: flush() runs inside StoreHandler::wake.
  boost::system::error_code ec;
  std::size_t n = socket_.write_some(asio::buffer(out_), ec);
  if (ec) n = 0;
  if (n == out_.size()) {
    out_.clear();
    if (out_.capacity() > 64 * 1024) std::string().swap(out_);
    return;
  }
  writing_ = true;
  writing_buf_.clear();
  writing_buf_.swap(out_);
  asio::async_write(socket_, asio::buffer(writing_buf_) + n,
                    [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
                      self->on_write(ec);
                    });
}

void Session::on_write(const boost::system::error_code& ec) {
  writing_ = false;
  try {
    if (state_ == State::kClosed) return;
    if (ec) {
      close_now();
      return;
    }
    // Keep the buffer's capacity for the next batch, unless a large value made it big.
    writing_buf_.clear();
    if (writing_buf_.capacity() > 64 * 1024) std::string().swap(writing_buf_);
    flush();
    if (writing_) return;
    if (state_ == State::kClosing) {
      begin_linger();
      return;
    }
    // Processing and reading may have paused for backpressure.
    if (!backlog_.empty()) {
      resume();
    } else {
      read();
    }
  } catch (const std::exception& e) {
    server_.logger().error("store session: {}", e.what());
    close_now();
  }
}

// ---- timers ---------------------------------------------------------------------------

void Session::arm_idle_timer() {
  armed_at_ = deadline_;
  idle_timer_.expires_at(deadline_);
  idle_timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
    if (ec != asio::error::operation_aborted) self->on_idle_timer();
  });
}

void Session::on_idle_timer() {
  try {
    if (state_ == State::kClosed) return;
    if (state_ == State::kClosing) {  // linger over
      close_now();
      return;
    }
    auto now = Clock::now();
    if (parked_) {  // a client blocked in get/wait is not idle
      deadline_ = std::max(deadline_, after(server_.options().idle_timeout));
    } else if (now >= deadline_) {
      if (handshake_) {
        fail(protocol::Status::kHandshakeTimeout,
             fmt::format("no complete handshake within {} ms",
                         server_.options().handshake_timeout.count()));
      } else {
        fail(protocol::Status::kIdleTimeout,
             fmt::format("no request within the idle timeout of {} ms",
                         server_.options().idle_timeout.count()));
      }
      return;
    }
    // The deadline moved (frames arrived): sleep until the new one. Moving a time
    // point per frame is cheaper than re-arming the timer per frame.
    arm_idle_timer();
  } catch (const std::exception& e) {
    server_.logger().error("store session: {}", e.what());
    close_now();
  }
}

// ---- closing ---------------------------------------------------------------------------

void Session::fail(protocol::Status status, const std::string& message) {
  if (state_ != State::kOpen) return;
  if (server_.may_log_client_event()) {
    server_.logger().info("store session: closing connection: {}: {}", protocol::to_string(status),
                          message);
  }
  protocol::encode_error(out_, status, message);
  begin_close();
}

void Session::begin_close() {
  if (state_ != State::kOpen) return;
  state_ = State::kClosing;
  uncount();
  server_.handler().cancel(this);
  parked_ = false;
  ++wait_generation_;
  wait_timer_.cancel();
  flush();
  if (!writing_) begin_linger();
}

void Session::begin_linger() {
  boost::system::error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
  if (server_.stopping() || lingered_ >= kMaxLingerBytes) {
    close_now();
    return;
  }
  // Read (and drop) what the client still sends until it closes, at most kLinger.
  deadline_ = Clock::now() + kLinger;
  arm_idle_timer();
  read();
}

void Session::account_input() {
  if (state_ != State::kOpen) return;
  const std::size_t now = parser_.buffered() + backlog_.size();
  if (!server_.account_input(accounted_input_, now)) {
    accounted_input_ = now;
    fail(protocol::Status::kStoreFull,
         fmt::format("store full: incomplete requests of all clients would hold more than {} "
                     "bytes (twice max_frame_size)",
                     server_.max_buffered_input()));
    return;
  }
  accounted_input_ = now;
}

void Session::uncount() {
  if (!counted_) return;
  counted_ = false;
  server_.sessions().uncount();
  // Closed before its hello (and auth) completed: refused by the server,
  // abandoned by a client that did not accept the server's proof, or silent.
  if (handshake_ && !server_.stopping()) server_.count_failed_handshake();
}

void Session::close_now() {
  if (state_ == State::kClosed) return;
  if (registered_) {
    registered_ = false;
    server_.clients().disconnected(client_id_, Clock::now());
  }
  server_.account_input(accounted_input_, 0);
  accounted_input_ = 0;
  uncount();
  server_.handler().cancel(this);
  state_ = State::kClosed;
  parked_ = false;
  boost::system::error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  idle_timer_.cancel();
  wait_timer_.cancel();
  server_.sessions().remove(shared_from_this());
}

}  // namespace ddp::server
