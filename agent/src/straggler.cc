#include "straggler.h"

#include <algorithm>

#include <fmt/format.h>

namespace ddp::agent {

bool plausible_compute(const RankStatus& rank, Millis RankStatus::*compute) {
  const Millis figure = rank.*compute;
  if (figure < kMinStepCompute || rank.last_wall <= Millis(0)) return false;
  return compute != &RankStatus::compute || figure <= rank.last_wall * kWallSlack;
}

std::map<int, double> straggler_scores(const std::vector<RankStatus>& ranks,
                                       Millis RankStatus::*compute) {
  Millis fastest = Millis::max();
  int known = 0;
  for (const auto& r : ranks) {
    if (!plausible_compute(r, compute)) continue;
    fastest = std::min(fastest, r.*compute);
    ++known;
  }
  std::map<int, double> scores;
  if (known < 2) return scores;
  for (const auto& r : ranks) {
    if (!plausible_compute(r, compute)) continue;
    scores[r.rank] =
        static_cast<double>(fastest.count()) / static_cast<double>((r.*compute).count());
  }
  return scores;
}

std::vector<int> StragglerWatch::update(Clock::time_point now,
                                        const std::map<int, double>& scores) {
  std::vector<int> named;
  if (!scores.empty()) last_ = scores;
  for (auto it = below_since_.begin(); it != below_since_.end();) {
    auto score = scores.find(it->first);
    it = score == scores.end() || score->second >= kThreshold ? below_since_.erase(it) : ++it;
  }
  for (const auto& [rank, score] : scores) {
    if (score >= kThreshold) continue;
    auto [it, fresh] = below_since_.emplace(rank, now);
    if (!fresh && now - it->second >= kWindow && named_.insert(rank).second) named.push_back(rank);
  }
  return named;
}

std::string format_scores(const std::map<int, double>& scores, const std::set<int>& stragglers) {
  std::string text;
  for (const auto& [rank, score] : scores) {
    if (!text.empty()) text += ", ";
    text += fmt::format("rank {} {:.2f}", rank, score);
    if (stragglers.count(rank) > 0) text += " (straggler)";
  }
  return text;
}

}  // namespace ddp::agent
