#include "token_check.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <cctype>

#include "ddp/common/error.h"

namespace ddp::status_http {

namespace {

std::array<unsigned char, 32> sha256(std::string_view text) {
  std::array<unsigned char, 32> digest{};
  unsigned int size = 0;
  if (EVP_Digest(text.data(), text.size(), digest.data(), &size, EVP_sha256(), nullptr) != 1 ||
      size != digest.size()) {
    throw InternalError("status_http::TokenCheck", "OpenSSL cannot compute a SHA-256 digest");
  }
  return digest;
}

bool starts_with_ignoring_case(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(text[i])) != prefix[i]) return false;
  }
  return true;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<std::string> percent_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    if (i + 2 >= text.size()) return std::nullopt;  // a '%' without two digits
    const int high = hex_digit(text[i + 1]);
    const int low = hex_digit(text[i + 2]);
    if (high < 0 || low < 0) return std::nullopt;
    out += static_cast<char>(high * 16 + low);
    i += 2;
  }
  return out;
}

}  // namespace

TokenCheck::TokenCheck(std::string_view token) : digest_(sha256(token)) {}

bool TokenCheck::matches(std::string_view candidate) const {
  const Digest digest = sha256(candidate);
  return CRYPTO_memcmp(digest.data(), digest_.data(), digest.size()) == 0;
}

bool TokenCheck::accepts(std::string_view authorization, std::string_view query) const {
  if (auto credentials = bearer_credentials(authorization); credentials && matches(*credentials)) {
    return true;
  }
  auto parameter = query_parameter(query, "token");
  return parameter && matches(*parameter);
}

std::optional<std::string_view> bearer_credentials(std::string_view authorization) {
  static constexpr std::string_view kScheme = "bearer";
  if (!starts_with_ignoring_case(authorization, kScheme)) return std::nullopt;
  std::string_view rest = authorization.substr(kScheme.size());
  if (rest.empty() || (rest.front() != ' ' && rest.front() != '\t')) return std::nullopt;
  const auto begin = rest.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return std::nullopt;
  rest.remove_prefix(begin);
  rest.remove_suffix(rest.size() - (rest.find_last_not_of(" \t") + 1));
  return rest;
}

std::optional<std::string> query_parameter(std::string_view query, std::string_view name) {
  while (!query.empty()) {
    const auto end = query.find('&');
    const std::string_view pair = query.substr(0, end);
    query = end == std::string_view::npos ? std::string_view() : query.substr(end + 1);
    const auto equals = pair.find('=');
    if (pair.substr(0, equals) != name) continue;
    if (equals == std::string_view::npos) return std::string();
    return percent_decode(pair.substr(equals + 1));
  }
  return std::nullopt;
}

}  // namespace ddp::status_http
