#include <boost/asio/ip/address.hpp>

#include <algorithm>
#include <cctype>

#include "ddp/status_http/server.h"

namespace ddp::status_http {

namespace {

bool is_localhost_name(const std::string& host) {
  static constexpr std::string_view kLocalhost = "localhost";
  return host.size() == kLocalhost.size() &&
         std::equal(host.begin(), host.end(), kLocalhost.begin(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) == b;
         });
}

bool is_loopback_v4(const boost::asio::ip::address_v4& address) {
  return address.to_bytes()[0] == 127;
}

}  // namespace

bool is_loopback(const std::string& host) {
  if (is_localhost_name(host)) return true;
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(host, ec);
  if (ec) return false;  // another name, or nothing at all
  if (address.is_v4()) return is_loopback_v4(address.to_v4());
  const auto v6 = address.to_v6();
  if (v6.is_loopback()) return true;
  return v6.is_v4_mapped() &&
         is_loopback_v4(boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, v6));
}

}  // namespace ddp::status_http
