// The libtorch adapter: an ordinary libtorch loop (forward, loss.backward(),
// optimizer step) on W ranks must match one process with the W-times batch.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "ddp/common/error.h"
#include "ddp/worker/torch/distributed_data_parallel.h"
#include "ddp_test_util.h"

// Outside namespace ddp: TORCH_MODULE names torch::nn unqualified.
namespace torch_test {
struct NetImpl : ::torch::nn::Module {
  explicit NetImpl(bool with_unused = false) {
    fc1 = register_module("fc1", ::torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", ::torch::nn::Linear(16, 4));
    if (with_unused) unused = register_module("unused", ::torch::nn::Linear(4, 4));
  }
  ::torch::Tensor forward(const ::torch::Tensor& x) { return fc2(::torch::relu(fc1(x))); }
  ::torch::nn::Linear fc1{nullptr}, fc2{nullptr}, unused{nullptr};
};
TORCH_MODULE(Net);
}  // namespace torch_test

namespace ddp::testing {
namespace {

using torch_test::Net;

void copy_params(Net& dst, Net& src) {
  ::torch::NoGradGuard g;
  auto d = dst->parameters();
  auto s = src->parameters();
  for (std::size_t i = 0; i < d.size(); ++i) d[i].copy_(s[i]);
}

struct Config {
  int micro = 1;
  bool view = false;
  std::size_t cap = 25 * kMiB;
};

void run_equivalence(Backend backend, const Config& cfg) {
  const int world = 2, batch = 4, steps = 4;
  ::torch::manual_seed(0);
  auto x = ::torch::randn({steps * world * cfg.micro * batch, 8});
  auto y = ::torch::randn({steps * world * cfg.micro * batch, 4});
  std::vector<Net> nets;
  for (int r = 0; r < world; ++r) {
    ::torch::manual_seed(10 + r);  // different starts: construction must copy rank 0's
    nets.emplace_back();
  }
  Net reference;
  copy_params(reference, nets[0]);
  {
    ::torch::optim::SGD opt(reference->parameters(), 0.1);
    const int n = world * cfg.micro * batch;
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto loss =
          ::torch::mse_loss(reference->forward(x.narrow(0, s * n, n)), y.narrow(0, s * n, n));
      loss.backward();
      opt.step();
    }
  }
  auto groups = make_groups(backend, world);
  std::vector<std::size_t> buckets(world);
  run_threads(world, [&](int r) {
    ddp::torch::DistributedDataParallelOptions o;
    o.reducer.gradient_as_bucket_view = cfg.view;
    o.reducer.bucket_cap_bytes = cfg.cap;
    o.reducer.first_bucket_cap_bytes = std::min(cfg.cap, kMiB);
    ddp::torch::DistributedDataParallel model(nets[r], groups[r], o);
    ::torch::optim::SGD opt(nets[r]->parameters(), 0.1);
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      for (int k = 0; k < cfg.micro; ++k) {
        const int off = ((s * world + r) * cfg.micro + k) * batch;
        auto step = [&] {
          auto loss =
              ::torch::mse_loss(model.forward(x.narrow(0, off, batch)), y.narrow(0, off, batch)) /
              static_cast<double>(cfg.micro);
          loss.backward();
        };
        if (k + 1 < cfg.micro) {
          auto guard = model.no_sync();
          step();
        } else {
          step();
        }
      }
      opt.step();
    }
    buckets[r] = model.reducer().bucket_assignment().size();
  });
  for (int r = 0; r < world; ++r) {
    auto p = nets[r]->parameters();
    auto q = reference->parameters();
    for (std::size_t i = 0; i < p.size(); ++i) {
      EXPECT_TRUE(::torch::allclose(p[i], q[i], 1e-5, 1e-6))
          << "rank " << r << " param " << i << "\n"
          << (p[i] - q[i]).abs().max();
    }
  }
  for (std::size_t i = 0; i < nets[0]->parameters().size(); ++i) {
    EXPECT_TRUE(::torch::equal(nets[0]->parameters()[i], nets[1]->parameters()[i]));
  }
  if (cfg.cap < 64) {
    EXPECT_EQ(buckets[0], 4u);  // one bucket per tensor
  }
}

class TorchDdp : public ::testing::TestWithParam<Backend> {};

TEST_P(TorchDdp, Int8AndBoolBuffersComeFromRankZero) {
  const int world = 2;
  std::vector<Net> nets(world);
  std::vector<::torch::Tensor> counters(world), masks(world);
  for (int r = 0; r < world; ++r) {
    counters[r] =
        nets[r]->register_buffer("counter", ::torch::full({5}, r == 0 ? -7 : 3, ::torch::kInt8));
    masks[r] =
        nets[r]->register_buffer("mask", ::torch::tensor({r == 0, r != 0, r == 0}, ::torch::kBool));
  }
  auto groups = make_groups(GetParam(), world);
  run_threads(world, [&](int r) { ddp::torch::DistributedDataParallel model(nets[r], groups[r]); });
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(::torch::equal(counters[r], ::torch::full({5}, -7, ::torch::kInt8))) << r;
    EXPECT_TRUE(::torch::equal(masks[r], ::torch::tensor({true, false, true}, ::torch::kBool)))
        << r;
  }
}

TEST_P(TorchDdp, OrdinaryLoopMatchesOneProcess) { run_equivalence(GetParam(), {}); }

TEST_P(TorchDdp, TinyBucketsAndBucketViewsMatchOneProcess) {
  run_equivalence(GetParam(), {1, true, 16});
  run_equivalence(GetParam(), {1, false, 16});
}

TEST_P(TorchDdp, NoSyncMicroBatchesMatchOneLargeBatch) {
  run_equivalence(GetParam(), {3, false, 25 * kMiB});
  run_equivalence(GetParam(), {2, true, 100});
}

TEST_P(TorchDdp, UnusedParameterNamedWithoutFindUnusedAndZeroWithIt) {
  auto groups = make_groups(GetParam(), 2);
  std::vector<Net> nets = {Net(true), Net(true)};
  std::vector<std::string> errors(2);
  run_threads(2, [&](int r) {
    ddp::torch::DistributedDataParallel model(nets[r], groups[r]);
    auto loss = model.forward(::torch::ones({2, 8})).sum();
    try {
      loss.backward();
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("('unused.weight')"), std::string::npos) << e;
    EXPECT_NE(e.find("('unused.bias')"), std::string::npos) << e;
  }
  auto groups2 = make_groups(GetParam(), 2);
  run_threads(2, [&](int r) {
    ddp::torch::DistributedDataParallelOptions o;
    o.reducer.find_unused_parameters = true;
    ddp::torch::DistributedDataParallel model(nets[r], groups2[r], o);
    for (auto& p : nets[r]->parameters()) p.mutable_grad() = ::torch::Tensor();
    auto loss = model.forward(::torch::full({2, 8}, static_cast<float>(r))).sum();
    loss.backward();
    EXPECT_TRUE(nets[r]->fc1->weight.grad().defined());
  });
  EXPECT_TRUE(::torch::equal(nets[0]->fc1->weight.grad(), nets[1]->fc1->weight.grad()));
}

INSTANTIATE_TEST_SUITE_P(Backends, TorchDdp, ::testing::Values(Backend::kThread, Backend::kGloo),
                         [](const auto& info) { return backend_name(info.param); });

}  // namespace
}  // namespace ddp::testing
