#include "values.h"

#include <algorithm>
#include <cctype>
#include <csignal>
#include <regex>
#include <sstream>

#include "ddp/common/env.h"
#include "ddp/common/error.h"
#include "ddp/common/host_port.h"

namespace ddp::launcher {

void fail(const std::string& message) { throw UsageError{message}; }

namespace {

bool is_int(const std::string& text) {
  if (text.empty()) return false;
  std::size_t start = text[0] == '-' || text[0] == '+' ? 1 : 0;
  return start < text.size() && std::all_of(text.begin() + static_cast<long>(start), text.end(),
                                            [](unsigned char c) { return std::isdigit(c); });
}

}  // namespace

long long parse_int_in(const std::string& text, long long lo, long long hi, const std::string& what,
                       const std::string& expected) {
  if (!is_int(text) || text.size() > 18)
    fail(what + ": expected " + expected + ", got '" + text + "'");
  long long value = std::stoll(text);
  if (value < lo || value > hi) fail(what + ": expected " + expected + ", got '" + text + "'");
  return value;
}

std::chrono::milliseconds parse_secs(const std::string& text, const std::string& what) {
  try {
    return env::parse_seconds(text, what);
  } catch (const Error&) {
    fail(what + ": expected a non-negative number of seconds, got '" + text + "'");
  }
}

std::chrono::milliseconds positive_secs(const std::string& text, const std::string& what) {
  auto value = parse_secs(text, what);
  if (value.count() <= 0)
    fail(what + ": expected a positive number of seconds, got '" + text + "'");
  return value;
}

agent::StdSetting parse_std(const std::string& text, const std::string& what) {
  static const std::regex kValue("^[0-3]$");
  static const std::regex kMapping("^[0-9]+:[0-3](,[0-9]+:[0-3])*$");
  agent::StdSetting setting;
  if (std::regex_match(text, kValue)) {
    setting.all = static_cast<agent::Std>(text[0] - '0');
    return setting;
  }
  if (!std::regex_match(text, kMapping) || text.size() > 4096) {
    fail(what +
         ": expected 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a mapping like "
         "0:1,1:3, got '" +
         text + "'");
  }
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    auto colon = item.find(':');
    int rank = static_cast<int>(parse_int_in(item.substr(0, colon), 0, 1 << 20, what,
                                             "local ranks in a mapping like 0:1,1:3"));
    setting.per_rank[rank] = static_cast<agent::Std>(item[colon + 1] - '0');
  }
  return setting;
}

int parse_signal(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (upper.rfind("SIG", 0) != 0) upper = "SIG" + upper;
  static const std::pair<const char*, int> kSignals[] = {
      {"SIGINT", SIGINT},   {"SIGTERM", SIGTERM}, {"SIGHUP", SIGHUP},
      {"SIGQUIT", SIGQUIT}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}};
  for (const auto& [n, signo] : kSignals) {
    if (upper == n) return signo;
  }
  fail("--signals_to_handle: unknown or unsupported signal '" + name +
       "' (supported: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2)");
}

std::pair<std::string, std::uint16_t> parse_endpoint(const std::string& text,
                                                     std::uint16_t default_port,
                                                     const std::string& what) {
  HostPort split;
  try {
    split = split_host_port(text, what);
  } catch (const InvalidArgument&) {
    fail(what + ": expected host[:port], got '" + text + "'");
  }
  if (split.host.empty() || split.host.find_first_of(" \t/") != std::string::npos) {
    fail(what + ": expected host[:port], got '" + text + "'");
  }
  std::uint16_t number = default_port;
  if (split.port) {
    number = static_cast<std::uint16_t>(
        parse_int_in(*split.port, 0, 65535, what, "host[:port] with a port in 0..65535"));
  }
  return {split.host, number};
}

std::string join_endpoint(const std::string& host, const std::string& port) {
  return join_host_port(host, port);
}

}  // namespace ddp::launcher
