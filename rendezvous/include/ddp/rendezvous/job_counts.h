// The job's restarts and membership changes, counted once per round for the
// whole job (not per agent, as torchrun counts them), so that --max_restarts
// is the job's budget and a node that joins late reads what was spent
// instead of starting at zero.
//
// Kept in the agents' store in one key (RendezvousHandler::job_counts), as
// "<restarts> <membership changes> <restarts without progress>". Every agent of a round read the same
// counts when the round formed (every agent of the round before counted its
// end before joining this one); the agents that end a round each ask for
// the same step from those counts with compare_set, so the first one counts
// it and the others find it counted: once per round however many nodes call,
// and in whatever order.
#pragma once

#include <optional>
#include <string>

namespace ddp {

struct JobCounts {
  int restarts = 0;            // rounds that ended in a failure and restarted (--max_restarts)
  int membership_changes = 0;  // rounds that re-formed for a node lost or admitted
  // The restarts in a row, up to the last one, after rounds in which no rank
  // completed a step (--max_no_progress_restarts).
  int restarts_without_progress = 0;
  bool operator==(const JobCounts&) const = default;
};

// How a round that does not end the job ended, for JobCounts: a restart or
// a membership change, and whether a rank completed a step in it (a round
// whose steps cannot be seen counts as one that made progress).
struct RoundEndCount {
  enum class Kind { kRestart, kMembershipChange };
  Kind kind = Kind::kRestart;
  bool progressed = true;
};

// `counts` after one more round ended as `how`: a restart after a round
// without a step adds one to restarts_without_progress, a round with one
// sets it to zero.
JobCounts counted(JobCounts counts, const RoundEndCount& how);

// "<restarts> <membership changes> <restarts without progress>", and back
// (nullopt for any other text).
std::string encode_job_counts(const JobCounts& counts);
std::optional<JobCounts> decode_job_counts(const std::string& text);

}  // namespace ddp
