#include "etcd_gateway.h"

#include <fmt/format.h>

#include <charconv>

#include <boost/beast/core/detail/base64.hpp>

#include "ddp/common/json.h"

namespace ddp::etcd {

namespace beast = boost::beast;

namespace {

// The fields of etcd's replies that carry bytes (base64 in the JSON).
bool is_bytes_field(const std::string& name) {
  return name == "key" || name == "value" || name == "range_end";
}

// Throws BadReply naming the first bytes field of `document` that is not
// valid padded base64. Iterative: the document's depth is bounded, but a
// wide one should not cost recursion either.
void check_bytes_fields(const Json& document, const std::string& where) {
  std::vector<const Json*> pending{&document};
  while (!pending.empty()) {
    const Json* node = pending.back();
    pending.pop_back();
    if (node->is_array()) {
      for (const auto& item : *node) pending.push_back(&item);
    } else if (node->is_object()) {
      for (auto it = node->begin(); it != node->end(); ++it) {
        if (it->is_string() && is_bytes_field(it.key()) &&
            !is_padded_base64(it->get_ref<const std::string&>())) {
          throw BadReply(where,
                         fmt::format("sent a \"{}\" that is not valid padded base64", it.key()));
        }
        if (it->is_structured()) pending.push_back(&*it);
      }
    }
  }
}

// `text` as a JSON object whose bytes fields are base64; std::nullopt when it
// is not JSON at all. Throws BadReply for JSON that is not etcd's.
std::optional<Json> parse_object(const std::string& text, const std::string& where) {
  json::Parsed parsed = json::parse_bounded(text);
  if (!parsed.valid) return std::nullopt;
  if (parsed.too_deep) {
    throw BadReply(where, fmt::format("sent JSON nested deeper than {} levels", json::kMaxDepth));
  }
  if (!parsed.value.is_object()) throw BadReply(where, "sent JSON that is not an object");
  check_bytes_fields(parsed.value, where);
  return std::move(parsed.value);
}

}  // namespace

std::pair<int, std::string> error_fields(const Json& reply) {
  auto string_of = [](const Json& object, const char* field) -> std::string {
    auto it = object.find(field);
    return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto code_of = [](const Json& object, const char* field) {
    auto it = object.find(field);
    if (it == object.end() || !it->is_number_integer()) return 2;  // gRPC's "unknown"
    const auto code = it->get<std::int64_t>();
    return code >= 0 && code <= 16 ? static_cast<int>(code) : 2;
  };
  const Json& error = reply.at("error");
  if (error.is_object()) {
    std::string message = string_of(error, "message");
    return {code_of(error, "grpc_code"), message.empty() ? "unknown error" : message};
  }
  std::string message = string_of(reply, "message");
  if (message.empty() && error.is_string()) message = error.get<std::string>();
  return {code_of(reply, "code"), message};
}

Json decode_reply(const std::string& origin, const std::string& where, const std::string& path,
                  const HttpReply& reply) {
  auto parsed = parse_object(reply.body, where);
  if (parsed && parsed->contains("error")) {
    auto [code, message] = error_fields(*parsed);
    ErrorClass cls = classify(code, message);
    if (cls.reauth) throw TokenExpired();
    if (cls.retry) throw ConnectionFailed(message, false);
    throw_reply_error(origin, where, code, message);
  }
  if (reply.status == 200 && parsed) return *std::move(parsed);
  if (reply.status >= 500 && !parsed) {
    throw ConnectionFailed(fmt::format("HTTP {} from POST {}", reply.status, path), false);
  }
  throw BadReply(
      where, fmt::format("is not an etcd v3 HTTP gateway (POST {} answered HTTP {}{})", path,
                         reply.status, reply.status == 200 ? " with a body that is not JSON" : ""));
}

Json decode_stream_message(const std::string& where, const std::string& line) {
  auto parsed = parse_object(line, where);
  if (!parsed) throw BadReply(where, "sent a watch message that is not JSON");
  return *std::move(parsed);
}

// ---------------------------------------------------------------------------
// Helpers

std::string base64_encode(std::string_view bytes) {
  std::string out(beast::detail::base64::encoded_size(bytes.size()), '\0');
  out.resize(beast::detail::base64::encode(out.data(), bytes.data(), bytes.size()));
  return out;
}

namespace {

// The value of a base64 digit, or -1.
int base64_digit(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

bool is_padded_base64(std::string_view text) {
  if (text.size() % 4 != 0) return false;
  std::size_t padding = 0;
  while (padding < 2 && padding < text.size() && text[text.size() - 1 - padding] == '=') ++padding;
  for (std::size_t i = 0; i + padding < text.size(); ++i) {
    if (base64_digit(text[i]) < 0) return false;
  }
  return true;
}

std::string base64_decode(std::string_view text) {
  if (!is_padded_base64(text)) {
    throw ProtocolError("EtcdStore", "etcd sent bytes that are not valid padded base64");
  }
  std::size_t padding = 0;
  while (padding < 2 && padding < text.size() && text[text.size() - 1 - padding] == '=') ++padding;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  std::uint32_t bits = 0;
  int have = 0;
  for (std::size_t i = 0; i + padding < text.size(); ++i) {
    bits = (bits << 6) | static_cast<std::uint32_t>(base64_digit(text[i]));
    have += 6;
    if (have >= 8) {
      have -= 8;
      out.push_back(static_cast<char>((bits >> have) & 0xff));
    }
  }
  return out;
}

std::int64_t json_int(const Json& object, const char* field) {
  auto it = object.find(field);
  if (it == object.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_string()) {
    const auto& text = it->get_ref<const std::string&>();
    std::int64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec == std::errc() && end == text.data() + text.size() && !text.empty()) return value;
  }
  throw ProtocolError("EtcdStore",
                      fmt::format("etcd sent a field {} that is not an integer", field));
}

std::string json_bytes(const Json& object, const char* field) {
  auto it = object.find(field);
  if (it == object.end() || !it->is_string()) return {};
  return base64_decode(it->get<std::string>());
}

bool json_flag(const Json& object, const char* field) {
  auto it = object.find(field);
  return it != object.end() && it->is_boolean() && it->get<bool>();
}

std::string json_string(const Json& object, const char* field, const std::string& otherwise) {
  auto it = object.find(field);
  return it != object.end() && it->is_string() ? it->get<std::string>() : otherwise;
}

std::string prefix_range_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

ErrorClass classify(int code, const std::string& message) {
  if (message.find("invalid auth token") != std::string::npos) return {false, true};
  if (code == 14 || code == 4) return {true, false};
  if (code == 8 && message.find("too many requests") != std::string::npos) return {true, false};
  for (const char* again : {"leader changed", "no leader", "server stopped", "request timed out",
                            "raft proposal dropped"}) {
    if (message.find(again) != std::string::npos) return {true, false};
  }
  return {};
}

void throw_reply_error(const std::string& origin, const std::string& where, int code,
                       const std::string& message) {
  const std::string text = fmt::format("etcd at {} refused the request: {}", where, message);
  const bool auth = code == 7 || code == 16 ||
                    message.find("authentication failed") != std::string::npos ||
                    message.find("user name is empty") != std::string::npos ||
                    message.find("permission denied") != std::string::npos;
  if (auth) throw ReplyError<AuthError>(origin, text, code, message);
  if (code == 3 || code == 5 || code == 6 || code == 9 || code == 11) {
    throw ReplyError<InvalidArgument>(origin, text, code, message);
  }
  throw ReplyError<ProtocolError>(origin, text, code, message);
}

}  // namespace ddp::etcd
