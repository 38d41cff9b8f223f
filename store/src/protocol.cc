#include "ddp/store/protocol.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>
#include <limits>

namespace ddp::protocol {

namespace {

constexpr std::string_view kServerAuthContext = "ddp-store-auth-v2 server";
constexpr std::string_view kClientAuthContext = "ddp-store-auth-v2 client";
constexpr std::uint8_t kHelloFlagAuth = 0x01;
// A frame buffer up to this size is kept for the next frame; a larger one is freed.
constexpr std::size_t kKeptBodyCapacity = 64 * 1024;

// ---- writing ---------------------------------------------------------------

void put_u8(std::string& out, std::uint8_t v) { out.push_back(static_cast<char>(v)); }

void put_u16(std::string& out, std::uint16_t v) {
  char b[2] = {static_cast<char>(v & 0xFF), static_cast<char>(v >> 8)};
  out.append(b, 2);
}

void put_u32(std::string& out, std::uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  out.append(b, 4);
}

void put_u64(std::string& out, std::uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  out.append(b, 8);
}

// A length that does not fit the wire's u32 is a caller's bug (every limit is
// far below 4 GiB): refuse it rather than send a truncated length.
std::uint32_t wire_length(std::size_t size, const char* what) {
  if (size > std::numeric_limits<std::uint32_t>::max()) {
    throw InvalidArgument(
        "protocol", fmt::format("{} of {} bytes does not fit a frame (at most 4 GiB)", what, size));
  }
  return static_cast<std::uint32_t>(size);
}

void put_bytes(std::string& out, std::string_view s) {
  put_u32(out, wire_length(s.size(), "a field"));
  out.append(s);
}

void put_list(std::string& out, const std::vector<std::string_view>& list) {
  put_u32(out, wire_length(list.size(), "a list"));
  for (auto s : list) put_bytes(out, s);
}

// Frames are built in place: a placeholder header, the payload, then the length.
std::size_t begin_frame(std::string& out) {
  std::size_t start = out.size();
  out.append(kHeaderSize, '\0');
  return start;
}

void end_frame(std::string& out, std::size_t start) {
  std::size_t size = out.size() - start - kHeaderSize;
  if (size > std::numeric_limits<std::uint32_t>::max()) {
    out.resize(start);  // leave `out` as it was before the frame
    wire_length(size, "a frame");
  }
  auto length = static_cast<std::uint32_t>(size);
  for (std::size_t i = 0; i < kHeaderSize; ++i) {
    out[start + i] = static_cast<char>((length >> (8 * i)) & 0xFF);
  }
}

// ---- reading ---------------------------------------------------------------

// Reads fields from a payload; every read checks the bounds, the first failure
// sticks, so a decoder can read everything and check once.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}

  bool ok() const { return error_.ok(); }
  const Result& error() const { return error_; }
  bool at_end() const { return pos_ == data_.size(); }
  std::size_t remaining() const { return data_.size() - pos_; }

  void fail(Status status, std::string message) {
    if (error_.ok()) error_ = Result{status, std::move(message)};
    pos_ = data_.size();
  }

  std::uint64_t uint(std::size_t bytes, const char* what) {
    if (!error_.ok()) return 0;
    if (remaining() < bytes) {
      fail(Status::kMalformed,
           fmt::format("truncated {}: {} byte(s) left, {} needed", what, remaining(), bytes));
      return 0;
    }
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < bytes; ++i) {
      v |= static_cast<std::uint64_t>(static_cast<unsigned char>(data_[pos_ + i])) << (8 * i);
    }
    pos_ += bytes;
    return v;
  }

  std::string_view raw(std::size_t bytes, const char* what) {
    if (!error_.ok()) return {};
    if (remaining() < bytes) {
      fail(Status::kMalformed,
           fmt::format("truncated {}: {} byte(s) left, {} needed", what, remaining(), bytes));
      return {};
    }
    auto s = data_.substr(pos_, bytes);
    pos_ += bytes;
    return s;
  }

  // A u32-length-prefixed byte string of at most `limit` bytes.
  std::string_view bytes(const char* what, std::uint32_t limit, Status too_large) {
    auto size = static_cast<std::uint32_t>(uint(4, what));
    if (!error_.ok()) return {};
    if (size > limit) {
      fail(too_large,
           fmt::format("{} of {} bytes exceeds the limit of {} bytes", what, size, limit));
      return {};
    }
    return raw(size, what);
  }

  // A count of elements that each take at least `min_element` bytes: checked
  // against the bytes left so a lying count cannot make us reserve memory.
  std::uint32_t count(const char* what, std::size_t min_element) {
    auto n = static_cast<std::uint32_t>(uint(4, what));
    if (!error_.ok()) return 0;
    if (static_cast<std::uint64_t>(n) * min_element > remaining()) {
      fail(Status::kMalformed,
           fmt::format("{} of {} does not fit in the {} byte(s) left", what, n, remaining()));
      return 0;
    }
    return n;
  }

  // A count of keys (or key/value pairs) of one request: a count as above, and
  // at most kMaxKeysPerRequest (invalid argument: the frame itself was sound,
  // so the server answers it and keeps the connection).
  std::uint32_t key_count(const char* what, std::size_t min_element, const char* op) {
    auto n = count(what, min_element);
    if (n > kMaxKeysPerRequest) {
      fail(Status::kInvalidArgument,
           fmt::format("{} names {} keys, more than the {} one request may name", op, n,
                       kMaxKeysPerRequest));
      return 0;
    }
    return n;
  }

  void finish(const char* what) {
    if (error_.ok() && !at_end()) {
      fail(Status::kMalformed,
           fmt::format("{} byte(s) of trailing data after {}", remaining(), what));
    }
  }

 private:
  std::string_view data_;
  std::size_t pos_ = 0;
  Result error_;
};

std::string_view key_of(Reader& r, const Limits& l) {
  return r.bytes("key", l.max_key_size, Status::kKeyTooLarge);
}
std::string_view value_of(Reader& r, const Limits& l) {
  return r.bytes("value", l.max_value_size, Status::kValueTooLarge);
}

void keys_of(Reader& r, const Limits& l, std::vector<std::string_view>& keys, Op op) {
  auto n = r.key_count("key count", 4, to_string(op).data());
  keys.clear();
  keys.reserve(n);
  for (std::uint32_t i = 0; i < n && r.ok(); ++i) keys.push_back(key_of(r, l));
}

}  // namespace

// ---- names -------------------------------------------------------------------

bool is_known_op(std::uint8_t op) { return op == 0x01 || op == 0x02 || (op >= 0x10 && op <= 0x1A); }

bool carries_request_id(Op op) {
  return op == Op::kAdd || op == Op::kCompareSet || op == Op::kAppend || op == Op::kDeleteKey;
}

std::string_view to_string(Op op) {
  switch (op) {
    case Op::kHello:
      return "hello";
    case Op::kAuth:
      return "auth";
    case Op::kSet:
      return "set";
    case Op::kGet:
      return "get";
    case Op::kAdd:
      return "add";
    case Op::kCompareSet:
      return "compare_set";
    case Op::kWait:
      return "wait";
    case Op::kCheck:
      return "check";
    case Op::kDeleteKey:
      return "delete_key";
    case Op::kNumKeys:
      return "num_keys";
    case Op::kMultiGet:
      return "multi_get";
    case Op::kMultiSet:
      return "multi_set";
    case Op::kAppend:
      return "append";
  }
  return "unknown";
}

std::string_view to_string(Status status) {
  switch (status) {
    case Status::kOk:
      return "ok";
    case Status::kMalformed:
      return "malformed frame";
    case Status::kFrameTooLarge:
      return "frame too large";
    case Status::kKeyTooLarge:
      return "key too large";
    case Status::kValueTooLarge:
      return "value too large";
    case Status::kUnknownOp:
      return "unknown operation";
    case Status::kBadMagic:
      return "bad magic";
    case Status::kBadVersion:
      return "unsupported protocol version";
    case Status::kAuthRequired:
      return "authentication required";
    case Status::kAuthFailed:
      return "authentication failed";
    case Status::kUnexpected:
      return "unexpected message";
    case Status::kTimeout:
      return "timeout";
    case Status::kInvalidArgument:
      return "invalid argument";
    case Status::kShutdown:
      return "server shutting down";
    case Status::kTooManyClients:
      return "too many clients";
    case Status::kIdleTimeout:
      return "idle timeout";
    case Status::kHandshakeTimeout:
      return "handshake timeout";
    case Status::kInternal:
      return "internal server error";
    case Status::kReplyTooLarge:
      return "reply too large";
    case Status::kStoreFull:
      return "store full";
    case Status::kStaleRequest:
      return "stale request";
  }
  return "unknown status";
}

ErrorKind error_kind(Status status) {
  switch (status) {
    case Status::kMalformed:
    case Status::kFrameTooLarge:
    case Status::kUnknownOp:
    case Status::kBadMagic:
    case Status::kBadVersion:
    case Status::kUnexpected:
      return ErrorKind::kProtocol;
    case Status::kKeyTooLarge:
    case Status::kValueTooLarge:
    case Status::kInvalidArgument:
    case Status::kReplyTooLarge:
    case Status::kStoreFull:
    case Status::kStaleRequest:
      return ErrorKind::kInvalidArgument;
    case Status::kAuthRequired:
    case Status::kAuthFailed:
      return ErrorKind::kAuth;
    case Status::kTimeout:
      return ErrorKind::kTimeout;
    case Status::kShutdown:
      return ErrorKind::kShutdown;
    case Status::kTooManyClients:
    case Status::kIdleTimeout:
    case Status::kHandshakeTimeout:
      return ErrorKind::kNetwork;
    case Status::kOk:
    case Status::kInternal:
      break;
  }
  return ErrorKind::kInternal;
}

bool closes_connection(Status status) {
  switch (status) {
    case Status::kOk:
    case Status::kTimeout:
    case Status::kInvalidArgument:
    case Status::kReplyTooLarge:
    case Status::kStoreFull:
    case Status::kStaleRequest:
      return false;
    default:
      return true;
  }
}

// ---- frames ------------------------------------------------------------------

FrameParser::State FrameParser::fail(Status status, std::string message) {
  phase_ = Phase::kBad;
  error_ = Result{status, std::move(message)};
  body_.clear();
  payload_ = {};
  return State::kBad;
}

FrameParser::State FrameParser::consume(std::string_view& input) {
  payload_ = {};
  // The last frame's payload is no longer referenced: a buffer a large frame
  // grew is given back rather than kept for the life of the connection.
  if (phase_ == Phase::kHeader && body_.capacity() > kKeptBodyCapacity) std::string().swap(body_);
  while (true) {
    switch (phase_) {
      case Phase::kBad:
        return State::kBad;
      case Phase::kHeader: {
        while (header_have_ < kHeaderSize && !input.empty()) {
          header_[header_have_++] = static_cast<unsigned char>(input.front());
          input.remove_prefix(1);
        }
        if (header_have_ < kHeaderSize) return State::kNeedMore;
        need_ = static_cast<std::uint32_t>(header_[0]) |
                static_cast<std::uint32_t>(header_[1]) << 8 |
                static_cast<std::uint32_t>(header_[2]) << 16 |
                static_cast<std::uint32_t>(header_[3]) << 24;
        if (need_ == 0) return fail(Status::kMalformed, "empty frame (length 0)");
        if (need_ > max_frame_size_) {
          return fail(Status::kFrameTooLarge,
                      fmt::format("frame of {} bytes exceeds the limit of {} bytes", need_,
                                  max_frame_size_));
        }
        body_.clear();
        phase_ = Phase::kPayload;
        break;
      }
      case Phase::kPayload: {
        // A large request whose head already refuses it is neither assembled
        // nor read to its end: the stream is bad from here (a 32 MiB list of
        // empty keys costs the server a few reads, not 32 MiB of them).
        if (check_heads_ && need_ > kHeadCheckedFrame && body_.size() < kRequestHeadSize &&
            body_.size() + input.size() >= kRequestHeadSize) {
          std::string head = body_;
          head.append(input.substr(0, kRequestHeadSize - body_.size()));
          Result verdict = check_request_head(head);
          if (!verdict.ok()) {
            std::string().swap(body_);
            return fail(verdict.status, verdict.message);
          }
        }
        // Zero copy when the whole payload is in the input; otherwise assemble.
        // body_ grows with the bytes that really arrive (no reserve of the
        // announced size: a peer could announce 512 MiB and send nothing).
        if (body_.empty() && input.size() >= need_) {
          payload_ = input.substr(0, need_);
          input.remove_prefix(need_);
        } else {
          std::size_t take = std::min<std::size_t>(need_ - body_.size(), input.size());
          body_.append(input.data(), take);
          input.remove_prefix(take);
          if (body_.size() < need_) return State::kNeedMore;
          payload_ = body_;
        }
        phase_ = Phase::kHeader;
        header_have_ = 0;
        return State::kGood;
      }
    }
  }
}

// ---- requests ----------------------------------------------------------------

Result check_request_head(std::string_view head) {
  if (head.empty()) return {};
  const auto op = static_cast<Op>(static_cast<std::uint8_t>(head[0]));
  std::size_t at = 0;
  if (op == Op::kWait || op == Op::kMultiGet) {
    at = 9;  // opcode, timeout
  } else if (op == Op::kCheck || op == Op::kMultiSet) {
    at = 1;
  } else {
    return {};
  }
  if (head.size() < at + 4) return {};
  std::uint32_t count = 0;
  for (int i = 0; i < 4; ++i) {
    count |= static_cast<std::uint32_t>(static_cast<unsigned char>(head[at + i])) << (8 * i);
  }
  if (count <= kMaxKeysPerRequest) return {};
  return Result{Status::kInvalidArgument,
                fmt::format("{} names {} keys, more than the {} one request may name",
                            to_string(op), count, kMaxKeysPerRequest)};
}

Result decode_request(std::string_view payload, const Limits& limits, Request& out) {
  if (payload.empty()) return Result{Status::kMalformed, "empty payload"};
  auto code = static_cast<std::uint8_t>(payload[0]);
  if (!is_known_op(code)) {
    return Result{Status::kUnknownOp, fmt::format("unknown operation 0x{:02x}", code)};
  }
  Reader r(payload.substr(1));
  // Field by field, so that a reused Request keeps its vectors' capacity.
  out.op = static_cast<Op>(code);
  out.key = out.value = out.desired = out.mac = out.nonce = out.client_id = {};
  out.delta = 0;
  out.request_id = 0;
  out.timeout_ms = 0;
  out.keys.clear();
  out.values.clear();
  out.version = kVersion;
  switch (out.op) {
    case Op::kHello: {
      auto magic = r.raw(kMagic.size(), "magic");
      if (r.ok() && magic != kMagic) {
        return Result{Status::kBadMagic, "hello does not start with the magic \"DDPS\""};
      }
      out.version = static_cast<std::uint16_t>(r.uint(2, "version"));
      // The version decides the layout of the rest: check it first, so that an
      // older client hears "unsupported version", not "malformed".
      if (r.ok() && out.version != kVersion) {
        return Result{Status::kBadVersion,
                      fmt::format("client speaks protocol version {}, server speaks {}",
                                  out.version, kVersion)};
      }
      out.nonce = r.raw(kNonceSize, "client nonce");
      out.client_id = r.raw(kClientIdSize, "client id");
      break;
    }
    case Op::kAuth:
      out.mac = r.raw(kMacSize, "auth mac");
      break;
    case Op::kSet:
      out.key = key_of(r, limits);
      out.value = value_of(r, limits);
      break;
    case Op::kAppend:
      out.request_id = r.uint(8, "request id");
      out.key = key_of(r, limits);
      out.value = value_of(r, limits);
      break;
    case Op::kGet:
      out.timeout_ms = r.uint(8, "timeout");
      out.key = key_of(r, limits);
      break;
    case Op::kAdd:
      out.request_id = r.uint(8, "request id");
      out.key = key_of(r, limits);
      out.delta = static_cast<std::int64_t>(r.uint(8, "delta"));
      break;
    case Op::kCompareSet:
      out.request_id = r.uint(8, "request id");
      out.key = key_of(r, limits);
      out.value = value_of(r, limits);
      out.desired = value_of(r, limits);
      break;
    case Op::kWait:
    case Op::kMultiGet:
      out.timeout_ms = r.uint(8, "timeout");
      keys_of(r, limits, out.keys, out.op);
      break;
    case Op::kCheck:
      keys_of(r, limits, out.keys, out.op);
      break;
    case Op::kDeleteKey:
      out.request_id = r.uint(8, "request id");
      out.key = key_of(r, limits);
      break;
    case Op::kNumKeys:
      break;
    case Op::kMultiSet: {
      auto n = r.key_count("pair count", 8, "multi_set");
      out.keys.reserve(n);
      out.values.reserve(n);
      for (std::uint32_t i = 0; i < n && r.ok(); ++i) {
        out.keys.push_back(key_of(r, limits));
        out.values.push_back(value_of(r, limits));
      }
      break;
    }
  }
  r.finish(to_string(out.op).data());
  return r.error();
}

void encode_request(std::string& out, const Request& q) {
  auto start = begin_frame(out);
  put_u8(out, static_cast<std::uint8_t>(q.op));
  switch (q.op) {
    case Op::kHello:
      out.append(kMagic);
      put_u16(out, q.version);
      // Fixed-size fields: a short one is padded (the server then rejects it).
      out.append(q.nonce.substr(0, kNonceSize))
          .append(kNonceSize - std::min(kNonceSize, q.nonce.size()), '\0');
      out.append(q.client_id.substr(0, kClientIdSize))
          .append(kClientIdSize - std::min(kClientIdSize, q.client_id.size()), '\0');
      break;
    case Op::kAuth:
      out.append(q.mac);
      break;
    case Op::kSet:
      put_bytes(out, q.key);
      put_bytes(out, q.value);
      break;
    case Op::kAppend:
      put_u64(out, q.request_id);
      put_bytes(out, q.key);
      put_bytes(out, q.value);
      break;
    case Op::kGet:
      put_u64(out, q.timeout_ms);
      put_bytes(out, q.key);
      break;
    case Op::kAdd:
      put_u64(out, q.request_id);
      put_bytes(out, q.key);
      put_u64(out, static_cast<std::uint64_t>(q.delta));
      break;
    case Op::kCompareSet:
      put_u64(out, q.request_id);
      put_bytes(out, q.key);
      put_bytes(out, q.value);
      put_bytes(out, q.desired);
      break;
    case Op::kWait:
    case Op::kMultiGet:
      put_u64(out, q.timeout_ms);
      put_list(out, q.keys);
      break;
    case Op::kCheck:
      put_list(out, q.keys);
      break;
    case Op::kDeleteKey:
      put_u64(out, q.request_id);
      put_bytes(out, q.key);
      break;
    case Op::kNumKeys:
      break;
    case Op::kMultiSet:
      put_u32(out, static_cast<std::uint32_t>(q.keys.size()));
      for (std::size_t i = 0; i < q.keys.size(); ++i) {
        put_bytes(out, q.keys[i]);
        put_bytes(out, i < q.values.size() ? q.values[i] : std::string_view());
      }
      break;
  }
  end_frame(out, start);
}

// ---- replies -----------------------------------------------------------------

void encode_ok(std::string& out) {
  auto start = begin_frame(out);
  put_u8(out, 0);
  end_frame(out, start);
}

void encode_error(std::string& out, Status status, std::string_view message) {
  auto start = begin_frame(out);
  put_u8(out, static_cast<std::uint8_t>(status));
  put_bytes(out, message);
  end_frame(out, start);
}

void encode_value(std::string& out, std::string_view value) {
  auto start = begin_frame(out);
  put_u8(out, 0);
  put_bytes(out, value);
  end_frame(out, start);
}

void encode_integer(std::string& out, std::int64_t value) {
  auto start = begin_frame(out);
  put_u8(out, 0);
  put_u64(out, static_cast<std::uint64_t>(value));
  end_frame(out, start);
}

void encode_flag(std::string& out, bool flag) {
  auto start = begin_frame(out);
  put_u8(out, 0);
  put_u8(out, flag ? 1 : 0);
  end_frame(out, start);
}

void encode_values(std::string& out, const std::vector<std::string_view>& values) {
  auto start = begin_frame(out);
  put_u8(out, 0);
  put_list(out, values);
  end_frame(out, start);
}

void encode_hello_reply(std::string& out, std::uint16_t version, const Limits& limits,
                        std::string_view nonce, std::string_view server_mac) {
  auto start = begin_frame(out);
  put_u8(out, 0);
  put_u16(out, version);
  put_u8(out, nonce.empty() ? 0 : kHelloFlagAuth);
  put_u32(out, limits.max_key_size);
  put_u32(out, limits.max_value_size);
  put_u32(out, limits.max_frame_size);
  if (!nonce.empty()) {
    out.append(nonce);
    out.append(server_mac);
  }
  end_frame(out, start);
}

void encode_reply(std::string& out, Op op, const Reply& reply) {
  if (reply.status != Status::kOk) return encode_error(out, reply.status, reply.message);
  switch (op) {
    case Op::kHello:
      return encode_hello_reply(out, reply.version, reply.limits, reply.nonce, reply.server_mac);
    case Op::kGet:
    case Op::kCompareSet:
      return encode_value(out, reply.value);
    case Op::kAdd:
    case Op::kNumKeys:
      return encode_integer(out, reply.integer);
    case Op::kCheck:
    case Op::kDeleteKey:
      return encode_flag(out, reply.flag);
    case Op::kMultiGet:
      return encode_values(out, reply.values);
    case Op::kAuth:
    case Op::kSet:
    case Op::kWait:
    case Op::kMultiSet:
    case Op::kAppend:
      return encode_ok(out);
  }
}

Result decode_reply(Op op, std::string_view payload, Reply& out) {
  out = Reply{};
  if (payload.empty()) return Result{Status::kMalformed, "empty reply"};
  auto status = static_cast<std::uint8_t>(payload[0]);
  if (status > static_cast<std::uint8_t>(Status::kStaleRequest)) {
    return Result{Status::kMalformed, fmt::format("unknown reply status {}", status)};
  }
  out.status = static_cast<Status>(status);
  Reader r(payload.substr(1));
  if (out.status != Status::kOk) {
    out.message = r.bytes("error message", ~std::uint32_t{0}, Status::kMalformed);
    r.finish("error reply");
    return r.error();
  }
  switch (op) {
    case Op::kHello: {
      out.version = static_cast<std::uint16_t>(r.uint(2, "version"));
      auto flags = r.uint(1, "flags");
      out.limits.max_key_size = static_cast<std::uint32_t>(r.uint(4, "max key size"));
      out.limits.max_value_size = static_cast<std::uint32_t>(r.uint(4, "max value size"));
      out.limits.max_frame_size = static_cast<std::uint32_t>(r.uint(4, "max frame size"));
      if (flags & kHelloFlagAuth) {
        out.nonce = r.raw(kNonceSize, "nonce");
        out.server_mac = r.raw(kMacSize, "server proof");
      }
      break;
    }
    case Op::kGet:
    case Op::kCompareSet:
      out.value = r.bytes("value", ~std::uint32_t{0}, Status::kMalformed);
      break;
    case Op::kAdd:
    case Op::kNumKeys:
      out.integer = static_cast<std::int64_t>(r.uint(8, "integer"));
      break;
    case Op::kCheck:
    case Op::kDeleteKey: {
      auto flag = r.uint(1, "flag");
      if (r.ok() && flag > 1) r.fail(Status::kMalformed, fmt::format("flag byte {}", flag));
      out.flag = flag == 1;
      break;
    }
    case Op::kMultiGet: {
      auto n = r.count("value count", 4);
      out.values.reserve(n);
      for (std::uint32_t i = 0; i < n && r.ok(); ++i) {
        out.values.push_back(r.bytes("value", ~std::uint32_t{0}, Status::kMalformed));
      }
      break;
    }
    case Op::kAuth:
    case Op::kSet:
    case Op::kWait:
    case Op::kMultiSet:
    case Op::kAppend:
      break;
  }
  r.finish("reply");
  return r.error();
}

// ---- authentication ------------------------------------------------------------

std::string make_nonce() {
  std::string nonce(kNonceSize, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) !=
      1) {
    throw InternalError("protocol::make_nonce", "OpenSSL RAND_bytes failed");
  }
  return nonce;
}

std::string make_client_id() {
  std::string id(kClientIdSize, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(id.data()), static_cast<int>(id.size())) != 1) {
    throw InternalError("protocol::make_client_id", "OpenSSL RAND_bytes failed");
  }
  return id;
}

std::string auth_mac(Direction direction, std::string_view token, std::string_view client_nonce,
                     std::string_view server_nonce) {
  const std::string_view context =
      direction == Direction::kServer ? kServerAuthContext : kClientAuthContext;
  std::string data;
  data.reserve(context.size() + client_nonce.size() + server_nonce.size());
  data.append(context).append(client_nonce).append(server_nonce);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac,
           &size) == nullptr ||
      size != kMacSize) {
    throw InternalError("protocol::auth_mac", "OpenSSL HMAC-SHA256 failed");
  }
  return std::string(reinterpret_cast<const char*>(mac), size);
}

bool verify_auth(Direction direction, std::string_view token, std::string_view client_nonce,
                 std::string_view server_nonce, std::string_view mac) {
  if (mac.size() != kMacSize) return false;
  auto expected = auth_mac(direction, token, client_nonce, server_nonce);
  return CRYPTO_memcmp(expected.data(), mac.data(), kMacSize) == 0;
}

// ---- handshake -------------------------------------------------------------------

ServerHandshake::ServerHandshake(std::string_view token, std::string nonce, const Limits& limits)
    : token_(token), nonce_(token.empty() ? std::string() : std::move(nonce)), limits_(limits) {}

Result ServerHandshake::fail(std::string& out, Status status, std::string message) {
  phase_ = Phase::kFailed;
  encode_error(out, status, message);
  return Result{status, std::move(message)};
}

Result ServerHandshake::on_request(const Request& request, std::string& out) {
  switch (phase_) {
    case Phase::kHello:
      if (request.op != Op::kHello) {
        return fail(out, Status::kUnexpected,
                    fmt::format("expected hello, got {}", to_string(request.op)));
      }
      client_nonce_.assign(request.nonce);
      client_id_.assign(request.client_id);
      if (token_.empty()) {
        encode_hello_reply(out, kVersion, limits_, {}, {});
        phase_ = Phase::kDone;
      } else {
        encode_hello_reply(out, kVersion, limits_, nonce_,
                           auth_mac(Direction::kServer, token_, client_nonce_, nonce_));
        phase_ = Phase::kAuth;
      }
      return {};
    case Phase::kAuth:
      if (request.op != Op::kAuth) {
        return fail(
            out, Status::kAuthRequired,
            fmt::format("the server requires a token; got {} before auth", to_string(request.op)));
      }
      if (!verify_auth(Direction::kClient, token_, client_nonce_, nonce_, request.mac)) {
        return fail(out, Status::kAuthFailed, "wrong token");
      }
      encode_ok(out);
      phase_ = Phase::kDone;
      return {};
    case Phase::kDone:
      return fail(out, Status::kUnexpected,
                  fmt::format("{} after the handshake completed", to_string(request.op)));
    case Phase::kFailed:
      break;
  }
  return fail(out, Status::kUnexpected, "handshake already failed");
}

}  // namespace ddp::protocol
