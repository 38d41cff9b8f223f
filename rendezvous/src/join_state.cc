#include "join_state.h"

#include <algorithm>
#include <set>

namespace ddp::rendezvous_detail {

JoinState start_join(const JoinRules& rules, int round, std::int64_t index,
                     Clock::time_point deadline, Clock::time_point now) {
  JoinState join;
  join.round = round;
  join.index = index;
  join.deadline = deadline;
  join.fallback_at = fallback_after(rules, now);
  join.last_call = LastCall(rules.nodes.min_nodes, rules.last_call_timeout);
  return join;
}

Clock::time_point fallback_after(const JoinRules& rules, Clock::time_point now) {
  return now + rules.last_call_timeout + rules.verdict;
}

bool may_decide(const JoinState& join, Clock::time_point now) {
  // A node past what a round considers (the counter inflated by anyone's
  // add) is late for it: it never decides, whatever the time.
  if (join.index >= kMaxArrivals) return false;
  return join.index == 0 || now >= join.fallback_at;
}

std::vector<int> records_to_read(const JoinState& join, int count, Clock::time_point now) {
  // One missing past its grace is an arrival that did not happen: not read again.
  std::vector<int> wanted;
  for (const auto& [i, since] : join.missing) {
    if (now < since + kRecordGrace) wanted.push_back(i);
  }
  for (int i = static_cast<int>(join.arrivals.size()); i < count; ++i) wanted.push_back(i);
  return wanted;
}

void note_record(JoinState& join, int index, std::optional<Arrival> record, Clock::time_point now) {
  const auto at = static_cast<std::size_t>(index);
  if (join.arrivals.size() <= at) join.arrivals.resize(at + 1);
  if (record) {
    join.arrivals[at] = std::move(record);
    join.missing.erase(index);
  } else {
    join.missing.emplace(index, now);  // keeps the first time it was seen missing
  }
}

bool awaiting_record(const JoinState& join, Clock::time_point now) {
  return std::any_of(join.missing.begin(), join.missing.end(),
                     [now](const auto& missing) { return now < missing.second + kRecordGrace; });
}

std::optional<Publication> plan_round(JoinState& join, const JoinRules& rules, int count,
                                      Clock::time_point now) {
  if (awaiting_record(join, now)) return std::nullopt;
  if (static_cast<int>(join.arrivals.size()) < count)
    join.arrivals.resize(static_cast<std::size_t>(count));
  std::vector<Arrival> present;
  std::vector<int> index_of;  // present[k] is arrival index_of[k]
  for (int i = 0; i < count; ++i) {
    if (!join.arrivals[static_cast<std::size_t>(i)]) continue;
    present.push_back(*join.arrivals[static_cast<std::size_t>(i)]);
    index_of.push_back(i);
  }
  // Last call starts at min_nodes distinct members, as decide_round counts them.
  std::set<std::string> members;
  for (const auto& a : present) members.insert(a.member);
  join.last_call.observe(static_cast<int>(members.size()), now);
  const auto chosen = decide_round(present, join.lineage ? *join.lineage : Lineage{}, rules.nodes,
                                   join.last_call.over(now));
  if (!chosen) return std::nullopt;

  Publication p;
  Decision& d = p.decision;
  d.decider = static_cast<int>(join.index);
  d.nodes = static_cast<int>(chosen->size());
  d.considered = count;
  // Group rank g is present[(*chosen)[g]], arrival index_of[...] of them.
  auto arrival_of_rank = [&](int g) -> const Arrival& {
    return present[static_cast<std::size_t>((*chosen)[static_cast<std::size_t>(g)])];
  };
  p.assignments.resize(static_cast<std::size_t>(count));
  for (auto& a : p.assignments) a.spare = true;
  for (int g = 0; g < d.nodes; ++g) {
    const int i = index_of[static_cast<std::size_t>((*chosen)[static_cast<std::size_t>(g)])];
    Assignment& a = p.assignments[static_cast<std::size_t>(i)];
    a.spare = false;
    a.group_rank = g;
    a.base_rank = d.world;
    a.watched_rank = (g + 1) % d.nodes;
    a.watched_member = d.nodes > 1 ? arrival_of_rank(a.watched_rank).member : "";
    d.world += arrival_of_rank(g).local_world_size;  // at most kMaxNodes x kMaxLocalWorldSize
    p.members.push_back(arrival_of_rank(g).member);
  }
  const Arrival& master = arrival_of_rank(0);
  d.master_addr = master.addr;
  d.master_port = master.master_port;
  d.store_port = master.store_port;
  return p;
}

Wake next_wake(const JoinState& join, const JoinRules& rules, Clock::time_point now) {
  Wake wake;
  wake.until = join.deadline;
  if (!may_decide(join, now)) {  // a waiter: for the decision, or its turn to decide
    wake.kind = Wake::Kind::kClosed;
    wake.until = std::min(wake.until, join.fallback_at);
    return wake;
  }
  wake.kind = Wake::Kind::kRecord;
  if (!join.missing.empty()) {
    // The decider waits for a record whose index was taken, within its grace.
    auto first = std::min_element(join.missing.begin(), join.missing.end(),
                                  [](const auto& a, const auto& b) { return a.second < b.second; });
    wake.index = first->first;
    wake.until = std::min(wake.until, first->second + kRecordGrace);
    return wake;
  }
  // The first arrival that can change the decision: min or max nodes in a
  // first round, every survivor in a re-formation (then one by one).
  const int have = static_cast<int>(join.arrivals.size());
  int wanted = have < rules.nodes.min_nodes ? rules.nodes.min_nodes : rules.nodes.max_nodes;
  if (join.lineage && !join.lineage->members.empty()) {
    const int survivors =
        static_cast<int>(join.lineage->members.size()) - (join.lineage->lost.empty() ? 0 : 1);
    wanted = std::max(rules.nodes.min_nodes, survivors);
  }
  wake.index = std::max(have, wanted - 1);
  wake.until = std::min(wake.until, join.last_call.deadline());
  return wake;
}

RendezvousInfo round_info(int round, const std::string& round_prefix, const Decision& c,
                          const Assignment& a, const std::string& member,
                          const WorkerStores& stores) {
  RendezvousInfo info;
  info.round = round;
  info.group_rank = a.group_rank;
  info.base_rank = a.base_rank;
  info.group_world_size = c.nodes;
  info.world_size = c.world;
  info.master_addr = c.master_addr;
  info.master_port = c.master_port;
  info.instance = member;
  info.round_prefix = round_prefix;
  info.worker_prefix = round_prefix + "/workers";
  const bool shared = stores.worker_store_port == 0;  // workers use the agents' store
  info.store_addr = shared ? stores.agents_host : c.master_addr;
  info.store_port = shared ? stores.agents_port : c.store_port;
  return info;
}

}  // namespace ddp::rendezvous_detail
