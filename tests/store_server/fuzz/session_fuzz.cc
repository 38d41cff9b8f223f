// libFuzzer target for a whole store session: the real Server and Session code,
// fed through one end of a socket pair (built by scripts/fuzz with clang++-14
// -fsanitize=fuzzer,address,undefined; not part of the gcc build).
//
// protocol_fuzz covers the codec and the handler; this target covers what sits
// between the socket and them: read buffers, backlogs, parked requests, the
// write path and closing. Those bugs depend on how the byte stream is cut into
// reads, so the input says where the cuts are.
//
// Input (see session_input.h): a mode byte, then chunks, each a little-endian u16
// length and that many bytes (the last chunk may be short). Each chunk is written
// to the client end and the io_context is then polled on this thread until the
// server has done everything it can, so every chunk arrives as its own read (a
// read larger than the session's buffer is cut by the buffer) and a run is
// repeatable. A zero-length chunk lets 2 ms pass instead (the first
// kMaxSleeps of them), so that short get/wait timeouts fire (the one thing that
// depends on the clock).
//   mode bit 0: the server requires a token: the pre-authentication surface
//               (what a stranger on the network reaches).
//   mode bit 3: with bit 0, the harness answers the server's hello reply with
//               the right auth frame (the fuzzer cannot compute the HMAC), so the
//               chunks after the hello run on an authenticated connection.
//   mode bit 1: the client reads no replies until the end (the server's async
//               write path and its pending-output backpressure).
//   mode bit 2: tiny limits (64-byte keys, 256-byte values, 1 KiB frames).
// After the last chunk the client reads everything the server sends, then
// half-closes, and the server is stopped and drained, so nothing is left for the
// next input (LeakSanitizer checks that). Invariants checked (abort):
//   - everything the server writes is a sequence of complete frames;
//   - the server closes the connection after the client's EOF, or on stop()
//     (replies still queued when the client's EOF arrives may be cut: the
//     server treats EOF as "the client is gone", so no check on that);
//   - stop() completes within a few seconds (no session hangs the shutdown).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "ddp/common/logging.h"
#include "ddp/store/protocol.h"
#include "ddp/store_server/store_server.h"
#include "server.h"
#include "session_input.h"

namespace {

namespace asio = boost::asio;
using namespace ddp;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "session_fuzz: invariant violated: %s\n", what);
  std::abort();
}

// The client end of the pair and what the server sent to it.
class Client {
 public:
  explicit Client(int fd) : fd_(fd), replies_(~std::uint32_t{0}) {}

  // The first bytes sent and received, for the harness's auth step.
  static constexpr std::size_t kKeep = 256;
  const std::string& first_sent() const { return first_sent_; }
  const std::string& first_received() const { return first_received_; }
  std::size_t frames() const { return frames_; }
  ~Client() {
    if (fd_ >= 0) ::close(fd_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Reads what is there without blocking; checks it is made of frames.
  // Returns the number of bytes read.
  std::size_t drain() {
    char buf[64 * 1024];
    std::size_t total = 0;
    while (!eof_) {
      ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        std::string_view bytes(buf, static_cast<std::size_t>(n));
        total += bytes.size();
        keep(first_received_, bytes);
        while (!bytes.empty()) {
          auto state = replies_.consume(bytes);
          if (state == protocol::FrameParser::State::kBad) {
            die("the server wrote something that is not a frame");
          }
          if (state == protocol::FrameParser::State::kGood) ++frames_;
        }
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        eof_ = true;  // closed (or reset) by the server
      }
      if (n < 0 && errno == EINTR) continue;
      return total;
    }
    return total;
  }

  // Writes up to `bytes.size()`; returns how many went in (0 when the socket is
  // full or the server is gone).
  std::size_t send_some(std::string_view bytes) {
    if (write_closed_) return 0;
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      keep(first_sent_, bytes.substr(0, static_cast<std::size_t>(n)));
      return static_cast<std::size_t>(n);
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) write_closed_ = true;
    return 0;
  }

  void half_close() {
    if (!write_closed_) ::shutdown(fd_, SHUT_WR);
    write_closed_ = true;
  }

  bool eof() const { return eof_; }

 private:
  static void keep(std::string& to, std::string_view bytes) {
    if (to.size() < kKeep) to.append(bytes.substr(0, kKeep - to.size()));
  }

  int fd_;
  protocol::FrameParser replies_;
  std::string first_sent_;
  std::string first_received_;
  std::size_t frames_ = 0;
  bool eof_ = false;
  bool write_closed_ = false;
};

class Harness {
 public:
  Harness(server::Server& server, Client& client, bool read_replies)
      : io_(server.io_context()), client_(client), read_replies_(read_replies) {}

  // Runs every ready handler until the server has nothing left to do now
  // (reading its replies, when the client does, may let it go on writing).
  // Returns the number of handlers run.
  std::size_t pump() {
    std::size_t total = 0;
    while (true) {
      std::size_t ran = io_.poll();
      std::size_t read = read_replies_ ? client_.drain() : 0;
      if (ran == 0 && read == 0) return total;
      total += ran;
    }
  }

  // Writes one chunk and lets the server process it before the next one.
  void send_chunk(std::string_view chunk) {
    pump();
    while (!chunk.empty()) {
      std::size_t n = client_.send_some(chunk);
      chunk.remove_prefix(n);
      if (n == 0 && pump() == 0) return;  // the server reads no more: drop the rest
    }
    pump();
  }

  void read_all() { read_replies_ = true; }

  // Lets the clock move on: timers due within `duration` fire.
  void sleep(std::chrono::milliseconds duration) {
    pump();
    io_.run_for(duration);
    if (io_.stopped()) io_.restart();  // ran out of work early: usable again
    pump();
  }

  // Sends the auth frame that proves the token, once the client's first frame
  // was a hello and the server's first reply carries its nonce. Returns true when
  // it was sent (or can never be: a failed handshake), so it is tried once.
  bool authenticate(const std::string& token) {
    client_.drain();
    std::string_view sent = client_.first_sent();
    std::string_view received = client_.first_received();
    protocol::FrameParser requests(protocol::kMaxHandshakeFrame);
    protocol::FrameParser replies(~std::uint32_t{0});
    if (requests.consume(sent) != protocol::FrameParser::State::kGood) return false;
    protocol::Request hello;
    protocol::Limits limits;
    if (!protocol::decode_request(requests.payload(), limits, hello).ok() ||
        hello.op != protocol::Op::kHello) {
      return true;
    }
    auto state = replies.consume(received);
    if (state == protocol::FrameParser::State::kNeedMore) return false;
    protocol::Reply reply;
    if (state != protocol::FrameParser::State::kGood ||
        !protocol::decode_reply(protocol::Op::kHello, replies.payload(), reply).ok() ||
        reply.status != protocol::Status::kOk || reply.nonce.empty()) {
      return true;
    }
    protocol::Request auth;
    auth.op = protocol::Op::kAuth;
    std::string mac =
        protocol::auth_mac(protocol::Direction::kClient, token, hello.nonce, reply.nonce);
    auth.mac = mac;
    std::string frame;
    protocol::encode_request(frame, auth);
    send_chunk(frame);
    return true;
  }

 private:
  asio::io_context& io_;
  Client& client_;
  bool read_replies_;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The server logs every closed connection at info: millions of lines otherwise.
  // DDP_FUZZ_LOG=1 keeps the logs (to read what a crashing input does).
  if (std::getenv("DDP_FUZZ_LOG") == nullptr) {
    ddp::log::get("store")->set_level(spdlog::level::off);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::SessionInput input(data, size);

  StoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  if (input.mode() & fuzz::kModeToken) options.token = "fuzz-token";
  // Small limits keep a run's memory bounded whatever the input announces.
  if (input.mode() & fuzz::kModeTinyLimits) {
    options.max_key_size = 64;
    options.max_value_size = 256;
    options.max_frame_size = 1024;
  } else {
    options.max_key_size = 4 * 1024;
    options.max_value_size = 256 * 1024;
    options.max_frame_size = 320 * 1024;
  }
  options.max_clients = 4;
  server::Server server(options);

  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    std::perror("session_fuzz: socketpair");
    std::abort();
  }
  Client client(fds[1]);
  {
    // Asio wraps the descriptor as if it were TCP: the session's TCP options
    // fail on a Unix socket, and it ignores those errors (as it must).
    asio::ip::tcp::socket socket(server.io_context());
    socket.assign(asio::ip::tcp::v4(), fds[0]);
    server.adopt(std::move(socket));
  }
  Harness harness(server, client, (input.mode() & fuzz::kModeNoRead) == 0);

  bool auth_pending = (input.mode() & fuzz::kModeToken) && (input.mode() & fuzz::kModeAuthenticate);
  std::string_view chunk;
  int sleeps = 0;
  while (input.next(chunk)) {
    if (chunk.empty()) {
      // Bounded, or an input of empty chunks would take seconds.
      if (sleeps < fuzz::kMaxSleeps) {
        ++sleeps;
        harness.sleep(std::chrono::milliseconds(2));
      }
      continue;
    }
    harness.send_chunk(chunk);
    if (auth_pending && harness.authenticate(options.token)) auth_pending = false;
  }

  // The client is done: it takes its replies (a server paused by backpressure
  // goes on), then after its EOF the server must finish and close.
  harness.read_all();
  harness.pump();
  client.half_close();
  harness.pump();
  server.stop();
  server.io_context().run_for(std::chrono::seconds(10));
  if (!server.io_context().stopped()) die("the server did not finish within 10 s of stop()");
  client.drain();
  if (!client.eof()) die("the server did not close the connection");
  if (std::getenv("DDP_FUZZ_LOG") != nullptr) {
    std::fprintf(stderr, "session_fuzz: the server sent %zu reply frames\n", client.frames());
  }
  return 0;
}
