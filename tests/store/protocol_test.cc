// The store's codec (ddp/store/protocol.h): round trips of every message,
// and byte-level parsing of bad input, each with its specific error status.
#include "ddp/store/protocol.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ddp::protocol {
namespace {

Request req(Op op) {
  Request q;
  q.op = op;
  return q;
}

std::string frame_of(const Request& q) {
  std::string out;
  encode_request(out, q);
  return out;
}

// Little-endian u32 header followed by `payload`.
std::string raw_frame(std::string_view payload) {
  std::string out;
  auto n = static_cast<std::uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  out.append(payload);
  return out;
}

std::string payload_of(const std::string& frame) { return frame.substr(kHeaderSize); }

// One request of every kind, with binary bytes in keys and values.
std::vector<Request> sample_requests() {
  static const std::string kBinary(
      "v\0a\xff"
      "lue",
      8);
  std::vector<Request> all;
  Request q;
  q.op = Op::kHello;
  static const std::string kClientNonce(kNonceSize, '\x11');
  static const std::string kClientId(kClientIdSize, '\x22');
  q.nonce = kClientNonce;
  q.client_id = kClientId;
  all.push_back(q);
  q = {};
  q.op = Op::kAuth;
  static const std::string kMac(kMacSize, '\x5a');
  q.mac = kMac;
  all.push_back(q);
  q = {};
  q.op = Op::kSet;
  q.key = "key/1";
  q.value = kBinary;
  all.push_back(q);
  q = {};
  q.op = Op::kGet;
  q.key = "k";
  q.timeout_ms = 1234;
  all.push_back(q);
  q = {};
  q.op = Op::kGet;
  q.key = "";
  q.timeout_ms = kNoTimeout;
  all.push_back(q);
  q = {};
  q.op = Op::kAdd;
  q.key = "counter";
  q.delta = -42;
  q.request_id = 7;
  all.push_back(q);
  q = {};
  q.op = Op::kCompareSet;
  q.key = "cas";
  q.value = "";
  q.desired = kBinary;
  all.push_back(q);
  q = {};
  q.op = Op::kWait;
  q.keys = {"a", "b", ""};
  q.timeout_ms = 5;
  all.push_back(q);
  q = {};
  q.op = Op::kCheck;
  q.keys = {"x"};
  all.push_back(q);
  q = {};
  q.op = Op::kCheck;  // no keys at all
  all.push_back(q);
  q = {};
  q.op = Op::kDeleteKey;
  q.key = "gone";
  all.push_back(q);
  q = {};
  q.op = Op::kNumKeys;
  all.push_back(q);
  q = {};
  q.op = Op::kMultiGet;
  q.keys = {"m1", "m2"};
  q.timeout_ms = 0;
  all.push_back(q);
  q = {};
  q.op = Op::kMultiSet;
  q.keys = {"s1", "s2"};
  q.values = {"one", kBinary};
  all.push_back(q);
  q = {};
  q.op = Op::kAppend;
  q.key = "log";
  q.value = "line\n";
  all.push_back(q);
  return all;
}

void expect_same(const Request& a, const Request& b) {
  EXPECT_EQ(a.op, b.op);
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.value, b.value);
  EXPECT_EQ(a.desired, b.desired);
  EXPECT_EQ(a.delta, b.delta);
  EXPECT_EQ(a.timeout_ms, b.timeout_ms);
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.mac, b.mac);
  EXPECT_EQ(a.nonce, b.nonce);
  EXPECT_EQ(a.client_id, b.client_id);
  EXPECT_EQ(a.request_id, b.request_id);
}

TEST(Protocol, EveryRequestRoundTrips) {
  for (const auto& q : sample_requests()) {
    SCOPED_TRACE(std::string(to_string(q.op)));
    auto bytes = frame_of(q);
    std::string_view input = bytes;
    FrameParser parser(Limits{}.max_frame_size);
    ASSERT_EQ(parser.consume(input), FrameParser::State::kGood);
    EXPECT_TRUE(input.empty());
    Request decoded;
    auto result = decode_request(parser.payload(), Limits{}, decoded);
    ASSERT_TRUE(result.ok()) << result.message;
    expect_same(q, decoded);
  }
}

TEST(Protocol, FramesOfTheSameStreamParseOneAfterAnother) {
  std::string stream;
  auto all = sample_requests();
  for (const auto& q : all) encode_request(stream, q);
  std::string_view input = stream;
  FrameParser parser(Limits{}.max_frame_size);
  for (const auto& q : all) {
    ASSERT_EQ(parser.consume(input), FrameParser::State::kGood);
    Request decoded;
    ASSERT_TRUE(decode_request(parser.payload(), Limits{}, decoded).ok());
    EXPECT_EQ(decoded.op, q.op);
  }
  EXPECT_TRUE(input.empty());
  EXPECT_TRUE(parser.idle());
}

TEST(Protocol, ALargeRequestNamingTooManyKeysIsRefusedByItsHeadAtEveryCut) {
  // A wait of 20,000 empty keys (80 KiB): refused from its first bytes, never
  // assembled, wherever the reads cut it; a small one is left to the decoder.
  auto wait_frame = [](std::uint32_t count) {
    std::string payload(1, static_cast<char>(Op::kWait));
    payload.append(8, '\0');  // timeout 0
    for (int i = 0; i < 4; ++i) payload.push_back(static_cast<char>((count >> (8 * i)) & 0xff));
    payload.append(std::size_t{count} * 4, '\0');
    std::string frame;
    const auto length = static_cast<std::uint32_t>(payload.size());
    for (int i = 0; i < 4; ++i) frame.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
    return frame + payload;
  };
  const std::string stream = wait_frame(20000);
  for (std::size_t cut : {std::size_t{1}, std::size_t{6}, std::size_t{9}, std::size_t{16},
                          std::size_t{17}, std::size_t{4096}}) {
    FrameParser parser(1u << 30);
    parser.check_request_heads(true);
    std::string_view first = std::string_view(stream).substr(0, cut);
    std::string_view rest = std::string_view(stream).substr(cut);
    auto state = parser.consume(first);
    if (state == FrameParser::State::kNeedMore) state = parser.consume(rest);
    ASSERT_EQ(state, FrameParser::State::kBad) << "cut " << cut;
    EXPECT_EQ(parser.error().status, Status::kInvalidArgument) << "cut " << cut;
    EXPECT_NE(parser.error().message.find("20000 keys"), std::string::npos)
        << parser.error().message;
    EXPECT_LE(parser.buffered(), kRequestHeadSize) << "the refused frame was assembled";
  }
  // 5,000 keys (20 KiB) is under the head check's size: the decoder refuses it.
  const std::string small = wait_frame(5000);
  FrameParser parser(1u << 30);
  parser.check_request_heads(true);
  std::string_view input = small;
  ASSERT_EQ(parser.consume(input), FrameParser::State::kGood);
  Request request;
  EXPECT_EQ(decode_request(parser.payload(), Limits{}, request).status, Status::kInvalidArgument);
}

TEST(Protocol, TruncatedFrameNeedsMoreAtEveryCutPoint) {
  for (const auto& q : sample_requests()) {
    SCOPED_TRACE(std::string(to_string(q.op)));
    auto bytes = frame_of(q);
    for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
      FrameParser parser(Limits{}.max_frame_size);
      std::string_view first(bytes.data(), cut);
      ASSERT_EQ(parser.consume(first), FrameParser::State::kNeedMore) << "cut at " << cut;
      EXPECT_TRUE(first.empty()) << "a need-more consumes everything";
      EXPECT_EQ(parser.idle(), cut == 0);
      std::string_view rest(bytes.data() + cut, bytes.size() - cut);
      ASSERT_EQ(parser.consume(rest), FrameParser::State::kGood) << "cut at " << cut;
      EXPECT_EQ(parser.payload(), payload_of(bytes));
    }
  }
}

TEST(Protocol, ByteByByteFeedingAssemblesTheFrame) {
  Request q;
  q.op = Op::kMultiSet;
  q.keys = {"alpha", "beta"};
  q.values = {"1", "22"};
  auto bytes = frame_of(q);
  FrameParser parser(1024);
  for (std::size_t i = 0; i + 1 < bytes.size(); ++i) {
    std::string_view one(bytes.data() + i, 1);
    ASSERT_EQ(parser.consume(one), FrameParser::State::kNeedMore) << "byte " << i;
  }
  std::string_view last(bytes.data() + bytes.size() - 1, 1);
  ASSERT_EQ(parser.consume(last), FrameParser::State::kGood);
  Request decoded;
  ASSERT_TRUE(decode_request(parser.payload(), Limits{}, decoded).ok());
  expect_same(q, decoded);
}

TEST(Protocol, TruncatedPayloadIsMalformedAtEveryCutPoint) {
  for (const auto& q : sample_requests()) {
    SCOPED_TRACE(std::string(to_string(q.op)));
    auto payload = payload_of(frame_of(q));
    for (std::size_t cut = 0; cut < payload.size(); ++cut) {
      Request decoded;
      auto result = decode_request(std::string_view(payload.data(), cut), Limits{}, decoded);
      EXPECT_EQ(result.status, Status::kMalformed) << "cut at " << cut << ": " << result.message;
    }
  }
}

TEST(Protocol, TrailingBytesAreMalformed) {
  Request q;
  q.op = Op::kSet;
  q.key = "k";
  q.value = "v";
  auto payload = payload_of(frame_of(q)) + "x";
  Request decoded;
  auto result = decode_request(payload, Limits{}, decoded);
  EXPECT_EQ(result.status, Status::kMalformed);
  EXPECT_NE(result.message.find("trailing"), std::string::npos) << result.message;
}

TEST(Protocol, FourGiBLengthPrefixIsFrameTooLarge) {
  const std::string bytes("\xff\xff\xff\xff\x10", 5);
  std::string_view input = bytes;
  FrameParser parser(Limits{}.max_frame_size);
  ASSERT_EQ(parser.consume(input), FrameParser::State::kBad);
  EXPECT_EQ(parser.error().status, Status::kFrameTooLarge);
  EXPECT_NE(parser.error().message.find("4294967295"), std::string::npos) << parser.error().message;
  // The parser stays bad: the stream cannot be resynchronised.
  std::string_view more = "\x01\x00\x00\x00\x17";
  EXPECT_EQ(parser.consume(more), FrameParser::State::kBad);
}

TEST(Protocol, FrameLimitIsInclusive) {
  FrameParser at_limit(8);
  auto ok =
      raw_frame(std::string("\x17"
                            "1234567",
                            8));
  std::string_view input = ok;
  EXPECT_EQ(at_limit.consume(input), FrameParser::State::kGood);

  FrameParser over(7);
  input = ok;
  EXPECT_EQ(over.consume(input), FrameParser::State::kBad);
  EXPECT_EQ(over.error().status, Status::kFrameTooLarge);
}

TEST(Protocol, EmptyFrameIsMalformed) {
  const std::string bytes(4, '\0');
  std::string_view input = bytes;
  FrameParser parser(1024);
  ASSERT_EQ(parser.consume(input), FrameParser::State::kBad);
  EXPECT_EQ(parser.error().status, Status::kMalformed);
}

TEST(Protocol, UnknownOperationIsItsOwnError) {
  for (std::uint8_t code : {0x00, 0x03, 0x0F, 0x1B, 0x7F, 0xFF}) {
    Request decoded;
    auto result = decode_request(std::string(1, static_cast<char>(code)), Limits{}, decoded);
    EXPECT_EQ(result.status, Status::kUnknownOp) << int(code);
    EXPECT_FALSE(is_known_op(code));
  }
}

TEST(Protocol, WrongVersionAndWrongMagicAreTheirOwnErrors) {
  Request hello;
  hello.op = Op::kHello;
  hello.version = kVersion + 1;
  Request decoded;
  auto result = decode_request(payload_of(frame_of(hello)), Limits{}, decoded);
  EXPECT_EQ(result.status, Status::kBadVersion);
  EXPECT_NE(result.message.find(std::to_string(kVersion + 1)), std::string::npos);

  auto payload = payload_of(frame_of(req(Op::kHello)));
  payload[1] = 'X';  // "XDPS"
  result = decode_request(payload, Limits{}, decoded);
  EXPECT_EQ(result.status, Status::kBadMagic);
}

TEST(Protocol, KeyAndValueLimitsAreEnforced) {
  Limits limits;
  limits.max_key_size = 4;
  limits.max_value_size = 8;
  Request q;
  q.op = Op::kSet;
  q.key = "12345";
  q.value = "v";
  Request decoded;
  EXPECT_EQ(decode_request(payload_of(frame_of(q)), limits, decoded).status, Status::kKeyTooLarge);
  q.key = "1234";
  EXPECT_TRUE(decode_request(payload_of(frame_of(q)), limits, decoded).ok());
  q.value = "123456789";
  EXPECT_EQ(decode_request(payload_of(frame_of(q)), limits, decoded).status,
            Status::kValueTooLarge);
  Request w;
  w.op = Op::kWait;
  w.keys = {"ok", "waytoolong"};
  EXPECT_EQ(decode_request(payload_of(frame_of(w)), limits, decoded).status, Status::kKeyTooLarge);
}

TEST(Protocol, LyingCountIsMalformedWithoutReservingMemory) {
  // A check with 0xFFFFFFFF keys in a 5-byte payload.
  const std::string payload("\x15\xff\xff\xff\xff", 5);
  Request decoded;
  auto result = decode_request(payload, Limits{}, decoded);
  EXPECT_EQ(result.status, Status::kMalformed);
  EXPECT_EQ(decoded.keys.capacity(), 0u);
  // A key announced longer than the bytes that follow.
  const std::string key_payload(
      "\x16\x10\x00\x00\x00"
      "abc",
      8);
  EXPECT_EQ(decode_request(key_payload, Limits{}, decoded).status, Status::kMalformed);
}

// ---- replies -----------------------------------------------------------------------

TEST(Protocol, EveryReplyRoundTrips) {
  static const std::string kNonce(kNonceSize, '\x11');
  struct Case {
    Op op;
    Reply reply;
  };
  std::vector<Case> cases;
  Reply r;
  r.version = kVersion;
  r.limits = Limits{10, 20, 30};
  r.nonce = kNonce;
  static const std::string kServerMac(kMacSize, '\x33');
  r.server_mac = kServerMac;
  cases.push_back({Op::kHello, r});
  r = {};
  r.limits = Limits{1, 2, 3};
  cases.push_back({Op::kHello, r});  // no auth
  for (Op op : {Op::kAuth, Op::kSet, Op::kWait, Op::kMultiSet, Op::kAppend}) {
    cases.push_back({op, Reply{}});
  }
  r = {};
  r.value = std::string_view("\0bin", 4);
  cases.push_back({Op::kGet, r});
  cases.push_back({Op::kCompareSet, r});
  r = {};
  r.integer = -7;
  cases.push_back({Op::kAdd, r});
  r.integer = 1LL << 40;
  cases.push_back({Op::kNumKeys, r});
  r = {};
  r.flag = true;
  cases.push_back({Op::kCheck, r});
  r.flag = false;
  cases.push_back({Op::kDeleteKey, r});
  r = {};
  r.values = {"a", "", "ccc"};
  cases.push_back({Op::kMultiGet, r});
  r = {};
  r.status = Status::kTimeout;
  r.message = "timed out";
  cases.push_back({Op::kGet, r});
  r.status = Status::kShutdown;
  r.message = "bye";
  cases.push_back({Op::kWait, r});

  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(to_string(c.op)));
    std::string bytes;
    encode_reply(bytes, c.op, c.reply);
    std::string_view input = bytes;
    FrameParser parser(1 << 20);
    ASSERT_EQ(parser.consume(input), FrameParser::State::kGood);
    Reply decoded;
    auto result = decode_reply(c.op, parser.payload(), decoded);
    ASSERT_TRUE(result.ok()) << result.message;
    EXPECT_EQ(decoded.status, c.reply.status);
    EXPECT_EQ(decoded.message, c.reply.message);
    if (c.reply.status != Status::kOk) continue;
    EXPECT_EQ(decoded.value, c.reply.value);
    EXPECT_EQ(decoded.integer, c.reply.integer);
    EXPECT_EQ(decoded.flag, c.reply.flag);
    EXPECT_EQ(decoded.values, c.reply.values);
    if (c.op == Op::kHello) {
      EXPECT_EQ(decoded.version, c.reply.version);
      EXPECT_EQ(decoded.nonce, c.reply.nonce);
      EXPECT_EQ(decoded.server_mac, c.reply.server_mac);
      EXPECT_EQ(decoded.limits.max_key_size, c.reply.limits.max_key_size);
      EXPECT_EQ(decoded.limits.max_value_size, c.reply.limits.max_value_size);
      EXPECT_EQ(decoded.limits.max_frame_size, c.reply.limits.max_frame_size);
    }
  }
}

TEST(Protocol, BadRepliesAreMalformed) {
  Reply decoded;
  EXPECT_EQ(decode_reply(Op::kSet, "", decoded).status, Status::kMalformed);
  EXPECT_EQ(decode_reply(Op::kSet, std::string(1, '\xc8'), decoded).status, Status::kMalformed);
  EXPECT_EQ(decode_reply(Op::kCheck, std::string("\x00\x02", 2), decoded).status,
            Status::kMalformed);
  EXPECT_EQ(decode_reply(Op::kAdd, std::string("\x00\x01\x02", 3), decoded).status,
            Status::kMalformed);
}

TEST(Protocol, StatusesMapToErrorKinds) {
  EXPECT_EQ(error_kind(Status::kTimeout), ErrorKind::kTimeout);
  EXPECT_EQ(error_kind(Status::kShutdown), ErrorKind::kShutdown);
  EXPECT_EQ(error_kind(Status::kAuthFailed), ErrorKind::kAuth);
  EXPECT_EQ(error_kind(Status::kAuthRequired), ErrorKind::kAuth);
  EXPECT_EQ(error_kind(Status::kBadVersion), ErrorKind::kProtocol);
  EXPECT_EQ(error_kind(Status::kUnknownOp), ErrorKind::kProtocol);
  EXPECT_EQ(error_kind(Status::kFrameTooLarge), ErrorKind::kProtocol);
  EXPECT_EQ(error_kind(Status::kInvalidArgument), ErrorKind::kInvalidArgument);
  EXPECT_EQ(error_kind(Status::kTooManyClients), ErrorKind::kNetwork);
  EXPECT_FALSE(closes_connection(Status::kTimeout));
  EXPECT_FALSE(closes_connection(Status::kInvalidArgument));
  EXPECT_TRUE(closes_connection(Status::kMalformed));
  EXPECT_TRUE(closes_connection(Status::kShutdown));
}

// ---- authentication and handshake ----------------------------------------------------------

TEST(Protocol, MacDependsOnTokenNoncesAndDirection) {
  auto n1 = make_nonce();
  auto n2 = make_nonce();
  ASSERT_EQ(n1.size(), kNonceSize);
  EXPECT_NE(n1, n2);
  auto mac = auth_mac(Direction::kClient, "secret", n1, n2);
  EXPECT_EQ(mac.size(), kMacSize);
  EXPECT_TRUE(verify_auth(Direction::kClient, "secret", n1, n2, mac));
  EXPECT_FALSE(verify_auth(Direction::kClient, "secret", n2, n1, mac));
  EXPECT_FALSE(verify_auth(Direction::kClient, "Secret", n1, n2, mac));
  EXPECT_FALSE(verify_auth(Direction::kClient, "secret", n1, n2, mac.substr(1)));
  // A proof for one direction is never valid for the other: a relay cannot
  // reflect the server's proof back as a client's (or the reverse).
  EXPECT_FALSE(verify_auth(Direction::kServer, "secret", n1, n2, mac));
  EXPECT_NE(auth_mac(Direction::kServer, "secret", n1, n2), mac);
}

TEST(Protocol, RequestIdsTravelWithNonIdempotentOperations) {
  for (Op op : {Op::kAdd, Op::kCompareSet, Op::kAppend, Op::kDeleteKey}) {
    EXPECT_TRUE(carries_request_id(op)) << to_string(op);
    Request q = req(op);
    q.key = "k";
    q.request_id = 0x0102030405060708ull;
    Request decoded;
    ASSERT_TRUE(decode_request(payload_of(frame_of(q)), Limits{}, decoded).ok()) << to_string(op);
    EXPECT_EQ(decoded.request_id, q.request_id) << to_string(op);
  }
  for (Op op : {Op::kSet, Op::kGet, Op::kWait, Op::kCheck, Op::kMultiSet, Op::kMultiGet}) {
    EXPECT_FALSE(carries_request_id(op)) << to_string(op);
  }
}

TEST(Protocol, VersionOneHelloIsUnsupportedVersionNotMalformed) {
  // A version 1 client's hello: magic and version, nothing after.
  std::string payload(
      "\x01"
      "DDPS\x01\x00",
      7);
  Request decoded;
  auto result = decode_request(payload, Limits{}, decoded);
  EXPECT_EQ(result.status, Status::kBadVersion) << result.message;
  EXPECT_NE(result.message.find("version 1"), std::string::npos) << result.message;
}

TEST(Protocol, NewStatusesKeepTheConnection) {
  for (Status status : {Status::kReplyTooLarge, Status::kStoreFull, Status::kStaleRequest}) {
    EXPECT_FALSE(closes_connection(status)) << to_string(status);
    EXPECT_EQ(error_kind(status), ErrorKind::kInvalidArgument);
    std::string out;
    encode_error(out, status, "why");
    Reply reply;
    std::string_view input = out;
    FrameParser parser(1 << 20);
    ASSERT_EQ(parser.consume(input), FrameParser::State::kGood);
    ASSERT_TRUE(decode_reply(Op::kAdd, parser.payload(), reply).ok());
    EXPECT_EQ(reply.status, status);
  }
}

Reply decode_single(const std::string& bytes, Op op) {
  std::string_view input = bytes;
  FrameParser parser(1 << 20);
  EXPECT_EQ(parser.consume(input), FrameParser::State::kGood);
  Reply reply;
  EXPECT_TRUE(decode_reply(op, parser.payload(), reply).ok());
  return reply;
}

TEST(Protocol, HandshakeWithoutTokenIsHelloOnly) {
  ServerHandshake handshake("", make_nonce(), Limits{});
  std::string out;
  ASSERT_TRUE(handshake.on_request(req(Op::kHello), out).ok());
  EXPECT_TRUE(handshake.done());
  auto reply = decode_single(out, Op::kHello);
  EXPECT_EQ(reply.status, Status::kOk);
  EXPECT_TRUE(reply.nonce.empty()) << "no auth step without a token";
}

Request hello_with(const std::string& client_nonce) {
  Request hello = req(Op::kHello);
  hello.nonce = client_nonce;
  return hello;
}

TEST(Protocol, HandshakeWithRightTokenIsMutual) {
  auto nonce = make_nonce();
  auto client_nonce = make_nonce();
  ServerHandshake handshake("secret", nonce, Limits{});
  std::string out;
  ASSERT_TRUE(handshake.on_request(hello_with(client_nonce), out).ok());
  EXPECT_FALSE(handshake.done());
  auto hello = decode_single(out, Op::kHello);
  ASSERT_EQ(hello.nonce, nonce);
  // The server proves the token first, over the client's fresh nonce.
  EXPECT_TRUE(verify_auth(Direction::kServer, "secret", client_nonce, nonce, hello.server_mac));
  EXPECT_FALSE(verify_auth(Direction::kServer, "other", client_nonce, nonce, hello.server_mac));
  Request auth = req(Op::kAuth);
  auto mac = auth_mac(Direction::kClient, "secret", client_nonce, hello.nonce);
  auth.mac = mac;
  out.clear();
  ASSERT_TRUE(handshake.on_request(auth, out).ok());
  EXPECT_TRUE(handshake.done());
  EXPECT_EQ(decode_single(out, Op::kAuth).status, Status::kOk);
}

TEST(Protocol, ReflectedServerProofIsAuthFailed) {
  auto nonce = make_nonce();
  auto client_nonce = make_nonce();
  ServerHandshake handshake("secret", nonce, Limits{});
  std::string out;
  ASSERT_TRUE(handshake.on_request(hello_with(client_nonce), out).ok());
  auto hello = decode_single(out, Op::kHello);
  Request auth = req(Op::kAuth);
  const std::string reflected(hello.server_mac);
  auth.mac = reflected;
  out.clear();
  EXPECT_EQ(handshake.on_request(auth, out).status, Status::kAuthFailed);
}

TEST(Protocol, HandshakeWithWrongTokenIsAuthFailed) {
  auto nonce = make_nonce();
  auto client_nonce = make_nonce();
  ServerHandshake handshake("secret", nonce, Limits{});
  std::string out;
  ASSERT_TRUE(handshake.on_request(hello_with(client_nonce), out).ok());
  Request auth = req(Op::kAuth);
  auto mac = auth_mac(Direction::kClient, "wrong", client_nonce, nonce);
  auth.mac = mac;
  out.clear();
  auto result = handshake.on_request(auth, out);
  EXPECT_EQ(result.status, Status::kAuthFailed);
  EXPECT_FALSE(handshake.done());
  EXPECT_EQ(decode_single(out, Op::kAuth).status, Status::kAuthFailed);
}

TEST(Protocol, OperationBeforeAuthIsAuthRequired) {
  ServerHandshake handshake("secret", make_nonce(), Limits{});
  std::string out;
  ASSERT_TRUE(handshake.on_request(req(Op::kHello), out).ok());
  out.clear();
  EXPECT_EQ(handshake.on_request(req(Op::kNumKeys), out).status, Status::kAuthRequired);
  EXPECT_EQ(decode_single(out, Op::kNumKeys).status, Status::kAuthRequired);
}

TEST(Protocol, OperationBeforeHelloIsUnexpected) {
  ServerHandshake handshake("", make_nonce(), Limits{});
  std::string out;
  EXPECT_EQ(handshake.on_request(req(Op::kNumKeys), out).status, Status::kUnexpected);
  EXPECT_FALSE(handshake.done());
}

}  // namespace
}  // namespace ddp::protocol
