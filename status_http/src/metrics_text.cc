#include "ddp/status_http/metrics_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>

#include "ddp/common/error.h"

namespace ddp::status_http {

namespace {

constexpr const char* kOrigin = "status_http::MetricsText";
// Integers up to this magnitude are doubles exactly: written without exponent.
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

bool is_letter_or_underscore(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool is_metric_name(std::string_view name) {
  if (name.empty() || is_digit(name.front())) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return is_letter_or_underscore(c) || is_digit(c) || c == ':'; });
}

// [a-zA-Z_][a-zA-Z0-9_]*, not starting "__" (reserved for Prometheus).
bool is_label_name(std::string_view name) {
  if (name.empty() || is_digit(name.front()) || name.substr(0, 2) == "__") return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return is_letter_or_underscore(c) || is_digit(c); });
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// The length of the valid UTF-8 sequence starting at text[at], or 0 when the
// bytes there are not one (overlong forms, surrogates and values past
// U+10FFFF included).
std::size_t utf8_sequence_length(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[at + i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char second_min = 0x80;
  unsigned char second_max = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_min = 0xA0;  // overlong
    if (lead == 0xED) second_max = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_min = 0x90;  // overlong
    if (lead == 0xF4) second_max = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (text.size() - at < length) return 0;
  if (byte(1) < second_min || byte(1) > second_max) return 0;
  for (std::size_t i = 2; i < length; ++i) {
    if (!is_continuation(byte(i))) return 0;
  }
  return length;
}

// Appends `text` escaped as the format wants: backslash and newline always,
// the double quote in label values; invalid UTF-8 becomes U+FFFD.
void append_escaped(std::string& out, std::string_view text, bool escape_quote) {
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t length = utf8_sequence_length(text, at);
    if (length == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
      ++at;
      continue;
    }
    const char c = text[at];
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && escape_quote) {
      out += "\\\"";
    } else {
      out.append(text, at, length);
    }
    at += length;
  }
}

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::trunc(value) && std::fabs(value) <= kMaxExactInteger) {
    return std::to_string(static_cast<std::int64_t>(value));
  }
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

void check_labels(std::string_view metric, const Labels& labels) {
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const std::string& name = labels[i].first;
    if (!is_label_name(name)) {
      throw InternalError(kOrigin, fmt::format("metric {}: '{}' is not a valid label name (it must "
                                               "match [a-zA-Z_][a-zA-Z0-9_]* and not start \"__\")",
                                               metric, name));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (labels[j].first == name) {
        throw InternalError(kOrigin, fmt::format("metric {}: label {} given twice", metric, name));
      }
    }
  }
}

}  // namespace

void MetricsText::family(std::string_view name, std::string_view type, std::string_view help) {
  if (!is_metric_name(name)) {
    throw InternalError(kOrigin, fmt::format("'{}' is not a valid metric name (it must match "
                                             "[a-zA-Z_:][a-zA-Z0-9_:]*)",
                                             name));
  }
  if (type != "counter" && type != "gauge" && type != "untyped") {
    throw InternalError(kOrigin, fmt::format("metric {}: unknown type '{}' (expected counter, "
                                             "gauge or untyped)",
                                             name, type));
  }
  if (type == "counter" && !ends_with(name, "_total")) {
    throw InternalError(kOrigin, fmt::format("counter {} must be named ..._total", name));
  }
  if (help.empty()) throw InternalError(kOrigin, fmt::format("metric {}: no help text", name));
  const std::string key(name);
  if (family_index_.count(key) != 0) {
    throw InternalError(kOrigin, fmt::format("metric {} declared twice", name));
  }
  Family declared;
  declared.header = fmt::format("# HELP {} ", name);
  append_escaped(declared.header, help, false);
  declared.header += fmt::format("\n# TYPE {} {}\n", name, type);
  family_index_.emplace(key, families_.size());
  families_.push_back(std::move(declared));
}

void MetricsText::sample(std::string_view name, const Labels& labels, double value) {
  const auto found = family_index_.find(std::string(name));
  if (found == family_index_.end()) {
    throw InternalError(kOrigin, fmt::format("a sample of {}, a family not declared", name));
  }
  check_labels(name, labels);
  std::string& out = families_[found->second].samples;
  out += name;
  if (!labels.empty()) {
    out += '{';
    for (std::size_t i = 0; i < labels.size(); ++i) {
      if (i > 0) out += ',';
      out += labels[i].first;
      out += "=\"";
      append_escaped(out, labels[i].second, true);
      out += '"';
    }
    out += '}';
  }
  out += ' ';
  out += format_value(value);
  out += '\n';
}

void MetricsText::sample(std::string_view name, double value) { sample(name, Labels{}, value); }

const std::string& MetricsText::text() const {
  text_.clear();
  for (const Family& family : families_) {
    text_ += family.header;
    text_ += family.samples;
  }
  return text_;
}

}  // namespace ddp::status_http
