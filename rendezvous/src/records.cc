#include "records.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <limits>

#include "ddp/common/error.h"
#include "ddp/common/text.h"

namespace ddp::rendezvous_detail {
namespace {

// A record is a line of a few fields; a member list is the longest.
constexpr std::size_t kMaxRecordBytes =
    (kMaxMemberLength + 1) * static_cast<std::size_t>(kMaxNodes);

// Reads one record's space-separated fields; the first problem is a
// ProtocolError naming the record, the key and the value (cut short).
class Fields {
 public:
  Fields(const std::string& text, const char* record, const std::string& key,
         const char* origin = kDynamicOrigin)
      : text_(text), record_(record), key_(key), origin_(origin) {
    if (text.size() > kMaxRecordBytes) fail(fmt::format("{} bytes is too long", text.size()));
  }

  std::string word(const char* what) {
    skip_spaces();
    const std::size_t begin = at_;
    while (at_ < text_.size() && text_[at_] != ' ') ++at_;
    if (at_ == begin) fail(fmt::format("no {}", what));
    return text_.substr(begin, at_ - begin);
  }

  std::int64_t integer(const char* what, std::int64_t low, std::int64_t high) {
    const std::string token = word(what);
    std::int64_t value = 0;
    auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
    if (ec != std::errc() || end != token.data() + token.size()) {
      fail(fmt::format("{} '{}' is not an integer", what, shown_value(token)));
    }
    if (value < low || value > high) {
      fail(fmt::format("{} {} is outside [{}, {}]", what, value, low, high));
    }
    return value;
  }

  std::uint64_t unsigned64(const char* what) {
    const std::string token = word(what);
    std::uint64_t value = 0;
    auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
    if (ec != std::errc() || end != token.data() + token.size()) {
      fail(fmt::format("{} '{}' is not an unsigned 64-bit integer", what, shown_value(token)));
    }
    return value;
  }

  int small(const char* what, int low, int high) {
    return static_cast<int>(integer(what, low, high));
  }
  std::uint16_t port(const char* what) {
    return static_cast<std::uint16_t>(integer(what, 0, 65535));
  }

  std::string member(const char* what) {
    std::string token = word(what);
    if (!is_member_id(token))
      fail(fmt::format("{} '{}' is not a member id", what, shown_value(token)));
    return token;
  }

  std::string address(const char* what) {
    std::string token = word(what);
    const bool plain =
        std::all_of(token.begin(), token.end(), [](char c) { return c != ' ' && is_printable(c); });
    if (token.size() > kMaxAddressLength || !plain) {
      fail(fmt::format("{} '{}' is not a host name or address", what, shown_value(token)));
    }
    return token;
  }

  bool done() {
    skip_spaces();
    return at_ == text_.size();
  }
  void finish() {
    if (!done()) fail("more fields than it has");
  }

  [[noreturn]] void fail(const std::string& why) const {
    throw ProtocolError(origin_, fmt::format("malformed {} at '{}': {} (value '{}')", record_, key_,
                                             why, shown_value(text_)));
  }

 private:
  void skip_spaces() {
    while (at_ < text_.size() && text_[at_] == ' ') ++at_;
  }

  const std::string& text_;
  const char* record_;
  const std::string& key_;
  const char* origin_;
  std::size_t at_ = 0;
};

}  // namespace

bool is_member_id(const std::string& text) {
  return !text.empty() && text.size() <= kMaxMemberLength &&
         std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  c == '_' || c == '-';
         });
}

std::string encode_arrival(const Arrival& a) {
  return fmt::format("{} {} {} {} {} {}", a.member, a.node_rank, a.local_world_size, a.master_port,
                     a.store_port, a.addr);
}

Arrival parse_arrival(const std::string& text, const std::string& key) {
  Fields f(text, "arrival", key);
  Arrival a;
  a.member = f.member("member");
  a.node_rank = f.small("node rank", -1, kMaxNodes - 1);
  a.local_world_size = f.small("local world size", 1, kMaxLocalWorldSize);
  a.master_port = f.port("master port");
  a.store_port = f.port("store port");
  a.addr = f.address("address");
  f.finish();
  return a;
}

std::string encode_static_node(const StaticNode& n) {
  return fmt::format("{} {} {} {}", n.local_world_size, n.master_port, n.addr, n.nonce);
}

StaticNode parse_static_node(const std::string& text, const std::string& key) {
  Fields f(text, "node record", key, "rendezvous");
  StaticNode n;
  n.local_world_size = f.small("local world size", 1, kMaxLocalWorldSize);
  n.master_port = f.port("master port");
  n.addr = f.address("address");
  n.nonce = f.unsigned64("nonce");
  f.finish();
  return n;
}

std::string encode_decision(const Decision& d) {
  return fmt::format("{} {} {} {} {} {} {}", d.decider, d.nodes, d.world, d.considered,
                     d.master_addr, d.master_port, d.store_port);
}

Decision parse_decision(const std::string& text, const std::string& key) {
  Fields f(text, "round decision", key);
  Decision d;
  d.decider = f.small("decider", 0, kMaxArrivals - 1);
  d.nodes = f.small("node count", 1, kMaxNodes);
  // Every node runs 1 to kMaxLocalWorldSize workers: the sum fits an int.
  d.world = f.small("world size", d.nodes, d.nodes * kMaxLocalWorldSize);
  d.considered = f.small("arrivals considered", d.nodes, kMaxArrivals);
  d.master_addr = f.address("master address");
  d.master_port = f.port("master port");
  d.store_port = f.port("store port");
  f.finish();
  return d;
}

std::string encode_assignment(const Assignment& a) {
  if (a.spare) return "spare";
  return fmt::format("{} {} {} {}", a.group_rank, a.base_rank,
                     a.watched_member.empty() ? "-" : a.watched_member, a.watched_rank);
}

Assignment parse_assignment(const std::string& text, const std::string& key,
                            const Decision& decision) {
  Assignment a;
  if (text == "spare") {
    a.spare = true;
    return a;
  }
  Fields f(text, "assignment", key);
  a.group_rank = f.small("group rank", 0, decision.nodes - 1);
  a.base_rank = f.small("base rank", 0, decision.world - 1);
  const std::string watched = f.word("watched member");
  if (watched != "-" && !is_member_id(watched)) f.fail("the watched member is not a member id");
  if (watched == "-" && decision.nodes > 1) f.fail("no watched member in a round of several nodes");
  a.watched_member = watched == "-" ? std::string() : watched;
  a.watched_rank = f.small("watched rank", 0, decision.nodes - 1);
  f.finish();
  return a;
}

std::string encode_members(const std::vector<std::string>& members) {
  std::string text;
  for (const auto& m : members) {
    if (!text.empty()) text += ' ';
    text += m;
  }
  return text;
}

std::vector<std::string> parse_members(const std::string& text, const std::string& key) {
  Fields f(text, "member list", key);
  std::vector<std::string> members;
  while (!f.done()) {
    if (static_cast<int>(members.size()) == kMaxNodes)
      f.fail(fmt::format("more than {} members", kMaxNodes));
    members.push_back(f.member("member"));
  }
  return members;
}

std::string encode_current(const Current& c) { return fmt::format("{} {}", c.round, c.nodes); }

Current parse_current(const std::string& text, const std::string& key) {
  Fields f(text, "current round", key);
  Current c;
  c.round = f.small("round", 0, kMaxRound);
  c.nodes = f.small("node count", 1, kMaxNodes);
  f.finish();
  return c;
}

std::int64_t parse_lease_id(const std::string& text, const std::string& key) {
  Fields f(text, "keep-alive lease", key);
  const std::int64_t id = f.integer("lease id", 1, std::numeric_limits<std::int64_t>::max());
  f.finish();
  return id;
}

std::int64_t parse_integer(const std::string& text, const std::string& key, const char* record,
                           std::int64_t low, std::int64_t high) {
  Fields f(text, record, key);
  const std::int64_t value = f.integer("value", low, high);
  f.finish();
  return value;
}

std::string shown_value(const std::string& text) {
  const std::string shown = printable(std::string_view(text).substr(0, 80));
  return text.size() > 80 ? shown + "..." : shown;
}

int considered_arrivals(std::int64_t counted) {
  return static_cast<int>(std::clamp<std::int64_t>(counted, 0, kMaxArrivals));
}

}  // namespace ddp::rendezvous_detail
