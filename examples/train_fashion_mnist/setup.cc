#include "setup.h"

#include <time.h>
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <sstream>

#include "ddp/common/env.h"
#include "ddp/common/error.h"
#include "ddp/store/memory_store.h"
#include "ddp/worker/init.h"

namespace ddp::examples {
namespace {

// Joins the default process group: the launcher's when there is one, else a
// world of one over an in-process store.
std::shared_ptr<ProcessGroup> start_process_group(const Flags& flags) {
  const bool launched = env::get("RANK").has_value() || env::get("DDP_STORE_ADDR").has_value();
  InitOptions init;
  if (!launched) {  // alone: a world of one over an in-process store
    init.rank = 0;
    init.world_size = 1;
    init.store = std::make_shared<MemoryStore>();
  }
  // Under ddprun a change of membership keeps this process and its state
  // (ddp/worker/recovery.h); --no-recover-in-place leaves it to restarts.
  init.recover_in_place = !flags.no_recover_in_place;
  init_process_group(init);
  return default_group();
}

std::vector<int> parse_layers(const std::string& hidden, int in, int out) {
  std::vector<int> layers = {in};
  std::stringstream ss(hidden);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const auto v = env::parse_int(item, "--hidden");
    if (v <= 0 || v > 65536) throw InvalidArgument("--hidden", "layer width out of range: " + item);
    layers.push_back(static_cast<int>(v));
  }
  layers.push_back(out);
  return layers;
}

// Rank 0's initialization wins anyway (the replica state is synchronized at start).
std::uint64_t model_seed(std::uint64_t seed, int rank) {
  return rank == 0 ? seed + 1 : seed + 1000 + static_cast<std::uint64_t>(rank);
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
  add(data.pixels.data(), data.pixels.size());
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

}  // namespace

Training::Training(const Flags& flags)
    : flags(flags), pg(start_process_group(flags)),
      train(load_fashion_mnist(flags.data_dir, "train", flags.train_limit)),
      test(load_fashion_mnist(flags.data_dir, "t10k", flags.test_limit)),
      layers(parse_layers(flags.hidden, static_cast<int>(train.features), 10)),
      model(layers, model_seed(flags.seed, pg->rank())),
      settings(flags.checkpoint.empty() ? Settings{} : run_settings(flags, layers, train)),
      micro(std::max(flags.accumulate, 1)),
      per_step(static_cast<std::size_t>(flags.batch_size) * static_cast<std::size_t>(micro)) {}

void Training::refresh_grads() {
  if (!flags.grad_as_bucket_view) return;
  for (std::size_t i = 0; i < model.num_params(); ++i)
    model.grad(i) = static_cast<float*>(ddp->grad(i).data);
}

void wrap_in_ddp(Training& t) {
  DdpOptions options;
  options.reducer.bucket_cap_bytes = static_cast<std::size_t>(t.flags.bucket_cap_mb * kMiB);
  options.reducer.first_bucket_cap_bytes = static_cast<std::size_t>(t.flags.first_bucket_mb * kMiB);
  options.reducer.comm_hook = make_comm_hook(t.flags.comm_hook);
  options.reducer.gradient_as_bucket_view = t.flags.grad_as_bucket_view;
  // The buckets keep the layout they get here, for the whole run. Rebuilding them
  // in the observed ready order after the first step would give a resumed
  // process another layout than the uninterrupted run had at the same step, and
  // Gloo's ring all-reduce (TCP, 3 or more ranks) sums each element in an order
  // that depends on its position in the bucket: the resumed run would differ in
  // the last bits. One bucket layout for every step keeps resumes bit-identical.
  options.reducer.rebuild_buckets = false;
  // The replica state carries the parameters to every rank.
  options.broadcast_parameters = false;
  options.broadcast_buffers = false;
  std::vector<Parameter> params;
  for (std::size_t i = 0; i < t.model.num_params(); ++i) {
    params.push_back({t.model.name(i), t.model.shape(i), Buffer::of(t.model.value(i)),
                      Buffer::of(t.model.own_grad(i).data(), t.model.own_grad(i).size())});
  }
  t.ddp =
      std::make_unique<DistributedDataParallel>(t.pg, params, std::vector<ModuleBuffer>{}, options);
  t.refresh_grads();
}

std::uint64_t schedule_length(const Training& t) {
  const std::size_t global_batch = t.per_step * static_cast<std::size_t>(t.pg->size());
  const auto steps = static_cast<std::uint64_t>(t.flags.epochs) * (t.train.size / global_batch);
  if (steps == 0) {
    throw InvalidArgument("--batch-size", "larger than this rank's share of the training set");
  }
  return steps;
}

double monotonic_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace ddp::examples
