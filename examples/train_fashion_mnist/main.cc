// Fashion-MNIST MLP trained data-parallel with ddp: one process per rank
// (ddprun --nproc_per_node=N build/bin/train_fashion_mnist), the Gloo process
// group, DistributedDataParallel with bucketed all-reduce overlapped with the
// backward pass, and the DistributedSampler. Without a launcher's environment
// it trains alone (world size 1).
//
// Rank 0 prints a progress line (epoch, step, loss, samples/s) and the test
// accuracy after every epoch. With --checkpoint, rank 0 saves parameters,
// optimizer state, the sampler position, the step counter and the settings
// they depend on atomically; every rank loads the file at start, so a
// restarted run continues where it stopped, bit for bit (see checkpoint.h).
//
// Under ddprun it recovers in place (ddp/worker/recovery.h): when a node is
// lost or joins, or a worker elsewhere is restarted, this process keeps
// running, re-forms its group, and the replicas are made identical again
// from the lowest rank that survived (ddp::ReplicaState: parameters,
// momentum, epoch, sampler position, global step); a newcomer receives that
// state instead of training from a checkpoint. The sampler continues the
// epoch from the same global position with the new world size.
//
// --step-times (for bench/recovery): every rank also prints a line per
// completed step and one per state synchronization, each with the time
// (CLOCK_MONOTONIC, comparable only on this host):
//   step-time rank=R world=W global_step=G t=<s>
//   state-sync rank=R root=X received=0|1 live=0|1 bytes=N seconds=<s> t=<s>
//
// Where to read what: setup.h (the group, the data, the model, DDP),
// training_checkpoint.h (resuming and saving), in_place_recovery.h (the
// replica state and ddp::reform()), epoch_loop.h (the steps, the progress
// lines, the tests), flags.h (the command line).
#include <cblas.h>

#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "ddp/worker/init.h"
#include "epoch_loop.h"
#include "flags.h"
#include "in_place_recovery.h"
#include "setup.h"
#include "training_checkpoint.h"

namespace ddp::examples {
namespace {

int run(const Flags& flags) {
  // One BLAS thread per rank: the ranks already occupy the cores.
  openblas_set_num_threads(1);

  Training t(flags);          // the process group, the data, the model
  resume_from_checkpoint(t);  // with --checkpoint, when one was saved
  wrap_in_ddp(t);
  register_replica_state(t);
  report_sync(t, t.replica.sync(*t.pg));  // a newcomer to a running job receives it here
  const std::uint64_t total_steps = schedule_length(t);

  announce_training(t);
  const RunTotals totals = train_epochs(t, total_steps);  // recovers in place as it goes
  report_run(t, totals);
  destroy_process_group();
  return 0;
}

}  // namespace
}  // namespace ddp::examples

int main(int argc, char** argv) {
  ddp::examples::Flags f;
  CLI::App app{"Fashion-MNIST MLP trained with ddp (DistributedDataParallel + DistributedSampler)"};
  ddp::examples::add_flags(app, f);
  CLI11_PARSE(app, argc, argv);
  try {
    return ddp::examples::run(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_fashion_mnist: error: %s\n", e.what());
    return 1;
  }
}
