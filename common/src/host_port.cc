#include "ddp/common/host_port.h"

#include "ddp/common/error.h"

namespace ddp {

HostPort split_host_port(std::string_view text, const std::string& origin) {
  HostPort split;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) {
      throw InvalidArgument(origin, "unclosed '[' in '" + std::string(text) + "'");
    }
    split.host = std::string(text.substr(1, close - 1));
    const std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') {
        throw InvalidArgument(origin, "bad endpoint '" + std::string(text) + "'");
      }
      split.port = std::string(rest.substr(1));
    }
    return split;
  }
  const auto colon = text.find(':');
  if (colon != std::string_view::npos && text.find(':', colon + 1) == std::string_view::npos) {
    split.host = std::string(text.substr(0, colon));
    split.port = std::string(text.substr(colon + 1));
    return split;
  }
  split.host = std::string(text);  // a host name, or a bare IPv6 address
  return split;
}

std::string join_host_port(const std::string& host, std::string_view port) {
  const std::string shown = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return shown + ":" + std::string(port);
}

}  // namespace ddp
