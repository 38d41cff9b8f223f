// DistributedSampler: the indices one rank reads in one epoch, identical to
// torch.utils.data.DistributedSampler (torch 1.13) for the same arguments:
//
// - shuffle: a permutation of [0, dataset_size) from torch's CPU randperm with a
//   torch.Generator seeded with seed + epoch (mt19937, Fisher-Yates driven by
//   `random() % (n - i)`); otherwise 0, 1, 2, ...
// - drop_last=false: the list is padded to a multiple of num_replicas by
//   repeating its beginning (as often as needed); drop_last=true: the tail that
//   does not fill a whole round is dropped.
// - rank r takes every num_replicas-th index starting at r.
//
// Continuing an epoch with another world size (in-place recovery, elastic
// resize): set_position(c) says that the first c entries of the epoch's order
// (the permutation above, before any padding) were consumed. The remaining
// dataset_size - c entries, in that order, are split as torch splits a dataset
// of that many: padded to a multiple of num_replicas by repeating the
// remainder's beginning (drop_last=false) or cut to one (drop_last=true), rank
// r taking every num_replicas-th entry from r. So when a run of W ranks that
// took B samples per rank for S steps (c = S * B * W, no padding reached) goes
// on with W' ranks, the new ranks together read every sample the epoch has not
// read yet exactly once, plus the padding (or minus the cut tail) of the rule
// above. Position 0 is the torch-identical split. size() and total_size()
// describe the remainder. set_epoch() starts the new epoch at position 0, so
// after a re-form: a new sampler for the new world size and rank, then
// set_epoch(epoch), then set_position(consumed).
//
// Not thread-safe (like the Python object); cheap to copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddp {

class DistributedSampler {
 public:
  // Throws InvalidArgument when num_replicas < 1 or rank is outside [0, num_replicas).
  DistributedSampler(std::size_t dataset_size, int num_replicas, int rank, bool shuffle = true,
                     std::uint64_t seed = 0, bool drop_last = false);

  // Changes the permutation of later indices() calls (call it at the start of
  // every epoch) and resets the position to 0.
  void set_epoch(std::uint64_t epoch);
  std::uint64_t epoch() const { return epoch_; }

  // Continues the current epoch after its first `consumed` entries (see the
  // header comment). Throws InvalidArgument when consumed > dataset_size() (a
  // run that read into the padding has finished its epoch: pass at most
  // dataset_size()).
  void set_position(std::size_t consumed);
  std::size_t position() const { return position_; }

  // This rank's indices for the current epoch; size() of them.
  std::vector<std::int64_t> indices() const;

  // Samples per rank (len(sampler) in Python) and in total over all ranks, of
  // the remainder after position().
  std::size_t size() const { return num_samples_; }
  std::size_t total_size() const { return total_size_; }

  std::size_t dataset_size() const { return dataset_size_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }

 private:
  std::size_t dataset_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_last_;
  std::uint64_t epoch_ = 0;
  std::size_t position_ = 0;
  std::size_t num_samples_ = 0;
  std::size_t total_size_ = 0;

  void update_sizes();
};

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU.
std::vector<std::int64_t> torch_randperm(std::int64_t n, std::uint64_t seed);

}  // namespace ddp
