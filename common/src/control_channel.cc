#include "ddp/common/control_channel.h"

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

bool valid_value(std::string_view value) {
  return value.find('\n') == std::string_view::npos && value.find('\0') == std::string_view::npos;
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
    if (!valid_value(value)) {
      throw InvalidArgument(origin, "the value of " + key + " holds a newline or NUL");
    }
    out += key + "=" + value + "\n";
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
    if (!valid_name(key) || !valid_value(value)) return std::nullopt;
    if (!typed) {  // the first line names the type
      if (key != "type" || !valid_name(value)) return std::nullopt;
      message.type = std::string(value);
      typed = true;
      continue;
    }
    if (key == "type" || message.fields.size() >= kMaxFields) return std::nullopt;
    if (!message.fields.emplace(std::string(key), std::string(value)).second) {
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

bool send(int fd, const Message& message) {
  const std::string bytes = encode(message);
  for (;;) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n >= 0) return true;  // SEQPACKET: the whole datagram or nothing
    if (errno == EINTR) continue;
    return false;  // EPIPE, ECONNRESET, EBADF: the other end is gone (or never was)
  }
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
