// libFuzzer target for the control channel's messages
// (ddp/worker_contract/control_channel.h): what a worker sends its agent and the agent
// its workers, each side reading the other's datagrams as untrusted (built by
// scripts/fuzz with clang++-14 -fsanitize=fuzzer,address,undefined; not part of
// the gcc build).
//
// Input: a selector byte, then the rest.
//   selector bit 0 clear: the rest is a datagram, given to decode().
//   selector bit 0 set: the rest builds a message for encode(): a run of
//     fields, each a key byte (its low 4 bits pick one of kKeys, some of them
//     names encode() must refuse), a length byte and that many value bytes
//     (any bytes: newlines, NULs, backslashes, '='); selector bits 1-2 pick
//     the type (one of them not a name).
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
//     ending lines) and decodes to the message encoded.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/worker_contract/control_channel.h"
#include "ddp/common/error.h"

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t selector = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((selector & 1) == 0) {
    fuzz_decode(rest);
  } else {
    fuzz_encode(selector, rest);
  }
  return 0;
}
