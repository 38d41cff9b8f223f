// libFuzzer target for the rendezvous' record codec
// (rendezvous/src/records.h) and the round's end (parse_round_end in
// ddp/rendezvous/round.h): the values every node, and anyone else who can
// reach the store, writes under rdzv/<run_id>/ (built by scripts/fuzz with
// clang++-14 -fsanitize=fuzzer,address,undefined; not part of the gcc build).
//
// Input: a selector byte, then the value's text (any bytes). The selector's low
// three bits pick the parser:
//   0 arrival (bit 3 set: the static handler's node record)   1 decision
//   2 assignment   3 members   4 current   5 lease id   6 integer   7 round end
// An assignment is checked against a decision: when the text has a newline,
// what comes before it is parsed as the decision (the fuzzer picks it) and the
// rest is the assignment; otherwise, or when that decision is refused, one of a
// few fixed decisions (selector bits 3-4) is used. For an integer, bits 3-4
// pick the range [low, high] it is checked against.
//
// Invariants checked (abort):
//   - a parse throws nothing but ddp::ProtocolError, and its message names the
//     key in quotes (what a node logs must say which key was bad);
//     parse_round_end throws nothing at all;
//   - a parsed value is within the documented bounds (member ids, ranks below
//     the decision's nodes and world, world <= nodes * kMaxLocalWorldSize,
//     considered <= kMaxArrivals, at most kMaxNodes members, ...);
//   - round trip: encode(parse(x)) parses again, to an equal value, and
//     encoding that gives the same text (the encoding is a fixed point).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/rendezvous/round.h"
#include "records.h"

namespace {

using namespace ddp;
using namespace ddp::rendezvous_detail;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "records_fuzz: invariant violated: %s\n", what);
  std::abort();
}

void check(bool ok, const char* what) {
  if (!ok) die(what);
}

// The keys the records live under (what a parse names when it refuses a value).
const std::string kArrivalKey = "rdzv/fuzz/round_7/rec_3";
const std::string kDecisionKey = "rdzv/fuzz/round_7/closed";
const std::string kAssignmentKey = "rdzv/fuzz/round_7/assign_0_3";
const std::string kMembersKey = "rdzv/fuzz/round_7/members_0";
const std::string kCurrentKey = "rdzv/fuzz/current";
const std::string kAliveKey = "rdzv/fuzz/alive/0123456789abcdef";
const std::string kIntegerKey = "rdzv/fuzz/round_7/counter";
const std::string kStaticNodeKey = "rdzv/fuzz/0123456789abcdef/round_7/node_1";

// Runs `parse`; returns false when it refused the value as it must (a
// ProtocolError naming `key`); aborts on any other exception.
template <typename Parse>
bool parses(Parse&& parse, const std::string& key) {
  try {
    parse();
    return true;
  } catch (const ProtocolError& e) {
    if (std::string(e.what()).find("'" + key + "'") == std::string::npos) {
      std::fprintf(stderr, "records_fuzz: %s\n", e.what());
      die("a ProtocolError that does not name the key");
    }
    return false;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "records_fuzz: %s\n", e.what());
    die("a parse threw something other than ddp::ProtocolError");
  } catch (...) {
    die("a parse threw a non-std exception");
  }
}

// Parses `text` again, which must succeed (it came from an encoder).
template <typename Parse>
void reparses(Parse&& parse, const std::string& key) {
  if (!parses(std::forward<Parse>(parse), key)) die("encode(parse(x)) does not parse");
}

bool is_address(const std::string& text) {
  if (text.empty() || text.size() > kMaxAddressLength) return false;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f) return false;
  }
  return true;
}

bool operator==(const Arrival& a, const Arrival& b) {
  return a.member == b.member && a.node_rank == b.node_rank &&
         a.local_world_size == b.local_world_size && a.master_port == b.master_port &&
         a.store_port == b.store_port && a.addr == b.addr;
}
bool operator==(const Decision& a, const Decision& b) {
  return a.decider == b.decider && a.nodes == b.nodes && a.world == b.world &&
         a.considered == b.considered && a.master_addr == b.master_addr &&
         a.master_port == b.master_port && a.store_port == b.store_port;
}
bool operator==(const Assignment& a, const Assignment& b) {
  return a.spare == b.spare && a.group_rank == b.group_rank && a.base_rank == b.base_rank &&
         a.watched_member == b.watched_member && a.watched_rank == b.watched_rank;
}
bool same_end(const RoundEnd& a, const RoundEnd& b) {
  return a.kind == b.kind && a.node == b.node && a.value == b.value && a.member == b.member &&
         a.detail == b.detail && a.hang == b.hang;
}

void check_decision_bounds(const Decision& d) {
  check(d.decider >= 0 && d.decider < kMaxArrivals, "decision: decider out of range");
  check(d.nodes >= 1 && d.nodes <= kMaxNodes, "decision: nodes out of range");
  // The sum of the members' local world sizes: each is 1 .. kMaxLocalWorldSize.
  check(d.world >= d.nodes && static_cast<std::int64_t>(d.world) <=
                                  static_cast<std::int64_t>(d.nodes) * kMaxLocalWorldSize,
        "decision: world out of range");
  check(d.considered >= d.nodes && d.considered <= kMaxArrivals,
        "decision: considered out of range");
  check(is_address(d.master_addr), "decision: master address is not an address");
}

void fuzz_arrival(const std::string& text) {
  Arrival a;
  if (!parses([&] { a = parse_arrival(text, kArrivalKey); }, kArrivalKey)) return;
  check(is_member_id(a.member), "arrival: member is not a member id");
  check(a.node_rank >= -1 && a.node_rank < kMaxNodes, "arrival: node rank out of range");
  check(a.local_world_size >= 1 && a.local_world_size <= kMaxLocalWorldSize,
        "arrival: local world size out of range");
  check(is_address(a.addr), "arrival: address is not an address");
  const std::string encoded = encode_arrival(a);
  Arrival back;
  reparses([&] { back = parse_arrival(encoded, kArrivalKey); }, kArrivalKey);
  check(back == a, "arrival: round trip changed the value");
  check(encode_arrival(back) == encoded, "arrival: encoding is not a fixed point");
}

void fuzz_static_node(const std::string& text) {
  StaticNode n;
  if (!parses([&] { n = parse_static_node(text, kStaticNodeKey); }, kStaticNodeKey)) return;
  check(n.local_world_size >= 1 && n.local_world_size <= kMaxLocalWorldSize,
        "static node: local world size out of range");
  check(is_address(n.addr), "static node: address is not an address");
  const std::string encoded = encode_static_node(n);
  StaticNode back;
  reparses([&] { back = parse_static_node(encoded, kStaticNodeKey); }, kStaticNodeKey);
  check(back.local_world_size == n.local_world_size && back.master_port == n.master_port &&
            back.addr == n.addr && back.nonce == n.nonce,
        "static node: round trip changed the value");
  check(encode_static_node(back) == encoded, "static node: encoding is not a fixed point");
}

void fuzz_decision(const std::string& text) {
  Decision d;
  if (!parses([&] { d = parse_decision(text, kDecisionKey); }, kDecisionKey)) return;
  check_decision_bounds(d);
  const std::string encoded = encode_decision(d);
  Decision back;
  reparses([&] { back = parse_decision(encoded, kDecisionKey); }, kDecisionKey);
  check(back == d, "decision: round trip changed the value");
  check(encode_decision(back) == encoded, "decision: encoding is not a fixed point");
}

// Decisions an assignment is checked against when the input names none: a
// round of one, a small round, and the largest round the bounds allow.
Decision fixed_decision(unsigned which) {
  Decision d;
  d.master_addr = "10.0.0.1";
  d.master_port = 29500;
  switch (which % 4) {
    case 0:
      d.nodes = 1;
      d.world = 1;
      d.considered = 1;
      break;
    case 1:
      d.nodes = 4;
      d.world = 32;
      d.considered = 6;
      break;
    case 2:
      d.nodes = kMaxNodes;
      d.world = kMaxNodes * kMaxLocalWorldSize;
      d.considered = kMaxArrivals;
      break;
    default:
      d.nodes = 2;
      d.world = 2;
      d.considered = 2;
      break;
  }
  return d;
}

void fuzz_assignment(const std::string& input, unsigned selector) {
  Decision decision = fixed_decision(selector >> 3);
  std::string text = input;
  const auto newline = input.find('\n');
  if (newline != std::string::npos) {
    text = input.substr(newline + 1);
    Decision named;
    if (parses([&] { named = parse_decision(input.substr(0, newline), kDecisionKey); },
               kDecisionKey)) {
      check_decision_bounds(named);
      decision = named;
    }
  }
  Assignment a;
  if (!parses([&] { a = parse_assignment(text, kAssignmentKey, decision); }, kAssignmentKey))
    return;
  if (!a.spare) {
    check(a.group_rank >= 0 && a.group_rank < decision.nodes,
          "assignment: group rank out of range");
    check(a.base_rank >= 0 && a.base_rank < decision.world, "assignment: base rank out of range");
    check(a.watched_rank >= 0 && a.watched_rank < decision.nodes,
          "assignment: watched rank out of range");
    // "-" (no one to watch) only in a round of one.
    check(a.watched_member.empty() ? decision.nodes == 1 : is_member_id(a.watched_member),
          "assignment: watched member is neither a member id nor '-' in a round of one");
  }
  const std::string encoded = encode_assignment(a);
  Assignment back;
  reparses([&] { back = parse_assignment(encoded, kAssignmentKey, decision); }, kAssignmentKey);
  check(back == a, "assignment: round trip changed the value");
  check(encode_assignment(back) == encoded, "assignment: encoding is not a fixed point");
}

void fuzz_members(const std::string& text) {
  std::vector<std::string> members;
  if (!parses([&] { members = parse_members(text, kMembersKey); }, kMembersKey)) return;
  check(members.size() <= static_cast<std::size_t>(kMaxNodes), "members: more than kMaxNodes");
  for (const auto& m : members) check(is_member_id(m), "members: not a member id");
  const std::string encoded = encode_members(members);
  std::vector<std::string> back;
  reparses([&] { back = parse_members(encoded, kMembersKey); }, kMembersKey);
  check(back == members, "members: round trip changed the value");
  check(encode_members(back) == encoded, "members: encoding is not a fixed point");
}

void fuzz_current(const std::string& text) {
  Current c;
  if (!parses([&] { c = parse_current(text, kCurrentKey); }, kCurrentKey)) return;
  check(c.round >= 0 && c.round <= kMaxRound, "current: round out of range");
  check(c.nodes >= 1 && c.nodes <= kMaxNodes, "current: nodes out of range");
  const std::string encoded = encode_current(c);
  Current back;
  reparses([&] { back = parse_current(encoded, kCurrentKey); }, kCurrentKey);
  check(back.round == c.round && back.nodes == c.nodes, "current: round trip changed the value");
  check(encode_current(back) == encoded, "current: encoding is not a fixed point");
}

void fuzz_lease_id(const std::string& text) {
  std::int64_t id = 0;
  if (!parses([&] { id = parse_lease_id(text, kAliveKey); }, kAliveKey)) return;
  check(id >= 1, "lease id: not positive");
  // A lease id has no encoder of its own: the keep-alive writes the decimal.
  std::int64_t back = 0;
  reparses([&] { back = parse_lease_id(std::to_string(id), kAliveKey); }, kAliveKey);
  check(back == id, "lease id: round trip changed the value");
}

void fuzz_integer(const std::string& text, unsigned selector) {
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  // A counter, a round number, the whole int64 range, and a narrow range
  // around zero (both bounds of from_chars and of the range check).
  static const std::int64_t kRanges[4][2] = {{0, kMax}, {0, kMaxRound}, {kMin, kMax}, {-3, 3}};
  const std::int64_t low = kRanges[(selector >> 3) % 4][0];
  const std::int64_t high = kRanges[(selector >> 3) % 4][1];
  std::int64_t value = 0;
  if (!parses([&] { value = parse_integer(text, kIntegerKey, "counter", low, high); }, kIntegerKey))
    return;
  check(value >= low && value <= high, "integer: outside [low, high]");
  std::int64_t back = 0;
  reparses([&] { back = parse_integer(std::to_string(value), kIntegerKey, "counter", low, high); },
           kIntegerKey);
  check(back == value, "integer: round trip changed the value");
  // What a round does with an arrival counter's value.
  const int considered = considered_arrivals(value);
  check(considered >= 0 && considered <= kMaxArrivals,
        "considered_arrivals out of [0, kMaxArrivals]");
}

void fuzz_round_end(const std::string& text) {
  std::optional<RoundEnd> end;
  try {
    end = parse_round_end(text);
  } catch (...) {
    die("parse_round_end threw");
  }
  if (!end) return;
  using Kind = RoundEnd::Kind;
  check(end->detail.empty(), "round end: a parsed end has a detail");
  check(!end->hang || end->kind == RoundEnd::Kind::kRestart || end->kind == RoundEnd::Kind::kAbort,
        "round end: only restart and abort carry a hang");
  switch (end->kind) {
    case Kind::kRestart:
    case Kind::kAbort:
      check(end->node >= -1 && end->node < kMaxNodes, "round end: node out of range");
      check(end->value >= -255 && end->value <= 255, "round end: exit code or signal out of range");
      break;
    case Kind::kNodeLost:
      check(end->node >= 0 && end->node < kMaxNodes, "round end: lost node out of range");
      check(is_member_id(end->member), "round end: lost member is not a member id");
      break;
    case Kind::kNodeJoined:
      check(is_member_id(end->member), "round end: joined member is not a member id");
      break;
    case Kind::kDone:
    case Kind::kStoreLost:
      break;
  }
  const std::string encoded = encode_round_end(*end);
  std::optional<RoundEnd> back;
  try {
    back = parse_round_end(encoded);
  } catch (...) {
    die("parse_round_end threw");
  }
  check(back.has_value(), "round end: encode(parse(x)) does not parse");
  check(same_end(*back, *end), "round end: round trip changed the value");
  check(encode_round_end(*back) == encoded, "round end: encoding is not a fixed point");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const unsigned selector = data[0];
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (selector & 7) {
    case 0:
      if (selector & 8) {
        fuzz_static_node(text);
      } else {
        fuzz_arrival(text);
      }
      break;
    case 1:
      fuzz_decision(text);
      break;
    case 2:
      fuzz_assignment(text, selector);
      break;
    case 3:
      fuzz_members(text);
      break;
    case 4:
      fuzz_current(text);
      break;
    case 5:
      fuzz_lease_id(text);
      break;
    case 6:
      fuzz_integer(text, selector);
      break;
    case 7:
      fuzz_round_end(text);
      break;
  }
  return 0;
}
