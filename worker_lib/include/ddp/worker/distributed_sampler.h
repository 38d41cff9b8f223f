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

  // Changes the permutation of later indices() calls (call it at the start of every epoch).
  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }
  std::uint64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch; size() of them.
  std::vector<std::int64_t> indices() const;

  // Samples per rank (len(sampler) in Python) and in total over all ranks.
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
  std::size_t num_samples_;
  std::size_t total_size_;
};

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU.
std::vector<std::int64_t> torch_randperm(std::int64_t n, std::uint64_t seed);

}  // namespace ddp
