// Setting up a run of the demo: the process group, the data, the model and
// where training stands (Training's constructor), then DDP around the model
// (wrap_in_ddp()). The checkpoint a run resumes from is training_checkpoint.h's,
// the replica state a re-formed group synchronizes is in_place_recovery.h's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "ddp/worker/ddp.h"
#include "ddp/worker/replica_state.h"
#include "fashion_mnist.h"
#include "flags.h"
#include "mlp.h"

namespace ddp::examples {

// Where training stands: the epoch, the samples of it already trained (by
// all ranks together: a position valid for any world size) and the steps
// of the whole run. With the parameters and the momentum they are the
// replica's state: a checkpoint, or after a re-form a live peer, says where
// to continue.
struct Progress {
  std::int64_t epoch = 0;
  std::int64_t position = 0;
  std::int64_t global_step = 0;
};

// Everything a run works with. Made once and never moved: the DDP wrapper and
// the replica state point into the model and the progress. Not thread-safe
// (the demo trains on one thread).
struct Training {
  // Joins the process group (under a launcher's environment, else a world of
  // one), loads the data and builds the model; throws ddp::Error or
  // std::runtime_error when one of them fails.
  explicit Training(const Flags& flags);
  Training(const Training&) = delete;
  Training& operator=(const Training&) = delete;

  // Rank 0 prints the run's lines and writes its checkpoints.
  bool lead() const { return pg->rank() == 0; }
  // With --grad-as-bucket-view, points the model's gradients into DDP's
  // buckets again (they move when DDP is made or re-formed, and after a step).
  void refresh_grads();

  const Flags& flags;
  std::shared_ptr<ProcessGroup> pg;  // replaced by every in-place re-form
  const Dataset train;
  const Dataset test;
  const std::vector<int> layers;  // the input width, the hidden widths, 10 classes
  Mlp model;
  // What a checkpoint must have been written with to be resumed (only a
  // checkpoint needs them: the fingerprint reads the whole training set, ~0.1 s).
  const Settings settings;
  const int micro;             // micro-batches a step
  const std::size_t per_step;  // samples a rank trains in one step
  Progress progress;
  std::unique_ptr<DistributedDataParallel> ddp;  // wrap_in_ddp()
  ReplicaState replica;                          // register_replica_state()
};

// Wraps the model in DDP over `t.pg` (after any resume from a checkpoint: the
// parameters are not broadcast, the replica state carries them to every rank).
void wrap_in_ddp(Training& t);

// The learning-rate schedule's length: the steps of an uninterrupted run in
// the world there is now. Throws ddp::InvalidArgument when a step needs more
// samples than the training set has.
std::uint64_t schedule_length(const Training& t);

// CLOCK_MONOTONIC in seconds (--step-times).
double monotonic_seconds();

}  // namespace ddp::examples
