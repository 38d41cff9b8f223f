// libFuzzer target for what an etcd endpoint sends the etcd client
// (store_etcd/src/etcd_http.h): HTTP/1.1 replies and watch streams read by the
// real Connection (Boost.Beast) over one end of a socket pair, their JSON
// checked by decode_reply / decode_stream_message, and the base64 codec of
// bytes fields (built by scripts/fuzz with clang++-14
// -fsanitize=fuzzer,address,undefined; not part of the gcc build).
//
// Input: a mode byte, then the rest. Mode bits 0-1 pick what the rest is:
//   0 unary:  an HTTP reply, written to the peer end, which then half-closes;
//             Connection::post reads it and decode_reply checks it. While the
//             connection stays open (keep-alive) it posts again, up to
//             kMaxPosts times: the bytes after a reply are the next reply.
//   1 stream: chunks, each a little-endian u16 length and that many bytes (the
//             last may be short). The first chunk is written, then
//             post_stream(endless=true) reads the header (when the chunk holds
//             no "\r\n\r\n" the peer half-closes first: nothing else would end
//             the header, and waiting out a deadline would only slow the run). Status 200: each later chunk is written,
//             then next_line(Deadline(0)) is called until it returns nullopt,
//             each line through decode_stream_message; at the end the peer
//             half-closes and the stream is drained. Another status: the rest
//             is written, the peer half-closes, and stream_rest + decode_reply
//             read it, as Transport::open_stream does.
//   2 base64: is_padded_base64, base64_decode and base64_encode on the rest.
//   3 decode: the rest is a body handed straight to decode_reply (status from
//             mode bits 4-7) and to decode_stream_message: JSON without HTTP.
// Mode bit 2: max_reply_bytes is 4 KiB (the least Transport accepts) instead of
// 64 KiB, so that inputs of a few KiB reach the limits.
// Everything the connection reads is in the socket before it reads (and the
// peer's EOF too, unless a stream is still running), so a run does not depend
// on timing; the deadlines given only bound a hang.
//
// Invariants checked (abort):
//   - the parsing calls let only ddp::Error escape (the one exception:
//     decode_reply's internal TokenExpired for "invalid auth token", which
//     Transport catches to re-authenticate);
//   - a reply or message that is accepted is a JSON object, decode_reply
//     accepts only status 200, and every bytes field (key, value, range_end,
//     at any depth) decodes with json_bytes / base64_decode;
//   - after the peer's EOF a stream ends with an error, never with "no line
//     yet" (a stream that ignored EOF would hang a watch);
//   - base64: base64_decode succeeds exactly when is_padded_base64 says so,
//     to 3 bytes per 4 digits less the padding; re-encoding gives the text
//     back, except that a non-canonical last digit (bits below the last byte
//     set, which decoding drops) comes back canonical; and any bytes survive
//     encode then decode;
//   - no leak (LeakSanitizer: the connection and both descriptors are closed
//     at the end of every input).
// DDP_FUZZ_LOG=1 prints what each call returned or threw (to read what a
// crashing input does).
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "ddp/common/error.h"
#include "etcd_http.h"

namespace {

using namespace ddp;
using namespace std::chrono_literals;
using etcd::Json;

constexpr std::uint8_t kModeMask = 3;
constexpr std::uint8_t kModeStream = 1;
constexpr std::uint8_t kModeBase64 = 2;
constexpr std::uint8_t kModeDecode = 3;
constexpr std::uint8_t kModeSmallLimit = 4;
constexpr std::size_t kSmallLimit = 4 * 1024;
constexpr std::size_t kLimit = 64 * 1024;
// Keep-alive replies read from one unary input.
constexpr int kMaxPosts = 3;
// Bounds a hang only: every byte (and usually the EOF) is there before a read.
constexpr auto kSafety = 5s;

const std::string kOrigin = "EtcdStore";
const std::string kPath = "/v3/kv/range";

bool tracing = false;

// DDP_FUZZ_LOG=1: one line per call's outcome.
__attribute__((format(printf, 1, 2))) void trace(const char* format, ...) {
  if (!tracing) return;
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "etcd_reply_fuzz: invariant violated: %s\n", what);
  std::abort();
}

void check(bool ok, const char* what) {
  if (!ok) die(what);
}

// Called from a catch block: the exception must be a ddp::Error (the parsing
// calls' documented failures); `token_expired_allowed` for decode_reply, which
// also throws Transport's internal TokenExpired (not a ddp::Error: Transport
// catches it to re-authenticate; its class is private to store_etcd/src, so it
// is recognized by name).
void expect_ddp_error(bool token_expired_allowed) {
  try {
    throw;
  } catch (const Error& e) {
    trace("  threw %s: %s\n", typeid(e).name(), e.what());
  } catch (const std::exception& e) {
    if (token_expired_allowed && std::strstr(typeid(e).name(), "TokenExpired") != nullptr) {
      trace("  threw TokenExpired\n");
      return;
    }
    std::fprintf(stderr, "etcd_reply_fuzz: %s: %s\n", typeid(e).name(), e.what());
    die("an exception that is not a ddp::Error escaped");
  } catch (...) {
    die("a non-std exception escaped");
  }
}

// What the client does with a decoded reply: every bytes field of every
// object decodes (json_bytes on a non-string is "", on a string it is
// base64_decode). Iterative, like the code under test, whatever the width.
void check_accepted(const Json& document) {
  check(document.is_object(), "an accepted reply is not a JSON object");
  std::vector<const Json*> pending{&document};
  while (!pending.empty()) {
    const Json* node = pending.back();
    pending.pop_back();
    if (node->is_object()) {
      for (const char* field : {"key", "value", "range_end"}) {
        try {
          (void)etcd::json_bytes(*node, field);
        } catch (...) {
          die("a bytes field of an accepted reply does not decode");
        }
      }
    }
    if (node->is_structured()) {
      for (const auto& item : *node) pending.push_back(&item);
    }
  }
}

void decode_and_check(const etcd::HttpReply& reply, const std::string& where) {
  try {
    trace("decode_reply(status %d, %zu bytes)\n", reply.status, reply.body.size());
    Json json = etcd::decode_reply(kOrigin, where, kPath, reply);
    trace("  accepted\n");
    check(reply.status == 200, "decode_reply accepted a reply whose status is not 200");
    check_accepted(json);
  } catch (...) {
    expect_ddp_error(/*token_expired_allowed=*/true);
  }
}

void decode_message_and_check(const std::string& line, const std::string& where) {
  try {
    trace("decode_stream_message(%zu bytes)\n", line.size());
    check_accepted(etcd::decode_stream_message(where, line));
    trace("  accepted\n");
  } catch (...) {
    expect_ddp_error(false);
  }
}

// One end of the socket pair: the etcd member, played by the input.
class Peer {
 public:
  explicit Peer(int fd) : fd_(fd) {}
  ~Peer() { ::close(fd_); }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  // Writes what fits now: the client reads only when the harness calls it, so
  // a blocking write could wait forever. Inputs are far below the socket's
  // buffer, so in practice all of it fits.
  void send(std::string_view bytes) {
    while (!bytes.empty() && !closed_) {
      ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        bytes.remove_prefix(static_cast<std::size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        return;  // full, or the client closed its end
      }
    }
  }

  void half_close() {
    if (!closed_) ::shutdown(fd_, SHUT_WR);
    closed_ = true;
  }

 private:
  int fd_;
  bool closed_ = false;
};

// Chunks as session_fuzz cuts them: a little-endian u16 length, then that many
// bytes (the last chunk may be shorter).
class Chunks {
 public:
  explicit Chunks(std::string_view rest) : rest_(rest) {}
  bool next(std::string_view& chunk) {
    if (rest_.size() < 2) return false;
    const std::size_t length = static_cast<std::uint8_t>(rest_[0]) |
                               (static_cast<std::size_t>(static_cast<std::uint8_t>(rest_[1])) << 8);
    rest_.remove_prefix(2);
    chunk = rest_.substr(0, length);
    rest_.remove_prefix(chunk.size());
    return true;
  }

 private:
  std::string_view rest_;
};

void fuzz_unary(etcd::Connection& connection, Peer& peer, std::string_view reply_bytes) {
  peer.send(reply_bytes);
  peer.half_close();
  for (int i = 0; i < kMaxPosts && connection.is_open(); ++i) {
    etcd::HttpReply reply;
    trace("post\n");
    try {
      reply = connection.post(kPath, R"({"key":"AA=="})", "", Deadline(kSafety), Deadline(kSafety));
    } catch (...) {
      expect_ddp_error(false);
      return;
    }
    decode_and_check(reply, connection.where());
  }
}

void fuzz_stream(etcd::Connection& connection, Peer& peer, std::string_view rest) {
  Chunks chunks(rest);
  std::string_view chunk;
  if (!chunks.next(chunk)) return;
  peer.send(chunk);
  // Without "\r\n\r\n" the header cannot end: the peer is done (the header is
  // cut short by its EOF) rather than every such input waiting out a deadline.
  if (chunk.find("\r\n\r\n") == std::string_view::npos) peer.half_close();
  int status = 0;
  trace("post_stream\n");
  try {
    status = connection.post_stream("/v3/watch", R"({"create_request":{"key":"AA=="}})", "",
                                    Deadline(kSafety), nullptr, /*endless=*/true);
  } catch (...) {
    expect_ddp_error(false);
    return;
  }
  trace("  status %d\n", status);
  if (status != 200) {
    while (chunks.next(chunk)) peer.send(chunk);
    peer.half_close();
    etcd::HttpReply reply{status, ""};
    trace("stream_rest\n");
    try {
      reply.body = connection.stream_rest(Deadline(kSafety));
    } catch (...) {
      expect_ddp_error(false);
      return;
    }
    decode_and_check(reply, connection.where());
    return;
  }
  while (chunks.next(chunk)) {
    peer.send(chunk);
    for (;;) {
      std::optional<std::string> line;
      try {
        line = connection.next_line(Deadline(0ms));
      } catch (...) {
        expect_ddp_error(false);
        return;  // the connection is closed after a failure
      }
      trace("next_line(Deadline(0)): %s\n", line ? "a line" : "nullopt");
      if (!line) break;  // nothing more until the next chunk
      decode_message_and_check(*line, connection.where());
    }
  }
  // The member goes away: what is left is read, then the stream must end.
  peer.half_close();
  for (;;) {
    std::optional<std::string> line;
    trace("next_line after EOF\n");
    try {
      line = connection.next_line(Deadline(kSafety));
    } catch (...) {
      expect_ddp_error(false);
      return;
    }
    check(line.has_value(), "next_line saw no line and no end after the peer's EOF");
    decode_message_and_check(*line, connection.where());
  }
}

// Whether padded base64 `text` is how base64_encode writes its bytes: the bits
// of the last digit below the last byte are zero.
bool canonical_base64(std::string_view text, std::size_t padding) {
  if (padding == 0) return true;
  auto digit = [](char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : 63;
  };
  const int last = digit(text[text.size() - padding - 1]);
  return (last & (padding == 1 ? 0x3 : 0xF)) == 0;
}

void fuzz_base64(std::string_view text) {
  const bool padded = etcd::is_padded_base64(text);
  std::string decoded;
  bool decodes = true;
  try {
    decoded = etcd::base64_decode(text);
  } catch (const ProtocolError&) {
    decodes = false;
  } catch (...) {
    die("base64_decode threw something other than ProtocolError");
  }
  check(decodes == padded, "base64_decode and is_padded_base64 disagree");
  if (decodes) {
    std::size_t padding = 0;
    while (padding < 2 && padding < text.size() && text[text.size() - 1 - padding] == '=')
      ++padding;
    check(decoded.size() == text.size() / 4 * 3 - padding,
          "base64_decode gave the wrong number of bytes");
    const std::string again = etcd::base64_encode(decoded);
    check(again.size() == text.size(), "re-encoding changed the length");
    if (canonical_base64(text, padding)) {
      check(again == text, "canonical base64 does not re-encode to itself");
    } else {
      // Decoding drops the low bits of the last digit; only that digit differs.
      const std::size_t last = text.size() - padding - 1;
      check(again.compare(0, last, text, 0, last) == 0 &&
                again.compare(last + 1, padding, text, last + 1, padding) == 0,
            "non-canonical base64 re-encodes differently beyond its last digit");
    }
  }
  const std::string encoded = etcd::base64_encode(text);
  check(etcd::is_padded_base64(encoded), "base64_encode wrote what is_padded_base64 refuses");
  std::string back;
  try {
    back = etcd::base64_decode(encoded);
  } catch (...) {
    die("base64_decode refused base64_encode's text");
  }
  check(back == text, "encode then decode changed the bytes");
}

void fuzz_decode(std::uint8_t mode, std::string_view body) {
  // Statuses etcd's gateway and the things in front of it answer with.
  static const int kStatuses[16] = {200, 200, 200, 200, 200, 200, 200, 200,
                                    400, 401, 403, 404, 500, 502, 503, 100};
  const etcd::HttpReply reply{kStatuses[mode >> 4], std::string(body)};
  decode_and_check(reply, "10.0.0.9:2379");
  decode_message_and_check(reply.body, "10.0.0.9:2379");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tracing = std::getenv("DDP_FUZZ_LOG") != nullptr;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (mode & kModeMask) {
    case kModeBase64:
      fuzz_base64(rest);
      return 0;
    case kModeDecode:
      fuzz_decode(mode, rest);
      return 0;
    default:
      break;
  }
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    std::perror("etcd_reply_fuzz: socketpair");
    std::abort();
  }
  Peer peer(fds[1]);
  std::unique_ptr<etcd::Connection> connection;
  try {
    connection = etcd::Connection::adopt(fds[0], EtcdEndpoint{"10.0.0.9", 2379},
                                         (mode & kModeSmallLimit) ? kSmallLimit : kLimit);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "etcd_reply_fuzz: adopt: %s\n", e.what());
    std::abort();
  }
  if ((mode & kModeMask) == kModeStream) {
    fuzz_stream(*connection, peer, rest);
  } else {
    fuzz_unary(*connection, peer, rest);
  }
  return 0;
}
