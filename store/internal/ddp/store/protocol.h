// The store's wire protocol as a pure codec: bytes in, messages out, no I/O.
// store/PROTOCOL.md describes the bytes; this header is the C++ side.
//
// Every message is a frame: a little-endian u32 payload length followed by the
// payload. A request payload starts with an opcode byte, a reply payload with a
// status byte (0 = ok). FrameParser assembles frames from a byte stream (a state
// machine returning good / bad / need-more); decode_request / decode_reply turn a
// payload into a message and enforce the limits. Decoded messages hold
// string_views into the payload: they are valid while the payload bytes are.
//
// Nothing here throws on malformed input: errors are returned as a Status plus a
// message, so the server can answer them and close only the offending connection.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/store/store_limits.h"

namespace ddp::protocol {

inline constexpr std::string_view kMagic = "DDPS";
inline constexpr std::uint16_t kVersion = 2;
inline constexpr std::size_t kHeaderSize = 4;
inline constexpr std::size_t kNonceSize = 32;
inline constexpr std::size_t kMacSize = 32;
// A client's identity across its reconnections (random, chosen by the client).
inline constexpr std::size_t kClientIdSize = 16;
// Frames before the handshake completes may not be larger than this, so that a
// stranger (an HTTP client, a port scanner) is turned away after a few bytes.
inline constexpr std::uint32_t kMaxHandshakeFrame = 64;
// The client's bound on the server's replies before the handshake completes
// (a hello reply with a nonce and a proof, or an error message).
inline constexpr std::uint32_t kMaxHandshakeReply = 4096;
// A timeout_ms of this value means "wait forever".
inline constexpr std::uint64_t kNoTimeout = ~std::uint64_t{0};
// The most keys one request may name (wait, check, multi_get, multi_set): a
// request of many empty keys is a few bytes per key on the wire but costs the
// server a lookup and a view per key, on its only thread, so their number is
// bounded, not only their bytes (1,024 lookups take under 0.1 ms). A longer
// list gets `invalid argument` (the connection stays open); TcpStore splits
// longer lists itself.
inline constexpr std::uint32_t kMaxKeysPerRequest = 1024;
// A request's first bytes (opcode, timeout, key count) are enough to refuse
// one that names too many keys: check_request_head.
inline constexpr std::size_t kRequestHeadSize = 13;
// Bit 63 of a request id marks a retry: the client sends the request again
// after a lost connection (the id's other bits are unchanged). Sequence
// numbers never reach it. See ClientRegistry (store_server) for what the
// server does with it.
inline constexpr std::uint64_t kRetryFlag = std::uint64_t{1} << 63;

enum class Op : std::uint8_t {
  kHello = 0x01,
  kAuth = 0x02,
  kSet = 0x10,
  kGet = 0x11,
  kAdd = 0x12,
  kCompareSet = 0x13,
  kWait = 0x14,
  kCheck = 0x15,
  kDeleteKey = 0x16,
  kNumKeys = 0x17,
  kMultiGet = 0x18,
  kMultiSet = 0x19,
  kAppend = 0x1A,
};

// true for every opcode above.
bool is_known_op(std::uint8_t op);
std::string_view to_string(Op op);

// The status byte of a reply. Every non-ok status is followed by a message.
enum class Status : std::uint8_t {
  kOk = 0,
  kMalformed = 1,          // a frame or field that does not parse (connection closed)
  kFrameTooLarge = 2,      // length prefix above the frame limit (connection closed)
  kKeyTooLarge = 3,        // a key above max_key_size (connection closed)
  kValueTooLarge = 4,      // a value above max_value_size (connection closed)
  kUnknownOp = 5,          // an opcode this server does not know (connection closed)
  kBadMagic = 6,           // the hello does not start with "DDPS" (connection closed)
  kBadVersion = 7,         // the client speaks another protocol version (connection closed)
  kAuthRequired = 8,       // an operation before a required auth step (connection closed)
  kAuthFailed = 9,         // wrong token (connection closed)
  kUnexpected = 10,        // a message out of order, e.g. a second hello (connection closed)
  kTimeout = 11,           // get/wait/multi_get timed out (connection stays open)
  kInvalidArgument = 12,   // e.g. add on a non-integer value (connection stays open)
  kShutdown = 13,          // the server is shutting down (connection closed)
  kTooManyClients = 14,    // max_clients reached (connection closed)
  kIdleTimeout = 15,       // no frame within the idle timeout (connection closed)
  kHandshakeTimeout = 16,  // no complete handshake in time (connection closed)
  kInternal = 17,          // a server bug (connection closed)
  kReplyTooLarge = 18,     // the reply would exceed max_frame_size (connection stays open)
  kStoreFull = 19,         // a memory limit of the server (connection stays open)
  kStaleRequest = 20,      // a request id below the client's last one (connection stays open)
};

std::string_view to_string(Status status);
// The ddp::Error kind a client raises for `status` (kInternal for kOk).
ErrorKind error_kind(Status status);
// true for statuses after which the server closes the connection.
bool closes_connection(Status status);

struct Limits {
  std::uint32_t max_key_size = store_limits::kMaxKeySize;
  std::uint32_t max_value_size = store_limits::kMaxValueSize;
  std::uint32_t max_frame_size = store_limits::kMaxFrameSize;
};

struct Request {
  Op op = Op::kNumKeys;
  std::string_view key;                  // set get add compare_set delete_key append
  std::string_view value;                // set append; compare_set: expected
  std::string_view desired;              // compare_set
  std::int64_t delta = 0;                // add
  std::uint64_t timeout_ms = 0;          // get wait multi_get (kNoTimeout: forever)
  std::vector<std::string_view> keys;    // wait check multi_get multi_set
  std::vector<std::string_view> values;  // multi_set (same length as keys)
  std::uint16_t version = kVersion;      // hello
  std::string_view nonce;                // hello: the client's nonce (kNonceSize bytes)
  std::string_view client_id;            // hello: kClientIdSize bytes
  std::string_view mac;                  // auth: HMAC-SHA256 (kMacSize bytes)
  // add compare_set append delete_key: the client's sequence number of this
  // request (0: none). A retry after a reconnection carries the same id, and
  // the server answers it from its record instead of applying it twice.
  std::uint64_t request_id = 0;
};

// true for the operations that carry a request id (not idempotent).
bool carries_request_id(Op op);

struct Reply {
  Status status = Status::kOk;
  std::string_view message;              // status != kOk
  std::string_view value;                // get compare_set
  std::int64_t integer = 0;              // add num_keys
  bool flag = false;                     // check delete_key
  std::vector<std::string_view> values;  // multi_get
  // hello: the server's version, limits and, when auth is required, its nonce
  // and its proof that it holds the token (server_mac over both nonces).
  std::uint16_t version = kVersion;
  Limits limits;
  std::string_view nonce;  // empty: no auth step
  std::string_view server_mac;
};

// The outcome of decoding: kOk, or a status naming what is wrong plus a message.
struct Result {
  Status status = Status::kOk;
  std::string message;
  bool ok() const { return status == Status::kOk; }
};

// Assembles frames from a byte stream. A state machine: header, payload, bad.
class FrameParser {
 public:
  enum class State { kGood, kBad, kNeedMore };

  explicit FrameParser(std::uint32_t max_frame_size) : max_frame_size_(max_frame_size) {}

  // Frames announced larger than this are rejected with kFrameTooLarge.
  void set_max_frame_size(std::uint32_t size) { max_frame_size_ = size; }
  // Requests: a frame of more than kHeadCheckedFrame bytes whose first bytes
  // check_request_head refuses is neither assembled nor read further:
  // consume() returns kBad with that refusal as error() (reading a hostile
  // 32 MiB frame to its end would cost the server more than its sender).
  void check_request_heads(bool on) { check_heads_ = on; }
  static constexpr std::uint32_t kHeadCheckedFrame = 64 * 1024;

  // Consumes a prefix of `input` and advances it past what was consumed.
  // kGood: payload() is one complete frame's payload; it points into `input`
  //   (zero copy) or into the parser, valid until the next consume().
  // kNeedMore: every byte of `input` was consumed and no frame is complete.
  // kBad: error() says why; the parser stays bad (the stream is unusable).
  State consume(std::string_view& input);

  std::string_view payload() const { return payload_; }
  const Result& error() const { return error_; }
  // true between frames (no partial frame buffered).
  bool idle() const { return phase_ == Phase::kHeader && header_have_ == 0; }
  // Bytes of an incomplete frame held in the parser (its own buffer).
  std::size_t buffered() const { return body_.size(); }

 private:
  enum class Phase { kHeader, kPayload, kBad };
  State fail(Status status, std::string message);

  std::uint32_t max_frame_size_;
  bool check_heads_ = false;
  Phase phase_ = Phase::kHeader;
  std::array<unsigned char, kHeaderSize> header_{};
  std::size_t header_have_ = 0;
  std::uint32_t need_ = 0;
  std::string body_;
  std::string_view payload_;
  Result error_;
};

// Decodes a request payload. Hello: checks the magic and version (kBadMagic,
// kBadVersion). Every key and value is checked against `limits`.
Result decode_request(std::string_view payload, const Limits& limits, Request& out);

// What the first kRequestHeadSize bytes of a request payload already refuse:
// a wait, check, multi_get or multi_set naming more than kMaxKeysPerRequest
// keys (kInvalidArgument, as decode_request would say). Ok otherwise,
// including for a head too short to tell.
Result check_request_head(std::string_view head);

// Decodes the reply to a request of kind `op`. A well-formed error reply is ok()
// with out.status != kOk; a reply that does not parse is kMalformed.
Result decode_reply(Op op, std::string_view payload, Reply& out);

// Appends one complete frame (header and payload) to `out`.
void encode_request(std::string& out, const Request& request);
// The reply to a request of kind `op`; only the fields of that kind are used.
void encode_reply(std::string& out, Op op, const Reply& reply);

// Specific reply encoders (what the server uses; encode_reply calls them).
void encode_ok(std::string& out);
void encode_error(std::string& out, Status status, std::string_view message);
void encode_value(std::string& out, std::string_view value);
void encode_integer(std::string& out, std::int64_t value);
void encode_flag(std::string& out, bool flag);
void encode_values(std::string& out, const std::vector<std::string_view>& values);
// `nonce` and `server_mac` are empty when there is no auth step.
void encode_hello_reply(std::string& out, std::uint16_t version, const Limits& limits,
                        std::string_view nonce, std::string_view server_mac);

// A fresh random nonce (OpenSSL RAND_bytes). Throws InternalError when the RNG fails.
std::string make_nonce();
// kClientIdSize random bytes. Throws InternalError when the RNG fails.
std::string make_client_id();

// Mutual authentication: each side proves it holds the token with an
// HMAC-SHA256 over both nonces, bound to its direction so that one side's
// proof is never valid as the other's (a relay cannot reflect it):
//   server: HMAC(token, "ddp-store-auth-v2 server" || client nonce || server nonce)
//   client: HMAC(token, "ddp-store-auth-v2 client" || client nonce || server nonce)
enum class Direction { kServer, kClient };
std::string auth_mac(Direction direction, std::string_view token, std::string_view client_nonce,
                     std::string_view server_nonce);
// Constant-time comparison of `mac` with auth_mac(...).
bool verify_auth(Direction direction, std::string_view token, std::string_view client_nonce,
                 std::string_view server_nonce, std::string_view mac);

// The server side of the handshake (hello, then auth when a token is set), as a
// pure state machine. Feed it the requests of a new connection in order until
// done(); each call appends the reply frame to `out` and returns kOk or the
// error status after which the connection must be closed.
class ServerHandshake {
 public:
  // `nonce` is used only when `token` is non-empty.
  ServerHandshake(std::string_view token, std::string nonce, const Limits& limits);
  Result on_request(const Request& request, std::string& out);
  bool done() const { return phase_ == Phase::kDone; }
  // The client id its hello carried (valid once the hello was accepted).
  const std::string& client_id() const { return client_id_; }

 private:
  enum class Phase { kHello, kAuth, kDone, kFailed };
  Result fail(std::string& out, Status status, std::string message);

  std::string_view token_;
  std::string nonce_;
  std::string client_nonce_;
  std::string client_id_;
  Limits limits_;
  Phase phase_ = Phase::kHello;
};

}  // namespace ddp::protocol
