#include "membership.h"

#include <algorithm>
#include <map>

#include "ddp/common/error.h"

namespace ddp::rendezvous_detail {

std::optional<std::vector<int>> decide_round(const std::vector<Arrival>& arrivals,
                                             const Lineage& previous, const RoundRule& rule,
                                             bool last_call_over) {
  const int count = static_cast<int>(arrivals.size());
  // Previous position of each survivor (members of the previous round but the lost one).
  std::map<std::string, int> survivor_position;
  for (std::size_t i = 0; i < previous.members.size(); ++i) {
    if (previous.members[i] != previous.lost)
      survivor_position[previous.members[i]] = static_cast<int>(i);
  }
  std::map<std::string, int> first_arrival;  // a member counted once
  for (int i = 0; i < count; ++i) first_arrival.emplace(arrivals[i].member, i);
  bool survivors_here = !survivor_position.empty();
  for (const auto& [member, position] : survivor_position) {
    if (first_arrival.count(member) == 0) survivors_here = false;
  }
  const int distinct = static_cast<int>(first_arrival.size());
  const bool decide = distinct >= rule.max_nodes ||
                      (distinct >= rule.min_nodes && (survivors_here || last_call_over));
  if (!decide) return std::nullopt;

  // Survivors first (in their previous order), then newcomers by arrival;
  // computed once per arrival, not per comparison.
  std::vector<std::pair<int, int>> priorities(arrivals.size());
  for (int i = 0; i < count; ++i) {
    auto it = survivor_position.find(arrivals[i].member);
    priorities[i] =
        it != survivor_position.end() ? std::make_pair(0, it->second) : std::make_pair(1, i);
  }
  auto priority = [&](int i) { return priorities[static_cast<std::size_t>(i)]; };
  std::vector<int> chosen;
  for (const auto& [member, index] : first_arrival) chosen.push_back(index);
  std::sort(chosen.begin(), chosen.end(), [&](int a, int b) { return priority(a) < priority(b); });
  if (static_cast<int>(chosen.size()) > rule.max_nodes) chosen.resize(rule.max_nodes);
  // Group ranks: --node_rank where given, then the same priority.
  std::stable_sort(chosen.begin(), chosen.end(), [&](int a, int b) {
    const int ra = arrivals[a].node_rank, rb = arrivals[b].node_rank;
    if ((ra < 0) != (rb < 0)) return ra >= 0;
    if (ra >= 0 && ra != rb) return ra < rb;
    return priority(a) < priority(b);
  });
  return chosen;
}

void LastCall::observe(int arrivals, Clock::time_point now) {
  if (!started_ && arrivals >= min_nodes_) started_ = now;
}

bool LastCall::over(Clock::time_point now) const { return started_ && now >= *started_ + timeout_; }

Clock::time_point LastCall::deadline() const {
  return started_ ? *started_ + timeout_ : Clock::time_point::max();
}

HeartbeatTracker::HeartbeatTracker(Duration interval, int max_attempts, Clock::time_point start)
    : interval_(interval), max_attempts_(max_attempts), last_change_(start) {}

void HeartbeatTracker::observe(const std::optional<std::string>& value, Clock::time_point now) {
  if (value && value != last_value_) {
    last_value_ = value;
    last_change_ = now;
  }
}

bool HeartbeatTracker::dead(Clock::time_point now) const { return missed(now) >= max_attempts_; }

int HeartbeatTracker::missed(Clock::time_point now) const {
  if (now <= last_change_) return 0;
  return static_cast<int>((now - last_change_) / interval_);
}

}  // namespace ddp::rendezvous_detail
