// Fashion-MNIST MLP trained data-parallel with ddp: one process per rank
// (ddprun --nproc_per_node=N build/bin/train_fashion_mnist), the Gloo process
// group, DistributedDataParallel with bucketed all-reduce overlapped with the
// backward pass, and the DistributedSampler. Without a launcher's environment
// it trains alone (world size 1).
//
// Rank 0 prints a progress line (epoch, step, loss, samples/s) and the test
// accuracy after every epoch. With --checkpoint, rank 0 saves parameters,
// optimizer state, the sampler position, the step counter and the settings
// they depend on atomically; every rank loads the file at start, so a
// restarted run continues where it stopped, bit for bit (see checkpoint.h).
//
// Under ddprun it recovers in place (ddp/worker/recovery.h): when a node is
// lost or joins, or a worker elsewhere is restarted, this process keeps
// running, re-forms its group, and the replicas are made identical again
// from the lowest rank that survived (ddp::ReplicaState: parameters,
// momentum, epoch, sampler position, global step); a newcomer receives that
// state instead of training from a checkpoint. The sampler continues the
// epoch from the same global position with the new world size.
//
// --step-times (for bench/recovery): every rank also prints a line per
// completed step and one per state synchronization, each with the time
// (CLOCK_MONOTONIC, comparable only on this host):
//   step-time rank=R world=W global_step=G t=<s>
//   state-sync rank=R root=X received=0|1 live=0|1 bytes=N seconds=<s> t=<s>
#include <cblas.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>

#include "checkpoint.h"
#include "ddp/common/env.h"
#include "ddp/common/error.h"
#include "ddp/store/memory_store.h"
#include "ddp/worker/ddp.h"
#include "ddp/worker/distributed_sampler.h"
#include "ddp/worker/init.h"
#include "ddp/worker/recovery.h"
#include "ddp/worker/replica_state.h"
#include "fashion_mnist.h"
#include "mlp.h"

namespace {

using Clock = std::chrono::steady_clock;
using ddp::examples::Checkpoint;
using ddp::examples::Dataset;
using ddp::examples::Mlp;
using ddp::examples::Settings;

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

// CLOCK_MONOTONIC in seconds (--step-times).
double monotonic_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::vector<int> parse_layers(const std::string& hidden, int in, int out) {
  std::vector<int> layers = {in};
  std::stringstream ss(hidden);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const auto v = ddp::env::parse_int(item, "--hidden");
    if (v <= 0 || v > 65536)
      throw ddp::InvalidArgument("--hidden", "layer width out of range: " + item);
    layers.push_back(static_cast<int>(v));
  }
  layers.push_back(out);
  return layers;
}

// The shortest text that reads back as `v`: equal floats, equal texts.
std::string exact_text(float v) {
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, result.ptr);
}

// What identifies the training set: its size and a CRC-32 of its pixels and labels.
std::string fingerprint(const Dataset& data) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  auto add = [&crc](const void* bytes, std::size_t n) {
    const auto* p = static_cast<const Bytef*>(bytes);
    while (n > 0) {
      const auto chunk = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
      crc = ::crc32(crc, p, chunk);
      p += chunk;
      n -= chunk;
    }
  };
  add(data.images.data(), data.images.size() * sizeof(float));
  add(data.labels.data(), data.labels.size());
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08lx", static_cast<unsigned long>(crc));
  return std::to_string(data.size) + " samples, crc32 " + hex;
}

// Everything the trajectory of a run depends on besides the checkpoint's own
// state: a resume with other values would silently train something else. The
// world size is not here: a different one restarts the epoch (elastic runs).
// Left out on purpose: logging, checkpointing, --test-limit, --max-steps and
// --throttle-ms change nothing that is computed; the DDP bucket options change
// only how gradients are grouped for the all-reduce, which with Gloo's ring
// (TCP, 3 or more ranks) may change the last bits of the sums, not the run.
// A resume with the same flags is bit-identical; one with other bucket options
// continues the same run, possibly differing from it in the last bits.
Settings run_settings(const Flags& flags, const std::vector<int>& layers, const Dataset& train) {
  std::string widths;  // the hidden layers: the input and output widths are the data's
  for (std::size_t l = 1; l + 1 < layers.size(); ++l) {
    widths += (widths.empty() ? "" : ",") + std::to_string(layers[l]);
  }
  return {
      {"--seed", std::to_string(flags.seed)},
      {"--hidden", widths},
      {"--batch-size", std::to_string(flags.batch_size)},
      {"--accumulate", std::to_string(std::max(flags.accumulate, 1))},
      {"--epochs", std::to_string(flags.epochs)},
      {"--lr", exact_text(flags.lr)},
      {"--momentum", exact_text(flags.momentum)},
      {"--weight-decay", exact_text(flags.weight_decay)},
      {"--comm-hook", flags.comm_hook},
      {"training set", fingerprint(train)},
  };
}

// Correct predictions and samples of this rank's contiguous shard of `test`,
// summed over all ranks.
double evaluate(Mlp& model, const Dataset& test, ddp::ProcessGroup& pg) {
  const std::size_t begin =
      test.size * static_cast<std::size_t>(pg.rank()) / static_cast<std::size_t>(pg.size());
  const std::size_t end =
      test.size * static_cast<std::size_t>(pg.rank() + 1) / static_cast<std::size_t>(pg.size());
  std::vector<std::int64_t> counts = {0, static_cast<std::int64_t>(end - begin)};
  std::vector<float> logits;
  constexpr std::size_t kChunk = 500;
  for (std::size_t s = begin; s < end; s += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, end - s));
    model.forward(&test.images[s * test.features], n, logits);
    for (int k = 0; k < n; ++k) {
      const float* z = &logits[static_cast<std::size_t>(k) * 10];
      const auto pred = std::max_element(z, z + 10) - z;
      if (pred == test.labels[s + static_cast<std::size_t>(k)]) ++counts[0];
    }
  }
  pg.allreduce(ddp::Buffer::of(counts), ddp::ReduceOp::kSum)->wait();
  return counts[1] > 0 ? 100.0 * static_cast<double>(counts[0]) / static_cast<double>(counts[1])
                       : 0.0;
}

int run(const Flags& flags) {
  // One BLAS thread per rank: the ranks already occupy the cores.
  openblas_set_num_threads(1);

  const bool launched =
      ddp::env::get("RANK").has_value() || ddp::env::get("DDP_STORE_ADDR").has_value();
  ddp::InitOptions init;
  if (!launched) {  // alone: a world of one over an in-process store
    init.rank = 0;
    init.world_size = 1;
    init.store = std::make_shared<ddp::MemoryStore>();
  }
  // Under ddprun a change of membership keeps this process and its state
  // (ddp/worker/recovery.h); --no-recover-in-place leaves it to restarts.
  init.recover_in_place = !flags.no_recover_in_place;
  ddp::init_process_group(init);
  auto pg = ddp::default_group();
  auto lead = [&] { return pg->rank() == 0; };

  const Dataset train =
      ddp::examples::load_fashion_mnist(flags.data_dir, "train", flags.train_limit);
  const Dataset test = ddp::examples::load_fashion_mnist(flags.data_dir, "t10k", flags.test_limit);

  // Rank 0's initialization wins anyway (the replica state is synchronized below).
  const std::vector<int> layers = parse_layers(flags.hidden, static_cast<int>(train.features), 10);
  const int first_rank = pg->rank();
  Mlp model(layers, first_rank == 0 ? flags.seed + 1
                                    : flags.seed + 1000 + static_cast<std::uint64_t>(first_rank));
  // Only a checkpoint needs them (the fingerprint reads the whole training set: ~0.1 s for all of it).
  const Settings settings =
      flags.checkpoint.empty() ? Settings{} : run_settings(flags, layers, train);
  const int micro = std::max(flags.accumulate, 1);
  const std::size_t per_step = static_cast<std::size_t>(flags.batch_size) * micro;

  // Where training stands: the epoch, the samples of it already trained (by
  // all ranks together: a position valid for any world size) and the steps
  // of the whole run. With the parameters and the momentum they are the
  // replica's state: a checkpoint, or after a re-form a live peer, says where
  // to continue.
  std::int64_t epoch = 0;
  std::int64_t position = 0;
  std::int64_t global_step = 0;
  if (!flags.checkpoint.empty()) {
    if (lead()) {  // rank 0 is the only writer: what a dead writer left is its to remove
      for (const auto& removed : ddp::examples::remove_stale_temporaries(flags.checkpoint)) {
        std::printf("removed %s (left by a checkpoint writer that died mid-save)\n",
                    removed.c_str());
      }
    }
    if (auto ckpt = ddp::examples::load_checkpoint(flags.checkpoint)) {
      if (ckpt->settings.empty()) {
        if (lead())
          std::printf(
              "checkpoint %s records no settings (an older version wrote it): not checked\n",
              flags.checkpoint.c_str());
      } else if (const auto mismatch = ddp::examples::settings_mismatch(ckpt->settings, settings)) {
        throw ddp::InvalidArgument(
            "--checkpoint", flags.checkpoint + " was written by a run with other settings (" +
                                *mismatch +
                                "); resuming would not continue that run: "
                                "use the settings it was written with, or another "
                                "checkpoint file to start afresh");
      }
      if (ckpt->tensors.size() != 2 * model.num_params()) {
        throw ddp::InvalidArgument("--checkpoint",
                                   flags.checkpoint + " was written for a different model");
      }
      for (std::size_t i = 0; i < model.num_params(); ++i) {
        if (ckpt->tensors[i].size() != model.value(i).size()) {
          throw ddp::InvalidArgument("--checkpoint",
                                     flags.checkpoint + " was written for a different model");
        }
        model.value(i) = ckpt->tensors[i];
        model.momentum(i) = ckpt->tensors[model.num_params() + i];
      }
      epoch = static_cast<std::int64_t>(ckpt->epoch);
      global_step = static_cast<std::int64_t>(ckpt->global_step);
      // `step` counts steps of `world_size` ranks: the position holds for any world size.
      position = static_cast<std::int64_t>(ckpt->step * per_step * ckpt->world_size);
      if (position > static_cast<std::int64_t>(train.size)) {
        throw ddp::InvalidArgument("--checkpoint", flags.checkpoint + " is past the training set");
      }
      if (lead()) {
        std::printf("resumed from checkpoint %s at epoch %llu step %llu (global step %llu)\n",
                    flags.checkpoint.c_str(), static_cast<unsigned long long>(ckpt->epoch + 1),
                    static_cast<unsigned long long>(ckpt->step),
                    static_cast<unsigned long long>(ckpt->global_step));
      }
    }
  }

  ddp::DdpOptions options;
  options.reducer.bucket_cap_bytes = static_cast<std::size_t>(flags.bucket_cap_mb * ddp::kMiB);
  options.reducer.first_bucket_cap_bytes =
      static_cast<std::size_t>(flags.first_bucket_mb * ddp::kMiB);
  options.reducer.comm_hook = ddp::make_comm_hook(flags.comm_hook);
  options.reducer.gradient_as_bucket_view = flags.grad_as_bucket_view;
  // The buckets keep the layout they get here, for the whole run. Rebuilding them
  // in the observed ready order after the first step would give a resumed
  // process another layout than the uninterrupted run had at the same step, and
  // Gloo's ring all-reduce (TCP, 3 or more ranks) sums each element in an order
  // that depends on its position in the bucket: the resumed run would differ in
  // the last bits. One bucket layout for every step keeps resumes bit-identical.
  options.reducer.rebuild_buckets = false;
  // The replica state below carries the parameters to every rank.
  options.broadcast_parameters = false;
  options.broadcast_buffers = false;
  std::vector<ddp::Parameter> params;
  for (std::size_t i = 0; i < model.num_params(); ++i) {
    params.push_back({model.name(i), model.shape(i), ddp::Buffer::of(model.value(i)),
                      ddp::Buffer::of(model.own_grad(i).data(), model.own_grad(i).size())});
  }
  ddp::DistributedDataParallel ddp_model(pg, params, {}, options);
  auto refresh_grads = [&] {
    if (!flags.grad_as_bucket_view) return;
    for (std::size_t i = 0; i < model.num_params(); ++i)
      model.grad(i) = static_cast<float*>(ddp_model.grad(i).data);
  };
  refresh_grads();

  // What makes a replica: every rank holds the same, and a newcomer gets it
  // from a live peer (the optimizer state stays identical afterwards because
  // every rank applies the same averaged gradients).
  ddp::ReplicaState replica;
  for (std::size_t i = 0; i < model.num_params(); ++i) {
    replica.add(model.name(i), ddp::Buffer::of(model.value(i)));
  }
  for (std::size_t i = 0; i < model.num_params(); ++i) {
    replica.add(model.name(i) + ".momentum", ddp::Buffer::of(model.momentum(i)));
  }
  replica.add("epoch", &epoch);
  replica.add("position", &position);
  replica.add("global_step", &global_step);
  auto say_synced = [&](const ddp::SyncResult& got) {
    if (flags.step_times) {
      std::printf("state-sync rank=%d root=%d received=%d live=%d bytes=%zu seconds=%.6f t=%.6f\n",
                  pg->rank(), got.root, got.received ? 1 : 0, got.from_live ? 1 : 0, got.bytes,
                  got.seconds, monotonic_seconds());
      std::fflush(stdout);
    }
    if (!got.from_live) return;
    std::printf(
        "rank %d: %s the state of rank %d (%.2f MiB in %.3f s): epoch %lld, sample %lld, "
        "global step %lld\n",
        pg->rank(), got.received ? "received" : "kept", got.root,
        static_cast<double>(got.bytes) / ddp::kMiB, got.seconds, static_cast<long long>(epoch + 1),
        static_cast<long long>(position), static_cast<long long>(global_step));
    std::fflush(stdout);
  };
  say_synced(replica.sync(*pg));  // a newcomer to a running job receives it here

  // After a change of membership: the next round, a new group, the replicas
  // identical again. The step that was interrupted is not counted on any rank.
  auto recover = [&](const std::string& why) {
    for (;;) {
      try {
        const ddp::Reformed r = ddp::reform();
        pg = ddp::default_group();
        ddp_model.reform(pg);
        refresh_grads();
        model.zero_grad();  // what the interrupted step accumulated
        const auto got = replica.sync(*pg);
        if (lead()) {
          // The agent's reason, short; what the program caught says the same at more length.
          std::printf("re-formed in place (%s): round %d, %d ranks (was %d) in %.3f s\n",
                      r.why.empty() ? why.c_str() : r.why.c_str(), r.round, r.world_size,
                      r.previous_world_size, r.seconds);
        }
        say_synced(got);
        return;
      } catch (const ddp::GroupChanged&) {
        // Yet another change while re-forming: the round after it.
      }
    }
  };

  const std::uint64_t total_steps = [&] {
    // The learning-rate schedule's length: the uninterrupted run's steps.
    const std::size_t global_batch = per_step * static_cast<std::size_t>(pg->size());
    return static_cast<std::uint64_t>(flags.epochs) * (train.size / global_batch);
  }();
  if (total_steps == 0) {
    throw ddp::InvalidArgument("--batch-size", "larger than this rank's share of the training set");
  }
  if (lead()) {
    std::printf(
        "training %s on %zu samples (%d ranks x batch %d x %d micro-batches, %zu steps/epoch), "
        "comm hook %s\n",
        flags.hidden.c_str(), train.size, pg->size(), flags.batch_size, micro,
        train.size / (per_step * static_cast<std::size_t>(pg->size())), flags.comm_hook.c_str());
    std::fflush(stdout);
  }

  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  std::vector<float> xb(static_cast<std::size_t>(flags.batch_size) * train.features);
  std::vector<std::uint8_t> yb(static_cast<std::size_t>(flags.batch_size));
  double accuracy = 0;
  bool stop = false;
  const auto t_start = Clock::now();
  double comm_ms = 0, exposed_ms = 0, backward_ms = 0;
  std::uint64_t synced = 0;

  while (epoch < flags.epochs && !stop) {
    try {
      // This round's share of what is left of the epoch.
      const int world = pg->size();
      ddp::DistributedSampler sampler(train.size, world, pg->rank(), /*shuffle=*/true, flags.seed);
      sampler.set_epoch(static_cast<std::uint64_t>(epoch));
      sampler.set_position(static_cast<std::size_t>(position));
      const auto indices = sampler.indices();
      const std::size_t global_batch = per_step * static_cast<std::size_t>(world);
      const std::size_t steps_per_epoch = train.size / global_batch;
      if (steps_per_epoch == 0) {
        throw ddp::InvalidArgument("--batch-size",
                                   "larger than this rank's share of the training set");
      }
      auto t_window = Clock::now();
      std::size_t window_samples = 0;
      double loss_avg = 0;
      bool first = true;
      for (std::size_t k = 0; (static_cast<std::size_t>(position) + global_batch) <= train.size;
           ++k) {
        float loss = 0;
        for (int m = 0; m < micro; ++m) {
          const std::size_t base = k * per_step + static_cast<std::size_t>(m) * flags.batch_size;
          for (int s = 0; s < flags.batch_size; ++s) {
            const auto idx = static_cast<std::size_t>(indices[base + static_cast<std::size_t>(s)]);
            std::copy_n(&train.images[idx * train.features], train.features,
                        &xb[static_cast<std::size_t>(s) * train.features]);
            yb[static_cast<std::size_t>(s)] = train.labels[idx];
          }
          auto one = [&] {
            ddp_model.begin_forward();
            loss += model.forward_loss(xb.data(), yb.data(), flags.batch_size) /
                    static_cast<float>(micro);
            ddp_model.begin_backward();
            model.backward(1.0f / static_cast<float>(micro),
                           [&](std::size_t i) { ddp_model.grad_ready(i); });
            ddp_model.finalize();
          };
          if (m + 1 < micro) {
            auto guard = ddp_model.no_sync();
            one();
          } else {
            one();
          }
        }
        refresh_grads();
        // Cosine decay of the learning rate over the whole run (a function of the
        // global step, so a resumed run follows the same schedule).
        const double progress = static_cast<double>(global_step) / static_cast<double>(total_steps);
        const auto lr = static_cast<float>(
            flags.lr * 0.5 * (1.0 + std::cos(3.141592653589793 * std::min(progress, 1.0))));
        model.sgd_step(lr, flags.momentum, flags.weight_decay);
        ++global_step;
        position += static_cast<std::int64_t>(global_batch);
        if (flags.step_times) {
          std::printf("step-time rank=%d world=%d global_step=%lld t=%.6f\n", pg->rank(), world,
                      static_cast<long long>(global_step), monotonic_seconds());
          std::fflush(stdout);
        }
        const auto& st = ddp_model.stats().reducer;
        comm_ms += st.comm_ms;
        exposed_ms += st.exposed_comm_ms;
        backward_ms += st.backward_ms;
        ++synced;
        window_samples += global_batch;
        loss_avg = first ? loss : 0.9 * loss_avg + 0.1 * loss;
        first = false;
        if (flags.throttle_ms > 0)
          std::this_thread::sleep_for(std::chrono::milliseconds(flags.throttle_ms));

        const bool last = static_cast<std::size_t>(position) + global_batch > train.size;
        if (lead() && (global_step % std::max(flags.log_every, 1) == 0 || last)) {
          const double secs = std::chrono::duration<double>(Clock::now() - t_window).count();
          // The global step and the samples of the epoch trained: numbers that
          // go on across a change of world size (a step of the epoch, counted
          // in this world's global batches, would jump); then the world and
          // its steps an epoch.
          std::printf(
              "%sepoch %lld/%d step %lld loss %.4f %.0f samples/s (%lld/%zu samples, %.1f%%; "
              "world %d: %zu steps an epoch)%s",
              tty ? "\r" : "", static_cast<long long>(epoch + 1), flags.epochs,
              static_cast<long long>(global_step), loss_avg,
              secs > 0 ? static_cast<double>(window_samples) / secs : 0.0,
              static_cast<long long>(position), train.size,
              100.0 * static_cast<double>(position) / static_cast<double>(train.size), world,
              steps_per_epoch, tty ? "" : "\n");
          std::fflush(stdout);
          t_window = Clock::now();
          window_samples = 0;
        }
        if (flags.max_steps > 0 && global_step >= flags.max_steps) stop = true;
        const bool save_now =
            !flags.checkpoint.empty() &&
            ((flags.checkpoint_every > 0 && global_step % flags.checkpoint_every == 0) || last ||
             stop);
        if (lead() && save_now) {
          Checkpoint c;
          c.epoch = static_cast<std::uint64_t>(last ? epoch + 1 : epoch);
          // Steps of `world_size` ranks: whole steps of this world when the
          // position is one, else steps of one rank (after a world change).
          const auto done = static_cast<std::uint64_t>(last ? 0 : position);
          const bool whole = done % global_batch == 0;
          c.step = whole ? done / global_batch : done / per_step;
          c.world_size = whole ? static_cast<std::uint64_t>(world) : 1;
          c.global_step = static_cast<std::uint64_t>(global_step);
          c.settings = settings;
          for (std::size_t i = 0; i < model.num_params(); ++i) c.tensors.push_back(model.value(i));
          for (std::size_t i = 0; i < model.num_params(); ++i)
            c.tensors.push_back(model.momentum(i));
          ddp::examples::save_checkpoint(flags.checkpoint, c);
        }
        if (stop) break;
      }
      accuracy = evaluate(model, test, *pg);
      if (lead()) {
        std::printf("%sepoch %lld/%d: test accuracy %.2f%% (%.1f s elapsed)\n", tty ? "\n" : "",
                    static_cast<long long>(epoch + 1), flags.epochs, accuracy,
                    std::chrono::duration<double>(Clock::now() - t_start).count());
        std::fflush(stdout);
      }
      if (!stop) {
        ++epoch;
        position = 0;
      }
    } catch (const ddp::GroupChanged& e) {
      recover(e.what());
    }
  }
  if (synced == 0) accuracy = evaluate(model, test, *pg);  // nothing left to train
  if (lead()) {
    if (synced > 0) {
      std::printf(
          "ddp: %llu steps, mean backward %.2f ms, all-reduce %.2f ms of which exposed %.2f ms "
          "(%.0f%% overlapped)\n",
          static_cast<unsigned long long>(synced), backward_ms / synced, comm_ms / synced,
          exposed_ms / synced,
          comm_ms > 0 ? 100.0 * std::max(0.0, 1.0 - exposed_ms / comm_ms) : 0.0);
    }
    std::printf("final test accuracy: %.2f%% (%.1f s)\n", accuracy,
                std::chrono::duration<double>(Clock::now() - t_start).count());
    std::fflush(stdout);
  }
  ddp::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Fashion-MNIST MLP trained with ddp (DistributedDataParallel + DistributedSampler)"};
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
  CLI11_PARSE(app, argc, argv);
  try {
    return run(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_fashion_mnist: error: %s\n", e.what());
    return 1;
  }
}
