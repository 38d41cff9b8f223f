// The demo's checkpoints (with --checkpoint): where a run resumes at start,
// and when and what rank 0 saves during the epoch loop. The file format and
// its atomic save are checkpoint.h's.
#pragma once

#include <cstddef>

#include "setup.h"

namespace ddp::examples {

// Before DDP is made: rank 0 removes what a checkpoint writer that died
// mid-save left, then every rank loads the checkpoint when there is one and
// sets the model, its momentum and `t.progress` from it, rank 0 saying so.
// Throws ddp::InvalidArgument when the checkpoint was written with other
// settings, for another model or past the training set, and
// std::runtime_error when it is corrupt. Does nothing without --checkpoint.
void resume_from_checkpoint(Training& t);

// Whether a checkpoint is written after the step that made `t.progress`:
// every --checkpoint-every steps, at the end of an epoch (`epoch_done`) and
// when the run stops early (`stopping`); never without --checkpoint.
bool checkpoint_due(const Training& t, bool epoch_done, bool stopping);

// Rank 0 saves where training stands after a step of `world` ranks training
// `global_batch` samples together (`epoch_done`: that step ended the epoch).
// Throws std::runtime_error naming the file on an I/O error.
void save_training_checkpoint(const Training& t, bool epoch_done, std::size_t global_batch,
                              int world);

}  // namespace ddp::examples
