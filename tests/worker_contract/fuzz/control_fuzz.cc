// libFuzzer target for the control channel's messages
// (ddp/worker_contract/control_channel.h, and the typed messages of
// ddp/worker_contract/worker_contract.h): what a worker sends its agent and the
// agent its workers, each side reading the other's datagrams as untrusted
// (built by scripts/fuzz with clang++-14 -fsanitize=fuzzer,address,undefined;
// not part of the gcc build).
//
// Input: a selector byte, then the rest.
//   selector bit 0 clear: the rest is a datagram, given to decode() and then
//     to every typed decode (decode_round, _hello, _abort, _reformed, _synced).
//   selector bit 0 set, bit 3 clear: the rest builds a message for encode(): a
//     run of fields, each a key byte (its low 4 bits pick one of kKeys, some
//     of them names encode() must refuse), a length byte and that many value
//     bytes (any bytes: newlines, NULs, backslashes, '='); selector bits 1-2
//     pick the type (one of them not a name).
//   selector bits 0 and 3 set: the rest fills a WorkerRound (its numbers from
//     4 bytes each, any value, its texts from a length byte and bytes) and an
//     Abort, given to their encode().
//
// Invariants checked (abort):
//   - decode() and the Message accessors throw nothing; encode() throws only
//     InvalidArgument, and exactly when the message breaks a documented rule
//     (a type or key outside [a-z_] of 1 to 32 characters, a field named
//     "type", more than kMaxFields fields, more than kMaxMessageBytes
//     encoded), never for what a value holds;
//   - what decode() accepts is within the bounds (at most kMaxFields fields,
//     names valid) and round-trips: encode() accepts it, writes as many bytes
//     as were read, and decode() reads that back to an equal message;
//   - what encode() writes is one line per field (no raw NUL, newlines only
//     ending lines) and decodes to the message encoded;
//   - the typed decodes throw nothing, only the one of the message's type
//     reads it, what it reads is within the documented ranges, and its encode
//     goes over the wire and reads back to what was read;
//   - a WorkerRound or Abort the agent could hold reads back equal, whenever
//     its values are within those ranges (an Abort's reason cut to its bound),
//     and is refused otherwise.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/common/error.h"
#include "ddp/worker_contract/control_channel.h"
#include "ddp/worker_contract/worker_contract.h"

namespace {

using namespace ddp;
using namespace ddp::control;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "control_fuzz: invariant violated: %s\n", what);
  std::abort();
}

void check(bool ok, const char* what) {
  if (!ok) die(what);
}

bool is_name(std::string_view name) {
  if (name.empty() || name.size() > 32) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || c == '_')) return false;
  }
  return true;
}

// What encode() writes for a value: its bytes, one more for each escaped one.
std::size_t escaped_size(std::string_view value) {
  std::size_t n = value.size();
  for (char c : value) n += (c == '\\' || c == '\n' || c == '\0') ? 1 : 0;
  return n;
}

// Reads every field through every accessor (none may throw or misbehave).
void touch(const Message& m) {
  for (const auto& [key, value] : m.fields) {
    check(m.text(key) == value, "text() is not the field's value");
    (void)m.integer(key);
    if (auto number = m.number(key)) check(*number == *number, "number() gave a NaN");
  }
  check(m.text("no_such_field").empty(), "text() of a missing field is not empty");
}

// Whether the round's values are within the ranges decode_round() documents.
bool in_range(const contract::WorkerRound& r) {
  constexpr int kMaxSize = 1 << 20;
  constexpr int kMaxCount = 1 << 30;
  return r.round >= 0 && r.round <= kMaxCount && r.world_size >= 1 && r.world_size <= kMaxSize &&
         r.rank >= 0 && r.rank < r.world_size && r.local_world_size >= 1 &&
         r.local_world_size <= kMaxSize && r.local_rank >= 0 && r.local_rank < r.local_world_size &&
         r.group_world_size >= 1 && r.group_world_size <= kMaxSize && r.group_rank >= 0 &&
         r.group_rank < r.group_world_size && r.restart_count >= 0 &&
         r.restart_count <= kMaxCount && r.master_port >= 0 && r.master_port <= 65535 &&
         r.store_port >= 1 && r.store_port <= 65535 && !r.store_addr.empty() &&
         r.change_grace.count() >= 0;
}

// The typed message `read` from `m` goes over the wire and reads back to itself.
template <class T, class Decode>
void check_typed(const std::optional<T>& read, Decode decode_typed) {
  if (!read) return;
  std::optional<Message> again;
  try {
    again = decode(encode(contract::encode(*read)));
  } catch (...) {
    die("the wire refused a typed message's encode()");
  }
  check(again.has_value(), "the wire did not read back a typed message's encode()");
  auto back = decode_typed(*again);
  check(back.has_value(), "a typed decode refused what its encode() wrote");
  check(*back == *read, "a typed message does not read back to itself");
}

// Every typed decode of a message the wire read.
void fuzz_typed(const Message& m) {
  std::optional<contract::WorkerRound> round;
  std::optional<contract::Hello> hello;
  std::optional<contract::Abort> abort;
  std::optional<contract::Reformed> reformed;
  std::optional<contract::Synced> synced;
  try {
    round = contract::decode_round(m);
    hello = contract::decode_hello(m);
    abort = contract::decode_abort(m);
    reformed = contract::decode_reformed(m);
    synced = contract::decode_synced(m);
  } catch (...) {
    die("a typed decode threw");
  }
  check(!round || m.type == "round", "decode_round read another type");
  check(!hello || m.type == "hello", "decode_hello read another type");
  check(!abort || m.type == "abort", "decode_abort read another type");
  check(!reformed || m.type == "reformed", "decode_reformed read another type");
  check(!synced || m.type == "synced", "decode_synced read another type");
  check(!round || in_range(*round), "decode_round read a round out of its ranges");
  check(!hello || hello->pid >= 0, "decode_hello read a negative pid");
  check(!abort || (abort->round >= 0 && abort->why.size() <= contract::kMaxWhyBytes),
        "decode_abort read a negative round or an over-long reason");
  check(!reformed || (reformed->round >= 0 && reformed->rank >= 0 && reformed->wait_seconds >= 0 &&
                      reformed->build_seconds >= 0),
        "decode_reformed read a value out of its range");
  check(!synced || (synced->round >= -1 && synced->root >= 0 && synced->bytes >= 0 &&
                    synced->seconds >= 0),
        "decode_synced read a value out of its range");
  check_typed(round, contract::decode_round);
  check_typed(hello, contract::decode_hello);
  check_typed(abort, contract::decode_abort);
  check_typed(reformed, contract::decode_reformed);
  check_typed(synced, contract::decode_synced);
}

void fuzz_decode(std::string_view bytes) {
  std::optional<Message> message;
  try {
    message = decode(bytes);
  } catch (...) {
    die("decode() threw");
  }
  if (!message) return;
  check(is_name(message->type), "decoded a type that is not a name");
  check(message->fields.size() <= kMaxFields, "decoded more than kMaxFields fields");
  for (const auto& [key, value] : message->fields) {
    check(is_name(key) && key != "type", "decoded a key that is not a name (or is 'type')");
  }
  touch(*message);
  std::string again;
  try {
    again = encode(*message);
  } catch (...) {
    die("encode() refused a message decode() accepted");
  }
  check(again.size() == bytes.size(), "encode(decode(x)) is not as long as x");
  auto back = decode(again);
  check(back.has_value(), "decode() refused what encode() wrote");
  check(*back == *message, "decode(encode(m)) differs from m");
  fuzz_typed(*message);
}

const char* const kKeys[16] = {
    "why",        "round",    "rank", "store_addr",
    "seconds",    "a",        "z_",   "bytes",
    "world_size", "grace_ms", "root", "Why",
    "type",       "",         "x1",   "abcdefghijklmnopqrstuvwxyzabcdefg"};
const char* const kTypes[4] = {"abort", "round", "hello", "Round"};

void fuzz_encode(std::uint8_t selector, std::string_view rest) {
  Message m(kTypes[(selector >> 1) & 3]);
  while (rest.size() >= 2) {
    const char* key = kKeys[static_cast<std::uint8_t>(rest[0]) & 15];
    std::size_t length = static_cast<std::uint8_t>(rest[1]);
    rest.remove_prefix(2);
    if (length > rest.size()) length = rest.size();
    m.set(key, std::string(rest.substr(0, length)));
    rest.remove_prefix(length);
  }
  // The rules, checked here independently of encode().
  bool valid = is_name(m.type) && m.fields.size() <= kMaxFields;
  std::size_t size = std::string_view("ddp-control 1\n").size() + 5 + m.type.size() + 1;
  for (const auto& [key, value] : m.fields) {
    valid = valid && is_name(key) && key != "type";
    size += key.size() + 1 + escaped_size(value) + 1;
  }
  valid = valid && size <= kMaxMessageBytes;
  std::string bytes;
  try {
    bytes = encode(m);
  } catch (const InvalidArgument&) {
    check(!valid, "encode() refused a message within the rules");
    return;
  } catch (...) {
    die("encode() threw something other than InvalidArgument");
  }
  check(valid, "encode() accepted a message that breaks the rules");
  check(bytes.size() == size, "encode() wrote another size than the escapes make");
  check(bytes.find('\0') == std::string::npos, "encode() wrote a raw NUL");
  std::size_t lines = 0;
  for (char c : bytes) lines += c == '\n' ? 1 : 0;
  check(lines == m.fields.size() + 2, "encode() wrote a newline that does not end a field");
  auto back = decode(bytes);
  check(back.has_value(), "decode() refused what encode() wrote");
  check(*back == m, "decode(encode(m)) differs from m");
  touch(*back);
}

// Takes 4 bytes as an int (fewer at the end: zeros), any value.
int take_int(std::string_view& rest) {
  std::uint32_t value = 0;
  for (int i = 0; i < 4 && !rest.empty(); ++i) {
    value = (value << 8) | static_cast<std::uint8_t>(rest[0]);
    rest.remove_prefix(1);
  }
  return static_cast<int>(value);
}

// Takes a length byte and that many bytes.
std::string take_text(std::string_view& rest) {
  if (rest.empty()) return {};
  std::size_t length = static_cast<std::uint8_t>(rest[0]);
  rest.remove_prefix(1);
  length = std::min(length, rest.size());
  std::string text(rest.substr(0, length));
  rest.remove_prefix(length);
  return text;
}

// Small numbers are likelier in range: a selector bit folds them.
int small(int value, bool fold) { return fold ? value % 9 - 1 : value; }

void fuzz_encode_typed(std::uint8_t selector, std::string_view rest) {
  const bool fold = (selector & 16) != 0;
  contract::WorkerRound r;
  r.round = small(take_int(rest), fold);
  r.rank = small(take_int(rest), fold);
  r.world_size = small(take_int(rest), fold);
  r.local_rank = small(take_int(rest), fold);
  r.local_world_size = small(take_int(rest), fold);
  r.group_rank = small(take_int(rest), fold);
  r.group_world_size = small(take_int(rest), fold);
  r.restart_count = small(take_int(rest), fold);
  r.master_port = small(take_int(rest), fold);
  r.store_port = small(take_int(rest), fold);
  r.change_grace = std::chrono::milliseconds(small(take_int(rest), fold));
  r.master_addr = take_text(rest);
  r.store_addr = take_text(rest);
  r.store_prefix = take_text(rest);
  std::optional<contract::WorkerRound> round;
  try {
    auto wire = decode(encode(contract::encode(r)));
    check(wire.has_value(), "the wire did not read back a WorkerRound's encode()");
    round = contract::decode_round(*wire);
  } catch (...) {
    die("a WorkerRound of short texts did not go over the wire");
  }
  if (in_range(r)) {
    check(round.has_value() && *round == r, "a WorkerRound within its ranges does not read back");
  } else {
    check(!round.has_value(), "decode_round read a WorkerRound out of its ranges");
  }
  const contract::Abort abort{small(take_int(rest), fold), std::string(rest)};
  std::optional<contract::Abort> read;
  try {
    auto wire = decode(encode(contract::encode(abort)));
    check(wire.has_value(), "the wire did not read back an Abort's encode()");
    read = contract::decode_abort(*wire);
  } catch (...) {
    die("an Abort did not go over the wire");
  }
  if (abort.round >= 0 && abort.round <= (1 << 30)) {
    check(read.has_value() && read->round == abort.round &&
              read->why == abort.why.substr(0, contract::kMaxWhyBytes),
          "an Abort within its ranges does not read back, its reason cut");
  } else {
    check(!read.has_value(), "decode_abort read a negative round");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t selector = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((selector & 1) == 0) {
    fuzz_decode(rest);
  } else if ((selector & 8) == 0) {
    fuzz_encode(selector, rest);
  } else {
    fuzz_encode_typed(selector, rest);
  }
  return 0;
}
