// Training checkpoints: parameters, optimizer state and the sampler position.
// save_checkpoint() is atomic: it writes <path>.tmp.<pid>, fsyncs it, renames it
// over <path> and fsyncs the directory, so a crash leaves the old or the new
// checkpoint, never a torn one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::examples {

struct Checkpoint {
  std::uint64_t epoch = 0;        // the epoch to continue
  std::uint64_t step = 0;         // steps of that epoch already done
  std::uint64_t global_step = 0;
  std::uint64_t world_size = 0;   // the sampler position is only valid for the same world size
  std::vector<std::vector<float>> tensors;  // parameters, then momentum buffers
};

// Throws std::runtime_error naming the path on an I/O error.
void save_checkpoint(const std::string& path, const Checkpoint& ckpt);
// nullopt when the file does not exist; throws std::runtime_error when it is corrupt.
std::optional<Checkpoint> load_checkpoint(const std::string& path);

}  // namespace ddp::examples
