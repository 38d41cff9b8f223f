// Whether a request carries the server's token: as `Authorization: Bearer
// <token>` or as the query parameter `token=<token>` (percent-decoded; '+' is
// taken literally). Either one matching is enough.
//
// Ownership: a TokenCheck keeps a SHA-256 digest of the token, not the token.
// Blocking: none. Thread-safety: accepts() is const and may run on any thread.
// Errors: the constructor throws InternalError when OpenSSL cannot hash.
// Timing: candidates are compared by their digests with CRYPTO_memcmp, so the
// time taken tells nothing of the token, not even its length.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace ddp::status_http {

class TokenCheck {
 public:
  explicit TokenCheck(std::string_view token);

  // `authorization`: the Authorization header's value (empty when none);
  // `query`: the raw query of the target.
  bool accepts(std::string_view authorization, std::string_view query) const;

 private:
  using Digest = std::array<unsigned char, 32>;
  bool matches(std::string_view candidate) const;

  Digest digest_;
};

// The credentials of a "Bearer <credentials>" header value (the scheme in any
// case); nullopt for another scheme or none.
std::optional<std::string_view> bearer_credentials(std::string_view authorization);

// The value of the first parameter `name` of a raw query ("a=1&token=x"),
// percent-decoded; nullopt when there is none or its escapes are malformed.
std::optional<std::string> query_parameter(std::string_view query, std::string_view name);

}  // namespace ddp::status_http
