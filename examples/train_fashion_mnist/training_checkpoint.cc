#include "training_checkpoint.h"

#include <cstdio>

#include "ddp/common/error.h"

namespace ddp::examples {

void resume_from_checkpoint(Training& t) {
  const Flags& flags = t.flags;
  if (flags.checkpoint.empty()) return;
  if (t.lead()) {  // rank 0 is the only writer: what a dead writer left is its to remove
    for (const auto& removed : remove_stale_temporaries(flags.checkpoint)) {
      std::printf("removed %s (left by a checkpoint writer that died mid-save)\n", removed.c_str());
    }
  }
  const auto ckpt = load_checkpoint(flags.checkpoint);
  if (!ckpt) return;
  if (ckpt->settings.empty()) {
    if (t.lead())
      std::printf("checkpoint %s records no settings (an older version wrote it): not checked\n",
                  flags.checkpoint.c_str());
  } else if (const auto mismatch = settings_mismatch(ckpt->settings, t.settings)) {
    throw InvalidArgument("--checkpoint", flags.checkpoint +
                                              " was written by a run with other settings (" +
                                              *mismatch +
                                              "); resuming would not continue that run: "
                                              "use the settings it was written with, or another "
                                              "checkpoint file to start afresh");
  }
  Mlp& model = t.model;
  if (ckpt->tensors.size() != 2 * model.num_params()) {
    throw InvalidArgument("--checkpoint", flags.checkpoint + " was written for a different model");
  }
  for (std::size_t i = 0; i < model.num_params(); ++i) {
    if (ckpt->tensors[i].size() != model.value(i).size()) {
      throw InvalidArgument("--checkpoint",
                            flags.checkpoint + " was written for a different model");
    }
    model.value(i) = ckpt->tensors[i];
    model.momentum(i) = ckpt->tensors[model.num_params() + i];
  }
  t.progress.epoch = static_cast<std::int64_t>(ckpt->epoch);
  t.progress.global_step = static_cast<std::int64_t>(ckpt->global_step);
  // `step` counts steps of `world_size` ranks: the position holds for any world size.
  t.progress.position = static_cast<std::int64_t>(ckpt->step * t.per_step * ckpt->world_size);
  if (t.progress.position > static_cast<std::int64_t>(t.train.size)) {
    throw InvalidArgument("--checkpoint", flags.checkpoint + " is past the training set");
  }
  if (t.lead()) {
    std::printf("resumed from checkpoint %s at epoch %llu step %llu (global step %llu)\n",
                flags.checkpoint.c_str(), static_cast<unsigned long long>(ckpt->epoch + 1),
                static_cast<unsigned long long>(ckpt->step),
                static_cast<unsigned long long>(ckpt->global_step));
  }
}

bool checkpoint_due(const Training& t, bool epoch_done, bool stopping) {
  const Flags& flags = t.flags;
  return !flags.checkpoint.empty() &&
         ((flags.checkpoint_every > 0 && t.progress.global_step % flags.checkpoint_every == 0) ||
          epoch_done || stopping);
}

void save_training_checkpoint(const Training& t, bool epoch_done, std::size_t global_batch,
                              int world) {
  if (!t.lead()) return;
  const Progress& at = t.progress;
  Checkpoint c;
  c.epoch = static_cast<std::uint64_t>(epoch_done ? at.epoch + 1 : at.epoch);
  // Steps of `world_size` ranks: whole steps of this world when the
  // position is one, else steps of one rank (after a world change).
  const auto done = static_cast<std::uint64_t>(epoch_done ? 0 : at.position);
  const bool whole = done % global_batch == 0;
  c.step = whole ? done / global_batch : done / t.per_step;
  c.world_size = whole ? static_cast<std::uint64_t>(world) : 1;
  c.global_step = static_cast<std::uint64_t>(at.global_step);
  c.settings = t.settings;
  for (std::size_t i = 0; i < t.model.num_params(); ++i) c.tensors.push_back(t.model.value(i));
  for (std::size_t i = 0; i < t.model.num_params(); ++i) c.tensors.push_back(t.model.momentum(i));
  save_checkpoint(t.flags.checkpoint, c);
}

}  // namespace ddp::examples
