// The control channel between an agent and one of its workers: a
// SOCK_SEQPACKET socket pair made by the agent, one end kept, the other
// inherited by the worker (named by DDP_CONTROL_FD). It carries what the
// progress page cannot: the agent telling a worker that recovers in place
// that its round ended and which round comes next (ddp/worker/recovery.h),
// and the worker's reports of its re-form.
//
// One message per datagram, at most kMaxMessageBytes, as text:
//
//   ddp-control 1
//   type=round
//   rank=3
//   world_size=4
//
// A value may hold any bytes: a backslash, a newline and a NUL are written
// as \\, \n and \0 (and only those escapes are read back), so that every
// value round-trips and one line is one field.
//
// The messages, their fields and what they mean are in worker_contract.h:
// each is a struct there with one encode and one decode. This header is the
// wire underneath: any type, any fields.
//
// Both sides treat what they read as untrusted: decode() refuses anything
// malformed. Blocking: send() never (a peer that does not read fills the
// socket's buffer, and send() then says so: kFull); receive() only when asked
// to wait. Thread-safety: none of its own (one reader and one writer per
// descriptor at a time). Never raises SIGPIPE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace ddp::control {

inline constexpr std::size_t kMaxMessageBytes = 4096;
inline constexpr std::size_t kMaxFields = 64;

struct Message {
  std::string type;
  std::map<std::string, std::string> fields;

  Message() = default;
  explicit Message(std::string type) : type(std::move(type)) {}

  Message& set(const std::string& key, std::string value);
  Message& set(const std::string& key, const char* value) { return set(key, std::string(value)); }
  Message& set(const std::string& key, std::int64_t value);
  Message& set(const std::string& key, int value) { return set(key, std::int64_t{value}); }
  Message& set(const std::string& key, double value);

  // The field's text, or "" when missing.
  std::string text(const std::string& key) const;
  // The field as a whole decimal integer / a finite number, or nullopt when it
  // is missing or is not one.
  std::optional<std::int64_t> integer(const std::string& key) const;
  std::optional<double> number(const std::string& key) const;

  bool operator==(const Message&) const = default;
};

// The datagram of `message`, its values escaped (any bytes round-trip).
// Throws InvalidArgument for a type or key outside [a-z_] (1 to 32
// characters), a field named "type", more than kMaxFields fields, or a result
// longer than kMaxMessageBytes; never for what a value holds.
std::string encode(const Message& message);

// The message in `bytes`, or nullopt when they are not one encode() makes
// (keys in any order): decode(encode(m)) == m, and encode(*decode(b)) is as
// long as b.
std::optional<Message> decode(std::string_view bytes);

// A connected pair (first: the agent's end, second: the worker's), both
// close-on-exec. Throws InternalError when the kernel refuses.
std::pair<int, int> make_socket_pair();

enum class Sent {
  kSent,     // queued for the other end whole
  kFull,     // not sent: the other end's unread messages fill the socket's buffer
  kClosed,   // not sent: the other end is gone (or `fd` is not a socket)
  kRefused,  // not sent: encode() refuses the message (see there)
};
// Sends one message without blocking. Never throws.
Sent send(int fd, const Message& message);
// What `sent` means, for a log line ("the channel is full: ...").
const char* describe(Sent sent);

enum class Received {
  kMessage,    // `out` holds it
  kNothing,    // none queued (wait = false)
  kClosed,     // the other end is gone
  kMalformed,  // a datagram that is not a message (dropped)
};
// Reads one message; with `wait`, blocks until one comes or the other end goes.
Received receive(int fd, Message& out, bool wait);

}  // namespace ddp::control
