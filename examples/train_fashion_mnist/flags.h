// The demo's command line: every flag with its default (add_flags() declares
// them to CLI11 with their help texts).
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace ddp::examples {

struct Flags {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 3;
  int batch_size = 64;
  float lr = 0.05f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  std::string hidden = "256,128";
  std::uint64_t seed = 0;
  std::size_t train_limit = 0;
  std::size_t test_limit = 0;
  std::string checkpoint;
  int checkpoint_every = 200;
  int log_every = 50;
  double bucket_cap_mb = 25;
  double first_bucket_mb = 1;
  std::string comm_hook = "allreduce";
  bool grad_as_bucket_view = false;
  int accumulate = 1;
  std::int64_t max_steps = 0;
  int throttle_ms = 0;
  bool no_recover_in_place = false;
  bool step_times = false;
};

// Declares every flag of `flags` to `app`, which writes the parsed values there.
void add_flags(CLI::App& app, Flags& flags);

}  // namespace ddp::examples
