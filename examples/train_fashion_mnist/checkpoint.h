// Training checkpoints: everything that decides the next training step, so that
// a run resumed from one continues bit for bit as if it had never stopped.
//
// What decides the next step of the demo, and where it is kept:
//   - the parameters and the SGD momentum buffers: `tensors`;
//   - which samples the step reads: the sampler's epoch and the steps of that
//     epoch already done (`epoch`, `step`), valid for one world size
//     (`world_size`); the sampler's order itself is a pure function of the
//     seed, the epoch, the world size and the training set;
//   - the learning rate: a function of `global_step` and the run's length;
//   - random draws: the demo draws only when it initializes the model, from
//     the seed, and never after, so the seed is all there is of RNG state;
//   - the settings all of the above depend on (seed, model, batch, learning
//     rate schedule, training set, ...): `settings`, compared by the caller
//     with its own before resuming (settings_mismatch()).
//
// save_checkpoint() is atomic: it writes <path>.tmp.<pid> under an exclusive
// flock(2), fsyncs it, renames it over <path> and fsyncs the directory, so a
// crash leaves the old or the new checkpoint, never a torn one. A writer killed
// mid-save leaves its temporary file behind; remove_stale_temporaries() removes
// those of writers that are gone (their lock died with them).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::examples {

// A name (a flag such as "--batch-size", or a derived quantity such as
// "training set") and its value as text; equal texts mean equal settings.
using Settings = std::map<std::string, std::string>;

struct Checkpoint {
  std::uint64_t epoch = 0;  // the epoch to continue
  std::uint64_t step = 0;   // steps of that epoch already done
  std::uint64_t global_step =
      0;                         // steps done in the whole run (the learning-rate schedule's input)
  std::uint64_t world_size = 0;  // the sampler position is only valid for the same world size
  // The settings the run was started with. Empty in a version 1 file, which
  // did not record them.
  Settings settings;
  std::vector<std::vector<float>> tensors;  // parameters, then momentum buffers
};

// Throws std::runtime_error naming the path on an I/O error.
void save_checkpoint(const std::string& path, const Checkpoint& ckpt);

// nullopt when the file does not exist; throws std::runtime_error naming the
// path when it is corrupt (bad magic, truncated, trailing bytes, absurd sizes).
// Reads version 1 files (no settings) and version 2 files.
std::optional<Checkpoint> load_checkpoint(const std::string& path);

// Removes the temporary files (<path>.tmp.<digits>) that writers of `path`
// left when they died mid-save: those whose flock nobody holds. A save in
// progress, in this process or another one, is never disturbed. Returns the
// paths removed; throws std::runtime_error when the directory cannot be read.
std::vector<std::string> remove_stale_temporaries(const std::string& path);

// The first setting that differs between `saved` (a checkpoint's) and
// `current` (this run's), as "NAME: the checkpoint has A, this run has B"
// ("(none)" for a setting one side lacks); nullopt when they are equal.
std::optional<std::string> settings_mismatch(const Settings& saved, const Settings& current);

}  // namespace ddp::examples
