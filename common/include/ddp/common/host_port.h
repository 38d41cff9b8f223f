// Endpoints written as "host[:port]", the way torchrun's --rdzv_endpoint and
// etcd's endpoint lists write them: "h", "h:29400", "[::1]", "[::1]:2379", and a
// bare IPv6 address ("::1", more than one colon) as a host. The one place that
// splits and joins them; what a port may be is the caller's to check.
// Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ddp {

struct HostPort {
  std::string host;  // without the brackets; may be empty (the caller decides)
  // The text after the colon that ends the host; nullopt when there is none.
  // Present but empty for "h:" or "[::1]:".
  std::optional<std::string> port;
};

// Splits `text`. Throws InvalidArgument (origin `origin`) for "unclosed '['
// in '<text>'" and for text after ']' that is not ":port" ("bad endpoint
// '<text>'").
HostPort split_host_port(std::string_view text, const std::string& origin);

// "host:port", with an IPv6 host (one holding a colon) in brackets.
std::string join_host_port(const std::string& host, std::string_view port);

}  // namespace ddp
