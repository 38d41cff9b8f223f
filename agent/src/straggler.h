// Straggler scores from DDP's step boundaries: each rank's smoothed compute
// time per synchronized step (rank_status.h; time spent waiting for other
// ranks is not in it) relative to the fastest rank's: 1.0 is the fastest,
// 0.5 takes twice as long. A rank scoring below the threshold in every look
// for a sustained window is a straggler, warned about once per round.
// Not thread-safe (the agent's thread).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "ddp/common/time.h"
#include "rank_status.h"

namespace ddp::agent {

// The shortest compute time per step a score is taken from. The figures are
// whole milliseconds, so below this one millisecond is over 10% of the
// figure and a score says nothing; and a worker writing a tiny figure on its
// page (or a node in its summary) would make every other rank a straggler.
inline constexpr Millis kMinStepCompute{10};

// Whether `rank`'s figure `compute` is one a step can take: at least
// kMinStepCompute and, for the smoothed recent figure, no longer than its
// last step took end to end (compute is the part of a step before its
// gradients' all-reduce; with no wall time known, no figure is plausible).
// The recent figure is smoothed over about five steps and the wall time is
// the last step's alone (and the two are not read as one snapshot), so it may
// be up to kWallSlack times the wall time: the slowest rank's compute is
// nearly all of its step, and a step a little shorter than the average must
// not make its score vanish (which would restart the straggler window).
bool plausible_compute(const RankStatus& rank, Millis RankStatus::*compute);
inline constexpr int kWallSlack = 2;

// Rank -> score, for ranks that finished a synchronized step after their first
// (so that a compute time is known) with a plausible figure; empty when fewer
// than two such ranks. `compute` picks the figure: the smoothed recent one
// (warnings) or the mean over the round (the end-of-job summary, which a stale
// summary hardly moves).
std::map<int, double> straggler_scores(const std::vector<RankStatus>& ranks,
                                       Millis RankStatus::*compute = &RankStatus::compute);

class StragglerWatch {
 public:
  static constexpr double kThreshold = 0.7;
  static constexpr Millis kWindow = std::chrono::seconds(5);

  // Returns the ranks that just became stragglers (below the threshold in
  // every call for kWindow up to `now`).
  std::vector<int> update(Clock::time_point now, const std::map<int, double>& scores);
  // The last scores seen (for the end-of-job summary).
  const std::map<int, double>& last_scores() const { return last_; }
  const std::set<int>& named() const { return named_; }

 private:
  std::map<int, Clock::time_point> below_since_;
  std::set<int> named_;
  std::map<int, double> last_;
};

// "rank 0 1.00, rank 1 0.98, rank 2 0.33 (straggler)".
std::string format_scores(const std::map<int, double>& scores, const std::set<int>& stragglers);

}  // namespace ddp::agent
