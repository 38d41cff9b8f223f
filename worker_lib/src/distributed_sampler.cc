#include "ddp/worker/distributed_sampler.h"

#include <random>

#include <fmt/format.h>

#include "ddp/common/error.h"

namespace ddp {

std::vector<std::int64_t> torch_randperm(std::int64_t n, std::uint64_t seed) {
  if (n < 0) throw InvalidArgument("torch_randperm", fmt::format("n = {} must be >= 0", n));
  std::vector<std::int64_t> result(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) result[static_cast<std::size_t>(i)] = i;
  // torch's CPUGeneratorImpl: mt19937 seeded with the low 32 bits of the seed;
  // random() is one 32-bit draw, random64() two draws (high word first).
  std::mt19937 engine(static_cast<std::uint32_t>(seed));
  // torch keeps the 32-bit draw for n below uint32 max / 20 ("preserve old behavior").
  const bool small = n < static_cast<std::int64_t>(std::numeric_limits<std::uint32_t>::max() / 20);
  for (std::int64_t i = 0; i + 1 < n; ++i) {
    std::uint64_t draw;
    if (small) {
      draw = engine();
    } else {
      std::uint64_t hi = engine();
      std::uint64_t lo = engine();
      draw = (hi << 32) | lo;
    }
    auto z = static_cast<std::int64_t>(draw % static_cast<std::uint64_t>(n - i));
    std::swap(result[static_cast<std::size_t>(i)], result[static_cast<std::size_t>(z + i)]);
  }
  return result;
}

DistributedSampler::DistributedSampler(std::size_t dataset_size, int num_replicas, int rank,
                                       bool shuffle, std::uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), shuffle_(shuffle),
      seed_(seed), drop_last_(drop_last) {
  if (num_replicas < 1) {
    throw InvalidArgument("DistributedSampler",
                          fmt::format("num_replicas = {} must be >= 1", num_replicas));
  }
  if (rank < 0 || rank >= num_replicas) {
    throw InvalidArgument("DistributedSampler",
                          fmt::format("rank {} is outside [0, {}]", rank, num_replicas - 1));
  }
  update_sizes();
}

void DistributedSampler::update_sizes() {
  // torch's split of a dataset of `remaining` entries.
  const std::size_t remaining = dataset_size_ - position_;
  const auto replicas = static_cast<std::size_t>(num_replicas_);
  if (drop_last_ && remaining % replicas != 0) {
    // Python: math.ceil((len - num_replicas) / num_replicas), with true division.
    num_samples_ = remaining < replicas ? 0 : (remaining - replicas + replicas - 1) / replicas;
  } else {
    num_samples_ = (remaining + replicas - 1) / replicas;
  }
  total_size_ = num_samples_ * replicas;
}

void DistributedSampler::set_epoch(std::uint64_t epoch) {
  epoch_ = epoch;
  position_ = 0;
  update_sizes();
}

void DistributedSampler::set_position(std::size_t consumed) {
  if (consumed > dataset_size_) {
    throw InvalidArgument(
        "DistributedSampler",
        fmt::format("set_position({}): the data set has only {} samples", consumed, dataset_size_));
  }
  position_ = consumed;
  update_sizes();
}

std::vector<std::int64_t> DistributedSampler::indices() const {
  std::vector<std::int64_t> all;
  if (shuffle_) {
    all = torch_randperm(static_cast<std::int64_t>(dataset_size_), seed_ + epoch_);
  } else {
    all.resize(dataset_size_);
    for (std::size_t i = 0; i < dataset_size_; ++i) all[i] = static_cast<std::int64_t>(i);
  }
  all.erase(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(position_));
  if (!drop_last_) {
    // Pad by repeating the list from its start (several times when it is short).
    const std::size_t n = all.size();
    for (std::size_t i = 0; all.size() < total_size_ && n > 0; ++i) all.push_back(all[i % n]);
  } else {
    all.resize(total_size_);
  }
  std::vector<std::int64_t> mine;
  mine.reserve(num_samples_);
  for (std::size_t i = static_cast<std::size_t>(rank_); i < total_size_;
       i += static_cast<std::size_t>(num_replicas_)) {
    mine.push_back(all[i]);
  }
  return mine;
}

}  // namespace ddp
