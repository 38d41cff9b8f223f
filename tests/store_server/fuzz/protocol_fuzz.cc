// libFuzzer target for the store's codec and handler (built by scripts/fuzz with
// clang++-14 -fsanitize=fuzzer,address,undefined; not part of the gcc build).
//
// Input: one mode byte, then a byte stream as a server would receive it.
//   mode bits 0-2: how the stream is cut into reads (1, 2, 3, 5, 8, 13, 64 bytes or all)
//   mode bit 3:    the server requires a token (so the handshake needs auth)
//   mode bit 4:    tiny limits (16-byte keys, 32-byte values, 256-byte frames)
// The stream is fed through FrameParser, the handshake and the StoreHandler the
// way a session does. Invariants checked (abort on violation): every request
// that decodes re-encodes to the same payload; every reply the server produces
// parses as a reply; a need-more consumes its whole input.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ddp/store/protocol.h"
#include "store_handler.h"

namespace {

using namespace ddp;
using protocol::FrameParser;

void check(bool condition) {
  if (!condition) std::abort();
}

struct Waiter final : StoreHandler::Waiter {
  protocol::Op op = protocol::Op::kGet;
  std::string replies;
  void on_wake(std::string_view reply) override { replies.append(reply); }
};

// Every frame in `bytes` must be a well-formed reply to `op`.
void check_replies(std::string_view bytes, protocol::Op op) {
  FrameParser parser(~std::uint32_t{0});
  while (!bytes.empty()) {
    check(parser.consume(bytes) == FrameParser::State::kGood);
    protocol::Reply reply;
    check(protocol::decode_reply(op, parser.payload(), reply).ok());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static constexpr std::size_t kChunks[] = {1, 2, 3, 5, 8, 13, 64, ~std::size_t{0}};
  const std::uint8_t mode = data[0];
  const std::size_t chunk = kChunks[mode & 7];
  const std::string token = (mode & 8) ? "fuzz-token" : "";
  protocol::Limits limits;
  if (mode & 16) limits = protocol::Limits{16, 32, 256};

  std::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string nonce(protocol::kNonceSize, '\x42');  // deterministic for the fuzzer
  protocol::ServerHandshake handshake(token, nonce, limits);
  StoreHandler handler;
  // Several sessions' worth of parked requests, so writes wake some of them.
  Waiter waiters[4];
  std::size_t turn = 0;
  FrameParser parser(protocol::kMaxHandshakeFrame);
  protocol::Request request;
  std::string out;
  std::string reencoded;
  bool open = true;

  while (open && !stream.empty()) {
    std::string_view piece = stream.substr(0, std::min(chunk, stream.size()));
    stream.remove_prefix(piece.size());
    while (open) {
      auto state = parser.consume(piece);
      if (state == FrameParser::State::kNeedMore) {
        check(piece.empty());
        break;
      }
      if (state == FrameParser::State::kBad) {
        check(!parser.error().ok());
        open = false;
        break;
      }
      auto payload = parser.payload();
      auto result = protocol::decode_request(payload, limits, request);
      if (!result.ok()) {
        check(!result.message.empty());
        open = false;
        break;
      }
      // Round trip: the canonical encoding of what was decoded is the payload.
      reencoded.clear();
      protocol::encode_request(reencoded, request);
      check(reencoded.substr(protocol::kHeaderSize) == payload);

      out.clear();
      if (!handshake.done()) {
        auto r = handshake.on_request(request, out);
        check_replies(out, request.op);
        if (!r.ok()) {
          open = false;
          break;
        }
        if (handshake.done()) parser.set_max_frame_size(limits.max_frame_size);
        continue;
      }
      if (request.op == protocol::Op::kHello || request.op == protocol::Op::kAuth) {
        open = false;
        break;
      }
      Waiter* waiter = nullptr;
      for (auto& w : waiters) {
        if (!handler.is_parked(&w)) waiter = &w;
      }
      if (waiter == nullptr) {
        // Every waiter is parked: alternately time one out or cancel it.
        waiter = &waiters[turn++ % 4];
        std::string expired;
        if (turn % 2 == 0) {
          check(handler.expire(waiter, expired));
          check_replies(expired, waiter->op);
        } else {
          handler.cancel(waiter);
        }
        check(!handler.is_parked(waiter));
      }
      waiter->op = request.op;
      if (handler.handle(request, out, waiter)) {
        check_replies(out, request.op);
        check(!handler.is_parked(waiter));
      } else {
        check(handler.is_parked(waiter));
      }
      for (auto& w : waiters) {
        if (w.replies.empty()) continue;
        check(!handler.is_parked(&w));
        check_replies(w.replies, w.op);
        w.replies.clear();
      }
    }
  }
  handler.shutdown("fuzz shutdown");
  for (auto& w : waiters) {
    check(!handler.is_parked(&w));
    check_replies(w.replies, w.op);
  }
  check(handler.num_parked() == 0);
  return 0;
}
