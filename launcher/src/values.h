// The readers of ddprun's option values. Each one takes the text and the name
// to blame (`what`, e.g. "--max_restarts (from PET_MAX_RESTARTS)") and throws a
// UsageError whose message is one line naming it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "ddp/agent/worker_spec.h"
#include "ddp/common/text.h"

namespace ddp::launcher {

// A bad value: the message is printed as "ddprun: error: <message>".
struct UsageError {
  std::string message;
};

[[noreturn]] void fail(const std::string& message);

// An integer in [lo, hi] (an optional sign, at most 18 characters); otherwise
// "<what>: expected <expected>, got '<text>'".
long long parse_int_in(const std::string& text, long long lo, long long hi, const std::string& what,
                       const std::string& expected);

// Seconds, whole or fractional, not negative.
std::chrono::milliseconds parse_secs(const std::string& text, const std::string& what);

// Seconds, whole or fractional, more than zero.
std::chrono::milliseconds positive_secs(const std::string& text, const std::string& what);

// A duration as seconds ("300", "0.5"), how a default is shown, is
// ddp::seconds_text (ddp/common/text.h).

// -r/--redirects, -t/--tee: 0..3, or per local rank "0:1,1:3".
agent::StdSetting parse_std(const std::string& text, const std::string& what);

// A signal --signals_to_handle may name: INT, SIGINT, sigint ... (INT, TERM,
// HUP, QUIT, USR1, USR2).
int parse_signal(const std::string& name);

// "host", "host:port", "[v6]:port" (port 0..65535); `default_port` when the
// port is not given.
std::pair<std::string, std::uint16_t> parse_endpoint(const std::string& text,
                                                     std::uint16_t default_port,
                                                     const std::string& what);

// `host`:`port`, with an IPv6 address in brackets.
std::string join_endpoint(const std::string& host, const std::string& port);

}  // namespace ddp::launcher
