// A small CNN on Fashion-MNIST with libtorch and ddp::torch::DistributedDataParallel:
// an ordinary libtorch training loop; the adapter all-reduces gradients bucket by
// bucket during loss.backward().
//
//   ddprun --standalone --nproc_per_node=2 build/bin/torch_fashion_mnist --epochs 1
#include <torch/torch.h>

#include <chrono>
#include <cstdio>

#include <CLI/CLI.hpp>

#include "ddp/common/env.h"
#include "ddp/store/memory_store.h"
#include "ddp/worker/distributed_sampler.h"
#include "ddp/worker/init.h"
#include "ddp/worker/torch/distributed_data_parallel.h"
#include "fashion_mnist.h"

namespace {

struct CnnImpl : torch::nn::Module {
  CnnImpl() {
    conv1 =
        register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)));
    conv2 =
        register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1)));
    fc1 = register_module("fc1", torch::nn::Linear(16 * 7 * 7, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Cnn);

struct Flags {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 1;
  int batch_size = 64;
  double lr = 0.05;
  std::size_t train_limit = 0;
  std::size_t test_limit = 0;
  std::string comm_hook = "allreduce";
  double bucket_cap_mb = 25;
  int log_every = 100;
};

int run(const Flags& flags) {
  torch::set_num_threads(1);
  ddp::InitOptions init;
  if (!ddp::env::get("RANK") && !ddp::env::get("DDP_STORE_ADDR")) {
    init.rank = 0;
    init.world_size = 1;
    init.store = std::make_shared<ddp::MemoryStore>();
  }
  ddp::init_process_group(init);
  auto pg = ddp::default_group();
  const bool lead = pg->rank() == 0;

  const auto train = ddp::examples::load_fashion_mnist(flags.data_dir, "train", flags.train_limit);
  const auto test = ddp::examples::load_fashion_mnist(flags.data_dir, "t10k", flags.test_limit);
  auto as_images = [](const ddp::examples::Dataset& d) {
    auto x = torch::empty({static_cast<long>(d.size), 1, 28, 28});
    d.normalized(0, d.size, x.data_ptr<float>());
    return x;
  };
  auto as_labels = [](const ddp::examples::Dataset& d) {
    return torch::from_blob(const_cast<std::uint8_t*>(d.labels.data()), {static_cast<long>(d.size)},
                            torch::kUInt8)
        .to(torch::kLong);
  };
  const auto train_x = as_images(train), test_x = as_images(test);
  const auto train_y = as_labels(train), test_y = as_labels(test);

  torch::manual_seed(1 + pg->rank());  // rank 0's weights win at construction
  Cnn net;
  ddp::torch::DistributedDataParallelOptions options;
  options.reducer.comm_hook = ddp::make_comm_hook(flags.comm_hook);
  options.reducer.bucket_cap_bytes = static_cast<std::size_t>(flags.bucket_cap_mb * ddp::kMiB);
  ddp::torch::DistributedDataParallel model(net, pg, options);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(flags.lr).momentum(0.9));

  ddp::DistributedSampler sampler(train.size, pg->size(), pg->rank(), true, 0);
  const std::size_t steps = sampler.size() / static_cast<std::size_t>(flags.batch_size);
  const auto t0 = std::chrono::steady_clock::now();
  double accuracy = 0;
  for (int epoch = 0; epoch < flags.epochs; ++epoch) {
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    const auto indices = sampler.indices();
    auto idx = torch::from_blob(const_cast<std::int64_t*>(indices.data()),
                                {static_cast<long>(indices.size())}, torch::kLong);
    net->train();
    auto tw = std::chrono::steady_clock::now();
    for (std::size_t s = 0; s < steps; ++s) {
      auto batch_idx = idx.narrow(0, static_cast<long>(s) * flags.batch_size, flags.batch_size);
      auto x = train_x.index_select(0, batch_idx);
      auto y = train_y.index_select(0, batch_idx);
      optimizer.zero_grad();
      auto loss = torch::cross_entropy_loss(model.forward(x), y);
      loss.backward();  // buckets are all-reduced during this call
      optimizer.step();
      if (lead && ((s + 1) % static_cast<std::size_t>(flags.log_every) == 0 || s + 1 == steps)) {
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - tw).count();
        const std::size_t done = ((s + 1) % static_cast<std::size_t>(flags.log_every)) == 0
                                     ? static_cast<std::size_t>(flags.log_every)
                                     : (s + 1) % static_cast<std::size_t>(flags.log_every);
        std::printf(
            "epoch %d/%d step %zu/%zu loss %.4f %.0f samples/s\n", epoch + 1, flags.epochs, s + 1,
            steps, loss.item<float>(),
            static_cast<double>(done * static_cast<std::size_t>(flags.batch_size * pg->size())) /
                secs);
        std::fflush(stdout);
        tw = std::chrono::steady_clock::now();
      }
    }
    // Each rank scores a contiguous shard of the test set; the counts are summed.
    net->eval();
    torch::NoGradGuard no_grad;
    const long n = static_cast<long>(test.size);
    const long begin = n * pg->rank() / pg->size(), end = n * (pg->rank() + 1) / pg->size();
    auto pred = model.forward(test_x.narrow(0, begin, end - begin)).argmax(1);
    std::vector<std::int64_t> counts = {
        pred.eq(test_y.narrow(0, begin, end - begin)).sum().item<std::int64_t>(), end - begin};
    pg->allreduce(ddp::Buffer::of(counts))->wait();
    accuracy = 100.0 * static_cast<double>(counts[0]) / static_cast<double>(counts[1]);
    if (lead) {
      std::printf("epoch %d/%d: test accuracy %.2f%% (%.1f s)\n", epoch + 1, flags.epochs, accuracy,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  if (lead) std::printf("final test accuracy: %.2f%%\n", accuracy);
  ddp::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Fashion-MNIST CNN with libtorch and ddp::torch::DistributedDataParallel"};
  app.add_option("--data-dir", f.data_dir, "folder with the gzip IDX files")->capture_default_str();
  app.add_option("--epochs", f.epochs, "epochs")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--batch-size", f.batch_size, "samples per rank and step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", f.lr, "learning rate (SGD, momentum 0.9)")->capture_default_str();
  app.add_option("--train-limit", f.train_limit, "use only the first N training samples (0: all)");
  app.add_option("--test-limit", f.test_limit, "use only the first N test samples (0: all)");
  app.add_option("--comm-hook", f.comm_hook, "allreduce, fp16 or bf16")
      ->check(CLI::IsMember({"allreduce", "fp16", "bf16"}));
  app.add_option("--bucket-cap-mb", f.bucket_cap_mb, "bucket cap in MiB")
      ->check(CLI::PositiveNumber);
  app.add_option("--log-every", f.log_every, "progress line every N steps")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_fashion_mnist: error: %s\n", e.what());
    return 1;
  }
}
