#include "ddp/worker_contract/control_channel.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "ddp/common/error.h"

namespace ddp::control {

namespace {

constexpr std::string_view kHeader = "ddp-control 1\n";
constexpr std::size_t kMaxNameBytes = 32;

bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || c == '_')) return false;
  }
  return true;
}

// A value as it is written in a line: \\, \n and \0 for the bytes that could
// not stand there (nor be told from an escape).
void append_escaped(std::string& out, std::string_view value) {
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\0':
        out += "\\0";
        break;
      default:
        out += c;
    }
  }
}

// The value a line holds, or nullopt for a raw newline or NUL, an unknown
// escape or a lone backslash at the end (none of which encode() writes).
std::optional<std::string> unescape(std::string_view text) {
  std::string value;
  value.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n' || c == '\0') return std::nullopt;
    if (c != '\\') {
      value += c;
      continue;
    }
    if (++i == text.size()) return std::nullopt;
    switch (text[i]) {
      case '\\':
        value += '\\';
        break;
      case 'n':
        value += '\n';
        break;
      case '0':
        value += '\0';
        break;
      default:
        return std::nullopt;
    }
  }
  return value;
}

}  // namespace

Message& Message::set(const std::string& key, std::string value) {
  fields[key] = std::move(value);
  return *this;
}

Message& Message::set(const std::string& key, std::int64_t value) {
  return set(key, std::to_string(value));
}

Message& Message::set(const std::string& key, double value) {
  return set(key, fmt::format("{:.6f}", value));
}

std::string Message::text(const std::string& key) const {
  auto it = fields.find(key);
  return it == fields.end() ? std::string() : it->second;
}

std::optional<std::int64_t> Message::integer(const std::string& key) const {
  auto it = fields.find(key);
  if (it == fields.end() || it->second.empty()) return std::nullopt;
  std::int64_t value = 0;
  const char* begin = it->second.data();
  const char* end = begin + it->second.size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

std::optional<double> Message::number(const std::string& key) const {
  auto it = fields.find(key);
  if (it == fields.end() || it->second.empty()) return std::nullopt;
  double value = 0;
  const char* begin = it->second.data();
  const char* end = begin + it->second.size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr != end || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::string encode(const Message& message) {
  const char* origin = "control::encode";
  if (!valid_name(message.type)) {
    throw InvalidArgument(origin, fmt::format("message type '{}' is not 1 to {} of [a-z_]",
                                              message.type, kMaxNameBytes));
  }
  if (message.fields.size() > kMaxFields) {
    throw InvalidArgument(origin,
                          fmt::format("{} fields (at most {})", message.fields.size(), kMaxFields));
  }
  std::string out(kHeader);
  out += "type=" + message.type + "\n";
  for (const auto& [key, value] : message.fields) {
    if (!valid_name(key) || key == "type") {
      throw InvalidArgument(origin, fmt::format("field name '{}' is not 1 to {} of [a-z_] (nor "
                                                "'type')",
                                                key, kMaxNameBytes));
    }
    out += key;
    out += '=';
    append_escaped(out, value);
    out += '\n';
  }
  if (out.size() > kMaxMessageBytes) {
    throw InvalidArgument(origin, fmt::format("a {} message of {} bytes (at most {})", message.type,
                                              out.size(), kMaxMessageBytes));
  }
  return out;
}

std::optional<Message> decode(std::string_view bytes) {
  if (bytes.size() > kMaxMessageBytes || bytes.substr(0, kHeader.size()) != kHeader) {
    return std::nullopt;
  }
  bytes.remove_prefix(kHeader.size());
  Message message;
  bool typed = false;
  while (!bytes.empty()) {
    const auto newline = bytes.find('\n');
    if (newline == std::string_view::npos) return std::nullopt;  // every line ends
    const std::string_view line = bytes.substr(0, newline);
    bytes.remove_prefix(newline + 1);
    const auto eq = line.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    const std::string_view key = line.substr(0, eq);
    const std::string_view value = line.substr(eq + 1);
    if (!valid_name(key)) return std::nullopt;
    if (!typed) {  // the first line names the type (a name: nothing escaped)
      if (key != "type" || !valid_name(value)) return std::nullopt;
      message.type = std::string(value);
      typed = true;
      continue;
    }
    if (key == "type" || message.fields.size() >= kMaxFields) return std::nullopt;
    auto text = unescape(value);
    if (!text) return std::nullopt;
    if (!message.fields.emplace(std::string(key), std::move(*text)).second) {
      return std::nullopt;  // a key twice
    }
  }
  if (!typed) return std::nullopt;
  return message;
}

std::pair<int, int> make_socket_pair() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    throw InternalError("control::make_socket_pair",
                        fmt::format("socketpair failed: {}", std::strerror(errno)));
  }
  return {fds[0], fds[1]};
}

Sent send(int fd, const Message& message) {
  std::string bytes;
  try {
    bytes = encode(message);
  } catch (const InvalidArgument&) {
    return Sent::kRefused;
  }
  for (;;) {
    // MSG_DONTWAIT: a peer that does not read must not hold the sender.
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return Sent::kSent;  // SEQPACKET: the whole datagram or nothing
    if (errno == EINTR) continue;
    // ENOBUFS: the kernel's own memory for the datagram; as full, for now.
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) return Sent::kFull;
    return Sent::kClosed;  // EPIPE, ECONNRESET, EBADF: the other end is gone (or never was)
  }
}

const char* describe(Sent sent) {
  switch (sent) {
    case Sent::kSent:
      return "sent";
    case Sent::kFull:
      return "the channel is full: the other end has not read the messages already sent";
    case Sent::kClosed:
      return "the channel is closed: the other end is gone";
    case Sent::kRefused:
      return "the message cannot be encoded (a name outside [a-z_], too many fields or over "
             "4 KiB)";
  }
  return "?";
}

Received receive(int fd, Message& out, bool wait) {
  char buffer[kMaxMessageBytes + 1];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), (wait ? 0 : MSG_DONTWAIT) | MSG_TRUNC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (!wait && (errno == EAGAIN || errno == EWOULDBLOCK)) return Received::kNothing;
      return Received::kClosed;
    }
    if (n == 0) return Received::kClosed;  // SEQPACKET: an orderly shutdown
    // MSG_TRUNC returns the datagram's real length: a longer one was cut.
    if (static_cast<std::size_t>(n) > kMaxMessageBytes) return Received::kMalformed;
    auto message = decode(std::string_view(buffer, static_cast<std::size_t>(n)));
    if (!message) return Received::kMalformed;
    out = std::move(*message);
    return Received::kMessage;
  }
}

}  // namespace ddp::control
