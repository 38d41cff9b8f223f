// Fetching the live view's /status from agents for `ddprun status`: the URLs
// as the user writes them, and one GET of each, all at once, over plain HTTP
// (Boost.Beast, as the live view's server and the etcd client use it).
//
// Ownership: nothing outlives a call. Blocking: fetch_statuses blocks until
// every URL answered, failed or ran out of `timeout` (the requests run
// together, so N dead agents cost one timeout, not N). Thread-safety: both
// functions may run on any thread; they share nothing. Errors:
// parse_status_url throws ddp::InvalidArgument for a URL it cannot use; a
// fetch that fails says why in its FetchReply, one line naming no URL (the
// caller names it).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::launcher::status {

struct StatusUrl {
  std::string text;    // as the user wrote it
  std::string host;    // without brackets
  std::string port;    // digits
  std::string target;  // the request's path: ".../status"
  std::string token;   // from "?token=...", which the page's address may carry; empty: none
};

// "http://host:port[/path][?token=T]", or without "http://". The path names
// the live view ("/", the agent's "live view at" address) or its /status; the
// request goes to <path>/status. Throws InvalidArgument for another scheme,
// no port, or a port that is not 1..65535.
StatusUrl parse_status_url(std::string_view text);

struct FetchReply {
  std::optional<std::string> body;  // the body of a 200 reply
  std::string error;                // why there is none: "connection refused", ...
};

// GETs every URL's target with "Authorization: Bearer <token>" when it has a
// token (its own, else `token`), and reads replies of at most `max_body`
// bytes. Replies in the order of `urls`.
std::vector<FetchReply> fetch_statuses(const std::vector<StatusUrl>& urls, const std::string& token,
                                       std::chrono::milliseconds timeout,
                                       std::size_t max_body = 16u << 20);

}  // namespace ddp::launcher::status
