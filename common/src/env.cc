#include "ddp/common/env.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "ddp/common/error.h"

namespace ddp::env {

std::optional<std::string> get(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::string get_or(const char* name, const std::string& fallback) {
  auto value = get(name);
  return value && !value->empty() ? *value : fallback;
}

std::int64_t parse_int(const std::string& text, const std::string& what) {
  std::int64_t value = 0;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    throw InvalidArgument("", what + ": expected an integer, got '" + text + "'");
  }
  return value;
}

std::chrono::milliseconds parse_seconds(const std::string& text, const std::string& what) {
  char* end = nullptr;
  double seconds = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(seconds) || seconds < 0) {
    throw InvalidArgument("",
                          what + ": expected a non-negative number of seconds, got '" + text + "'");
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(seconds * 1000.0)));
}

std::optional<std::int64_t> get_int(const char* name) {
  auto value = get(name);
  if (!value || value->empty()) return std::nullopt;
  return parse_int(*value, std::string("environment variable ") + name);
}

std::optional<bool> get_bool(const char* name) {
  auto value = get(name);
  if (!value || value->empty()) return std::nullopt;
  std::string lower = *value;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "0" || lower == "false" || lower == "no" || lower == "off") return false;
  throw InvalidArgument("", std::string("environment variable ") + name +
                                ": expected a boolean (1/0, true/false), got '" + *value + "'");
}

}  // namespace ddp::env
