// The job's counts (ddp/rendezvous/job_counts.h) in a store key, for the
// handlers that keep them there. Thread-safety: functions of the Store they
// are given. Errors: the store's; a value that is no counts is a ProtocolError
// naming the key.
#pragma once

#include <string>

#include "ddp/rendezvous/job_counts.h"
#include "ddp/store/store.h"

namespace ddp::rendezvous_detail {

// The counts at `key` (zero when it does not exist). Never waits.
JobCounts read_job_counts(Store& store, const std::string& key);

// Counts the end of round `round` as `how` unless another agent did (the
// counts' last_counted_round is `round` or later): compare_set from what it
// read, read again after a lost race. Returns the counts after it.
JobCounts count_round_end(Store& store, const std::string& key, int round,
                          const RoundEndCount& how);

}  // namespace ddp::rendezvous_detail
