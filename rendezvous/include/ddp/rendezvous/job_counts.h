// The job's restarts and membership changes, counted once per round for the
// whole job (not per agent, as torchrun counts them), so that --max_restarts
// is the job's budget and a node that joins late reads what was spent
// instead of starting at zero.
//
// Kept in the agents' store in one key (RendezvousHandler::job_counts), as
// "<restarts> <membership changes> <restarts without progress> <last round
// counted>". The agents that end round r each count its end: the first one
// to find the last round counted below r adds it (compare_set from what it
// read, again after a lost race), the others find r counted. So an end is
// counted once however many nodes call, in whatever order, and however late
// one of them read the counts as the round formed (a peer may have ended and
// counted the round by then).
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
  int last_counted_round = -1;  // the round whose end was counted last (-1: none)
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

// `counts` after round `round` ended as `how`: a restart after a round
// without a step adds one to restarts_without_progress, a round with one
// sets it to zero.
JobCounts counted(JobCounts counts, int round, const RoundEndCount& how);

// "<restarts> <membership changes> <restarts without progress> <last round
// counted>", and back (nullopt for any other text).
std::string encode_job_counts(const JobCounts& counts);
std::optional<JobCounts> decode_job_counts(const std::string& text);

}  // namespace ddp
