#include "epoch_loop.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/worker/distributed_sampler.h"
#include "in_place_recovery.h"
#include "training_checkpoint.h"

namespace ddp::examples {
namespace {

using Clock = std::chrono::steady_clock;

// The loop's state across epochs and re-forms.
struct Loop {
  Loop(Training& training, std::uint64_t schedule_steps)
      : t(training), total_steps(schedule_steps),
        xb(static_cast<std::size_t>(training.flags.batch_size) * training.train.features),
        yb(static_cast<std::size_t>(training.flags.batch_size)) {}

  Training& t;
  const std::uint64_t total_steps;
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  std::vector<float> xb;         // a micro-batch's images
  std::vector<std::uint8_t> yb;  // and labels
  bool stop = false;             // --max-steps reached
  RunTotals totals;
};

// What this round trains of the epoch: this rank's share of what is left of it.
struct Shard {
  int world = 0;
  std::vector<std::int64_t> indices;  // this rank's samples, in order
  std::size_t global_batch = 0;       // samples all ranks train in one step
  std::size_t steps_per_epoch = 0;    // of a whole epoch in this world
};

// The progress lines' window: samples and a smoothed loss since the last line.
struct Window {
  Clock::time_point start = Clock::now();
  std::size_t samples = 0;
  double loss_avg = 0;
  bool first = true;
};

Shard shard_of_epoch(const Training& t) {
  Shard s;
  s.world = t.pg->size();
  DistributedSampler sampler(t.train.size, s.world, t.pg->rank(), /*shuffle=*/true, t.flags.seed);
  sampler.set_epoch(static_cast<std::uint64_t>(t.progress.epoch));
  sampler.set_position(static_cast<std::size_t>(t.progress.position));
  s.indices = sampler.indices();
  s.global_batch = t.per_step * static_cast<std::size_t>(s.world);
  s.steps_per_epoch = t.train.size / s.global_batch;
  if (s.steps_per_epoch == 0) {
    throw InvalidArgument("--batch-size", "larger than this rank's share of the training set");
  }
  return s;
}

// Correct predictions and samples of this rank's contiguous shard of `test`,
// summed over all ranks.
double evaluate(Mlp& model, const Dataset& test, ProcessGroup& pg) {
  const std::size_t begin =
      test.size * static_cast<std::size_t>(pg.rank()) / static_cast<std::size_t>(pg.size());
  const std::size_t end =
      test.size * static_cast<std::size_t>(pg.rank() + 1) / static_cast<std::size_t>(pg.size());
  std::vector<std::int64_t> counts = {0, static_cast<std::int64_t>(end - begin)};
  std::vector<float> logits;
  constexpr std::size_t kChunk = 500;
  std::vector<float> inputs(kChunk * test.features);
  for (std::size_t s = begin; s < end; s += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, end - s));
    test.normalized(s, static_cast<std::size_t>(n), inputs.data());
    model.forward(inputs.data(), n, logits);
    for (int k = 0; k < n; ++k) {
      const float* z = &logits[static_cast<std::size_t>(k) * 10];
      const auto pred = std::max_element(z, z + 10) - z;
      if (pred == test.labels[s + static_cast<std::size_t>(k)]) ++counts[0];
    }
  }
  pg.allreduce(Buffer::of(counts), ReduceOp::kSum)->wait();
  return counts[1] > 0 ? 100.0 * static_cast<double>(counts[0]) / static_cast<double>(counts[1])
                       : 0.0;
}

// Forward and backward of the step's micro-batches, the last one synchronized
// by DDP (the others under no_sync); returns the step's loss.
float forward_backward(Loop& l, const Shard& shard, std::size_t k) {
  Training& t = l.t;
  const int batch = t.flags.batch_size;
  float loss = 0;
  for (int m = 0; m < t.micro; ++m) {
    const std::size_t base = k * t.per_step + static_cast<std::size_t>(m) * batch;
    for (int s = 0; s < batch; ++s) {
      const auto idx = static_cast<std::size_t>(shard.indices[base + static_cast<std::size_t>(s)]);
      t.train.normalized(idx, 1, &l.xb[static_cast<std::size_t>(s) * t.train.features]);
      l.yb[static_cast<std::size_t>(s)] = t.train.labels[idx];
    }
    auto one = [&] {
      t.ddp->begin_forward();
      loss += t.model.forward_loss(l.xb.data(), l.yb.data(), batch) / static_cast<float>(t.micro);
      t.ddp->begin_backward();
      t.model.backward(1.0f / static_cast<float>(t.micro),
                       [&](std::size_t i) { t.ddp->grad_ready(i); });
      t.ddp->finalize();
    };
    if (m + 1 < t.micro) {
      auto guard = t.ddp->no_sync();
      one();
    } else {
      one();
    }
  }
  return loss;
}

// The optimizer step after the gradients are averaged, and where training stands after it.
void optimizer_step(Loop& l, const Shard& shard) {
  Training& t = l.t;
  t.refresh_grads();
  // Cosine decay of the learning rate over the whole run (a function of the
  // global step, so a resumed run follows the same schedule).
  const double progress =
      static_cast<double>(t.progress.global_step) / static_cast<double>(l.total_steps);
  const auto lr = static_cast<float>(t.flags.lr * 0.5 *
                                     (1.0 + std::cos(3.141592653589793 * std::min(progress, 1.0))));
  t.model.sgd_step(lr, t.flags.momentum, t.flags.weight_decay);
  ++t.progress.global_step;
  t.progress.position += static_cast<std::int64_t>(shard.global_batch);
  if (t.flags.step_times) {
    std::printf("step-time rank=%d world=%d global_step=%lld t=%.6f\n", t.pg->rank(), shard.world,
                static_cast<long long>(t.progress.global_step), monotonic_seconds());
    std::fflush(stdout);
  }
}

void add_step_stats(Loop& l) {
  const ReducerStats st = l.t.ddp->stats().reducer;
  l.totals.comm_ms += st.comm_ms;
  l.totals.exposed_comm_ms += st.exposed_comm_ms;
  l.totals.backward_ms += st.backward_ms;
  ++l.totals.steps;
}

// Rank 0's progress line, every --log-every steps and at the end of the epoch.
void log_progress(const Loop& l, const Shard& shard, Window& w, bool epoch_done) {
  const Training& t = l.t;
  const Progress& at = t.progress;
  if (!t.lead() || !(at.global_step % std::max(t.flags.log_every, 1) == 0 || epoch_done)) return;
  const double secs = std::chrono::duration<double>(Clock::now() - w.start).count();
  // The global step and the samples of the epoch trained: numbers that
  // go on across a change of world size (a step of the epoch, counted
  // in this world's global batches, would jump); then the world and
  // its steps an epoch.
  std::printf(
      "%sepoch %lld/%d step %lld loss %.4f %.0f samples/s (%lld/%zu samples, %.1f%%; "
      "world %d: %zu steps an epoch)%s",
      l.tty ? "\r" : "", static_cast<long long>(at.epoch + 1), t.flags.epochs,
      static_cast<long long>(at.global_step), w.loss_avg,
      secs > 0 ? static_cast<double>(w.samples) / secs : 0.0, static_cast<long long>(at.position),
      t.train.size, 100.0 * static_cast<double>(at.position) / static_cast<double>(t.train.size),
      shard.world, shard.steps_per_epoch, l.tty ? "" : "\n");
  std::fflush(stdout);
  w.start = Clock::now();
  w.samples = 0;
}

// The steps of what is left of the epoch in this round, each followed by its
// progress line and checkpoint when due; stops early at --max-steps.
void train_rest_of_epoch(Loop& l) {
  Training& t = l.t;
  const Shard shard = shard_of_epoch(t);
  Window w;
  for (std::size_t k = 0;
       (static_cast<std::size_t>(t.progress.position) + shard.global_batch) <= t.train.size; ++k) {
    const float loss = forward_backward(l, shard, k);
    optimizer_step(l, shard);
    add_step_stats(l);
    w.samples += shard.global_batch;
    w.loss_avg = w.first ? loss : 0.9 * w.loss_avg + 0.1 * loss;
    w.first = false;
    if (t.flags.throttle_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(t.flags.throttle_ms));

    const bool epoch_done =
        static_cast<std::size_t>(t.progress.position) + shard.global_batch > t.train.size;
    log_progress(l, shard, w, epoch_done);
    if (t.flags.max_steps > 0 && t.progress.global_step >= t.flags.max_steps) l.stop = true;
    if (checkpoint_due(t, epoch_done, l.stop)) {
      save_training_checkpoint(t, epoch_done, shard.global_batch, shard.world);
    }
    if (l.stop) break;
  }
}

// The test after an epoch (or after the last step, at --max-steps).
void test_epoch(Loop& l) {
  Training& t = l.t;
  l.totals.accuracy = evaluate(t.model, t.test, *t.pg);
  if (t.lead()) {
    std::printf("%sepoch %lld/%d: test accuracy %.2f%% (%.1f s elapsed)\n", l.tty ? "\n" : "",
                static_cast<long long>(t.progress.epoch + 1), t.flags.epochs, l.totals.accuracy,
                std::chrono::duration<double>(Clock::now() - l.totals.started).count());
    std::fflush(stdout);
  }
}

}  // namespace

void announce_training(const Training& t) {
  if (!t.lead()) return;
  std::printf(
      "training %s on %zu samples (%d ranks x batch %d x %d micro-batches, %zu steps/epoch), "
      "comm hook %s\n",
      t.flags.hidden.c_str(), t.train.size, t.pg->size(), t.flags.batch_size, t.micro,
      t.train.size / (t.per_step * static_cast<std::size_t>(t.pg->size())),
      t.flags.comm_hook.c_str());
  std::fflush(stdout);
}

RunTotals train_epochs(Training& t, std::uint64_t total_steps) {
  Loop l(t, total_steps);
  l.totals.started = Clock::now();
  while (t.progress.epoch < t.flags.epochs && !l.stop) {
    try {
      train_rest_of_epoch(l);
      test_epoch(l);
      if (!l.stop) {
        ++t.progress.epoch;
        t.progress.position = 0;
      }
    } catch (const GroupChanged& e) {
      recover_in_place(t, e.what());
    }
  }
  if (l.totals.steps == 0) l.totals.accuracy = evaluate(t.model, t.test, *t.pg);  // nothing left
  return l.totals;
}

// When most of the all-reduce was exposed, one line on why: in this MLP the
// last bucket holds the first layer's gradients, which the backward pass
// computes last, so its all-reduce cannot start before backward ends; when that
// bucket is most of the gradients (the demo's 784x256 first layer is 0.77 of
// its 0.90 MiB), most of the all-reduce cannot be hidden.
void explain_exposed(const Training& t, const RunTotals& totals) {
  if (!t.ddp || totals.comm_ms <= 0 || totals.exposed_comm_ms < 0.5 * totals.comm_ms) return;
  const auto buckets = t.ddp->reducer().bucket_assignment();
  if (buckets.empty()) return;
  std::size_t all = 0, last = 0;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    for (std::size_t i : buckets[b]) {
      const std::size_t n = t.ddp->parameter(i).value.nbytes();
      all += n;
      if (b + 1 == buckets.size()) last += n;
    }
  }
  // Even a perfect overlap hides at most the backward pass's length.
  const double steps = static_cast<double>(std::max<std::uint64_t>(totals.steps, 1));
  const double backward = totals.backward_ms / steps, comm = totals.comm_ms / steps;
  std::string shorter;
  if (backward < comm) {
    char text[96];
    std::snprintf(text, sizeof text, ", and backward (%.2f ms) is shorter than the all-reduce",
                  backward);
    shorter = text;
  }
  std::printf(
      "ddp: why exposed: the last of %zu bucket(s) holds the first layer's gradients, which "
      "backward computes last, so its all-reduce cannot start before backward ends; it is %.2f "
      "of the %.2f MiB of gradients%s\n",
      buckets.size(), static_cast<double>(last) / static_cast<double>(kMiB),
      static_cast<double>(all) / static_cast<double>(kMiB), shorter.c_str());
}

void report_run(const Training& t, const RunTotals& totals) {
  if (!t.lead()) return;
  const auto steps = static_cast<double>(totals.steps);
  if (totals.steps > 0) {
    std::printf(
        "ddp: %llu steps, mean backward %.2f ms, all-reduce %.2f ms of which exposed %.2f ms "
        "(%.0f%% overlapped)\n",
        static_cast<unsigned long long>(totals.steps), totals.backward_ms / steps,
        totals.comm_ms / steps, totals.exposed_comm_ms / steps,
        totals.comm_ms > 0 ? 100.0 * std::max(0.0, 1.0 - totals.exposed_comm_ms / totals.comm_ms)
                           : 0.0);
    explain_exposed(t, totals);
  }
  std::printf("final test accuracy: %.2f%% (%.1f s)\n", totals.accuracy,
              std::chrono::duration<double>(Clock::now() - totals.started).count());
  std::fflush(stdout);
}

}  // namespace ddp::examples
