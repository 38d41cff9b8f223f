// The epoch loop: the line before the first step, the steps of each epoch
// with their progress lines and checkpoints, a test after each epoch, an
// in-place recovery whenever the group changes under a step or a test, and
// the lines after the last one. Only rank 0 prints, but with --step-times.
#pragma once

#include <chrono>
#include <cstdint>

#include "setup.h"

namespace ddp::examples {

// What the run added up to, for its last lines.
struct RunTotals {
  std::chrono::steady_clock::time_point started;  // the first step's start
  double accuracy = 0;                            // the last test's, in percent
  std::uint64_t steps = 0;                        // optimizer steps this process took
  double backward_ms = 0;                         // summed over those steps (ddp::ReducerStats)
  double comm_ms = 0;
  double exposed_comm_ms = 0;
};

// Rank 0 says what it trains: the model, the samples, the world and its steps an epoch.
void announce_training(const Training& t);

// Trains from `t.progress` to the end of the last epoch, or to --max-steps,
// with `total_steps` the learning-rate schedule's length (schedule_length()).
// Collective; throws what the steps, the tests and recover_in_place() throw
// but ddp::GroupChanged, after which the epoch goes on in the re-formed group.
RunTotals train_epochs(Training& t, std::uint64_t total_steps);

// Rank 0's last lines: DDP's mean times per step (when it took one) and the
// final test accuracy, which the scripts read ("final test accuracy: ").
void report_run(const Training& t, const RunTotals& totals);

}  // namespace ddp::examples
