#include "flags.h"

namespace ddp::examples {

void add_flags(CLI::App& app, Flags& f) {
  app.add_option("--data-dir", f.data_dir, "folder with the gzip IDX files")->capture_default_str();
  app.add_option("--epochs", f.epochs, "epochs to train")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", f.batch_size, "samples per rank and step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", f.lr, "peak learning rate (cosine decay to 0 over the run)")
      ->capture_default_str();
  app.add_option("--momentum", f.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--weight-decay", f.weight_decay, "L2 penalty on weights")->capture_default_str();
  app.add_option("--hidden", f.hidden, "hidden layer widths, comma-separated")
      ->capture_default_str();
  app.add_option("--seed", f.seed, "initialization and shuffling seed")->capture_default_str();
  app.add_option("--train-limit", f.train_limit, "use only the first N training samples (0: all)")
      ->capture_default_str();
  app.add_option("--test-limit", f.test_limit, "use only the first N test samples (0: all)")
      ->capture_default_str();
  app.add_option("--checkpoint", f.checkpoint,
                 "checkpoint file: loaded at start when present, saved by rank 0");
  app.add_option("--checkpoint-every", f.checkpoint_every,
                 "save every N steps (and at each epoch end)")
      ->capture_default_str();
  app.add_option("--log-every", f.log_every, "progress line every N steps")->capture_default_str();
  app.add_option("--bucket-cap-mb", f.bucket_cap_mb, "DDP bucket cap in MiB")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--first-bucket-mb", f.first_bucket_mb, "DDP first bucket cap in MiB")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--comm-hook", f.comm_hook, "allreduce, fp16 or bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"allreduce", "fp16", "bf16"}));
  app.add_flag("--grad-as-bucket-view", f.grad_as_bucket_view, "gradients live in DDP's buckets");
  app.add_option("--accumulate", f.accumulate,
                 "micro-batches per step (all but the last under no_sync)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-steps", f.max_steps, "stop after N steps in total (0: no limit)")
      ->capture_default_str();
  app.add_option("--throttle-ms", f.throttle_ms,
                 "sleep after each step (to watch or interrupt a run)")
      ->capture_default_str();
  app.add_flag("--no-recover-in-place", f.no_recover_in_place,
               "under ddprun, be restarted when the membership changes instead of re-forming "
               "in place");
  app.add_flag("--step-times", f.step_times,
               "every rank prints a timestamped line per step and per state sync (benchmarks)");
}

}  // namespace ddp::examples
