// The records the rendezvous handlers keep in the store, each as an
// encode/parse pair (the round's end is in round.h; rendezvous/PROTOCOL.md
// has the whole key layout). Store values are written
// by every node of the job and by anyone else who can reach the store, so a
// parse trusts nothing: every field is range-checked (no count can make a node
// build millions of keys, no sum can overflow), numbers are whole tokens
// (never a prefix, never std::stoi), and every failure is a ProtocolError
// naming the key that held the value. Pure functions: no store, no clock.
//
//   record       key (R = rdzv/<run_id>/round_<r>)   value
//   arrival      R/rec_<i>                           "<member> <node rank> <local world size> <master port> <store port> <addr>"
//   decision     R/closed                            "<decider> <nodes> <world> <considered> <master addr> <master port> <store port>"
//   assignment   R/assign_<decider>_<i>              "<group rank> <base rank> <watched member> <watched rank>" or "spare"
//   members      R/members_<decider>                 "<member> <member> ..." in group-rank order
//   current      rdzv/<run_id>/current               "<round> <nodes>"
//   keep-alive   rdzv/<run_id>/alive/<member>        a counter ("17"), or on a store with leases the lease id
//   static node  rdzv/<run_id>/<instance>/round_<r>/node_<g>
//                                                    "<local world size> <master port> <addr> <nonce>"
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::rendezvous_detail {

// Bounds of what a record may say. A job has at most kMaxNodes nodes; one
// round considers at most kMaxArrivals arrivals (the rest are late and join
// the next round); a node runs at most kMaxLocalWorldSize workers (ddprun's
// --nproc_per_node bound). Round numbers stay below kMaxRound.
// What the dynamic rendezvous' errors name as their origin.
inline constexpr const char* kDynamicOrigin = "c10d rendezvous";

inline constexpr int kMaxNodes = 1 << 16;
inline constexpr int kMaxArrivals = 1 << 16;
inline constexpr int kMaxLocalWorldSize = 4096;
inline constexpr int kMaxRound = 1 << 30;
// A member id: 1 to 64 characters of [0-9A-Za-z_-] (ddprun makes 16 hex digits).
inline constexpr std::size_t kMaxMemberLength = 64;
// An address (host name or IP literal): 1 to 255 printable characters, no space.
inline constexpr std::size_t kMaxAddressLength = 255;

bool is_member_id(const std::string& text);

// One node's entry in a round, in arrival order.
struct Arrival {
  // Random id of this node's membership; a node declared dead rejoins with a new one.
  std::string member;
  // --node_rank when given, else -1.
  int node_rank = -1;
  int local_world_size = 1;
  // The MASTER_PORT this node's workers use if it becomes group rank 0.
  std::uint16_t master_port = 0;
  // The built-in store this node serves its round's workers if it becomes
  // group rank 0 (etcd); 0: workers use the agents' store.
  std::uint16_t store_port = 0;
  std::string addr;
};
std::string encode_arrival(const Arrival& arrival);
Arrival parse_arrival(const std::string& text, const std::string& key);

// A round's one decision.
struct Decision {
  // The arrival index of the node that decided (its assignments are
  // R/assign_<decider>_<i>).
  int decider = 0;
  int nodes = 0;
  // Workers in all: the sum of the members' local world sizes.
  int world = 0;
  // Arrivals the decision covers (0 .. considered-1 each have an assignment);
  // a node with a higher index arrived too late for this round.
  int considered = 0;
  std::string master_addr;
  std::uint16_t master_port = 0;
  // Group rank 0's built-in store for workers (0: the agents' store).
  std::uint16_t store_port = 0;
};
std::string encode_decision(const Decision& decision);
Decision parse_decision(const std::string& text, const std::string& key);

// The decider's answer to one arrival.
struct Assignment {
  bool spare = false;  // not in this round
  int group_rank = 0;
  int base_rank = 0;
  // The member whose liveness this node judges, and its group rank ("-" and
  // the node itself in a round of one).
  std::string watched_member;
  int watched_rank = 0;
};
std::string encode_assignment(const Assignment& assignment);
// Checked against the round's decision (ranks below its nodes and world).
Assignment parse_assignment(const std::string& text, const std::string& key,
                            const Decision& decision);

// The members of a round in group-rank order (the next round's lineage).
std::string encode_members(const std::vector<std::string>& members);
std::vector<std::string> parse_members(const std::string& text, const std::string& key);

// The last round that formed.
struct Current {
  int round = 0;
  int nodes = 0;
};
std::string encode_current(const Current& current);
Current parse_current(const std::string& text, const std::string& key);

// The static handler's record of the node with group rank g in a round.
struct StaticNode {
  int local_world_size = 1;
  // The MASTER_PORT of the round's workers (group rank 0's record; 0 in the others).
  std::uint16_t master_port = 0;
  std::string addr;
  // Random, so that two nodes claiming one rank never write the same value
  // (the second one's compare_set then fails).
  std::uint64_t nonce = 0;
};
std::string encode_static_node(const StaticNode& node);
StaticNode parse_static_node(const std::string& text, const std::string& key);

// A keep-alive key's value: a counter, or a lease id (a positive integer).
std::int64_t parse_lease_id(const std::string& text, const std::string& key);

// A record that is one integer in [low, high] (a counter, a round number),
// named `record` in the error.
std::int64_t parse_integer(const std::string& text, const std::string& key, const char* record,
                           std::int64_t low, std::int64_t high);

// How many arrivals a counter's value allows a round to consider: the value
// clamped to [0, kMaxArrivals] (a counter anyone can add to is not trusted
// for more).
int considered_arrivals(std::int64_t counted);

// A value read from the store as a message may show it: its first 80 bytes,
// every byte outside 0x20..0x7e as '?', "..." after a longer one. Anyone who
// reaches the store may have written it.
std::string shown_value(const std::string& text);

}  // namespace ddp::rendezvous_detail
