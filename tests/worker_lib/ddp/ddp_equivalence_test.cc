// DistributedDataParallel end to end on a small MLP: W ranks with batch B must
// train to the same parameters as one process with batch W*B, over the thread
// test double and over real Gloo.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "ddp/common/error.h"
#include "ddp/worker/ddp.h"
#include "ddp_test_util.h"

namespace ddp::testing {
namespace {

const std::vector<int> kLayers = {6, 16, 16, 3};
constexpr float kLr = 0.1f;

// One process, batch `batch`, `steps` SGD steps over consecutive samples.
Mlp train_single(const Data& data, int batch, int steps) {
  Mlp model(kLayers);
  for (int s = 0; s < steps; ++s) {
    const std::size_t off = static_cast<std::size_t>(s) * batch;
    model.backward(&data.x[off * kLayers.front()], &data.t[off * kLayers.back()], batch, 1.0f, {});
    model.sgd_step(kLr);
  }
  return model;
}

struct RunConfig {
  int world = 2;
  int batch = 4;  // per rank and micro-batch
  int micro = 1;  // micro-batches per step (the first micro-1 under no_sync)
  int steps = 5;
  DdpOptions options;
};

// Every rank starts from a DIFFERENT initialization: construction must copy rank 0's.
std::vector<Mlp> train_ddp(
    Backend backend, const Data& data, const RunConfig& cfg,
    std::vector<std::vector<std::vector<std::size_t>>>* assignments = nullptr) {
  auto groups = make_groups(backend, cfg.world);
  std::vector<Mlp> models;
  for (int r = 0; r < cfg.world; ++r) models.emplace_back(kLayers, r == 0 ? 1u : 100u + r);
  if (assignments) assignments->assign(cfg.world, {});
  run_threads(cfg.world, [&](int r) {
    Mlp& m = models[r];
    std::vector<Parameter> params;
    for (std::size_t i = 0; i < m.num_params(); ++i) {
      params.push_back({m.names[i], m.shapes[i], Buffer::of(m.values[i]),
                        Buffer::of(m.own_grads[i].data(), m.own_grads[i].size())});
    }
    DistributedDataParallel model(groups[r], params, {}, cfg.options);
    const bool view = cfg.options.reducer.gradient_as_bucket_view;
    auto refresh = [&] {
      if (!view) return;
      for (std::size_t i = 0; i < m.num_params(); ++i)
        m.grads[i] = static_cast<float*>(model.grad(i).data);
    };
    refresh();
    for (int s = 0; s < cfg.steps; ++s) {
      for (int k = 0; k < cfg.micro; ++k) {
        const std::size_t off = static_cast<std::size_t>(s) * cfg.world * cfg.micro * cfg.batch +
                                static_cast<std::size_t>(r * cfg.micro + k) * cfg.batch;
        auto step = [&] {
          model.begin_forward();
          model.begin_backward();
          m.backward(&data.x[off * kLayers.front()], &data.t[off * kLayers.back()], cfg.batch,
                     1.0f / static_cast<float>(cfg.micro),
                     [&](std::size_t i) { model.grad_ready(i); });
          model.finalize();
        };
        if (k + 1 < cfg.micro) {
          auto guard = model.no_sync();
          step();
        } else {
          step();
        }
      }
      refresh();
      m.sgd_step(kLr);
    }
    if (assignments) (*assignments)[r] = model.reducer().bucket_assignment();
  });
  return models;
}

void expect_close(const Mlp& a, const Mlp& b, float tol) {
  ASSERT_EQ(a.values.size(), b.values.size());
  for (std::size_t i = 0; i < a.values.size(); ++i) {
    for (std::size_t k = 0; k < a.values[i].size(); ++k) {
      ASSERT_NEAR(a.values[i][k], b.values[i][k], tol * (1.0f + std::fabs(b.values[i][k])))
          << "param " << i << " element " << k;
    }
  }
}

class DdpEquivalence : public ::testing::TestWithParam<Backend> {};

TEST_P(DdpEquivalence, MatchesOneProcessForSeveralBucketCaps) {
  struct Cap {
    std::size_t first, cap;
    std::size_t expected_buckets;  // 0: do not check
  };
  // 6 tensors of 96, 16, 256, 16, 48, 3 floats.
  const std::vector<Cap> caps = {
      {4, 4, 6},                                        // tiny: every tensor in its own bucket
      {256, 256, 0},                                    // a few small buckets
      {std::size_t{1} << 30, std::size_t{1} << 30, 1},  // one whole-model bucket
      {1 * kMiB, 25 * kMiB, 1},                         // the defaults (the model is < 1 MiB)
  };
  for (int world : {2, 3}) {
    if (GetParam() == Backend::kGloo && world == 3) continue;  // keep the suite fast
    RunConfig cfg;
    cfg.world = world;
    Data data(cfg.world * cfg.batch * cfg.steps, kLayers.front(), kLayers.back());
    const Mlp reference = train_single(data, cfg.world * cfg.batch, cfg.steps);
    for (const Cap& c : caps) {
      SCOPED_TRACE("world " + std::to_string(world) + " cap " + std::to_string(c.cap));
      cfg.options.reducer.first_bucket_cap_bytes = c.first;
      cfg.options.reducer.bucket_cap_bytes = c.cap;
      std::vector<std::vector<std::vector<std::size_t>>> assignment;
      auto models = train_ddp(GetParam(), data, cfg, &assignment);
      for (const auto& m : models) expect_close(m, reference, 2e-5f);
      for (int r = 1; r < world; ++r) {
        EXPECT_EQ(models[r].checksum(), models[0].checksum());
      }
      if (c.expected_buckets) {
        EXPECT_EQ(assignment[0].size(), c.expected_buckets);
      }
      if (c.cap == 256) {
        EXPECT_GT(assignment[0].size(), 2u);
        EXPECT_LT(assignment[0].size(), 6u);
      }
    }
  }
}

TEST_P(DdpEquivalence, GradientAsBucketViewMatchesOneProcess) {
  RunConfig cfg;
  cfg.options.reducer.gradient_as_bucket_view = true;
  cfg.options.reducer.first_bucket_cap_bytes = 256;
  cfg.options.reducer.bucket_cap_bytes = 512;
  Data data(cfg.world * cfg.batch * cfg.steps, kLayers.front(), kLayers.back());
  const Mlp reference = train_single(data, cfg.world * cfg.batch, cfg.steps);
  auto models = train_ddp(GetParam(), data, cfg);
  for (const auto& m : models) expect_close(m, reference, 2e-5f);
  EXPECT_EQ(models[1].checksum(), models[0].checksum());
}

TEST_P(DdpEquivalence, NoSyncMicroBatchesEqualOneLargeBatch) {
  for (bool view : {false, true}) {
    RunConfig cfg;
    cfg.micro = 3;
    cfg.options.reducer.gradient_as_bucket_view = view;
    cfg.options.reducer.first_bucket_cap_bytes = 128;
    cfg.options.reducer.bucket_cap_bytes = 512;
    Data data(cfg.world * cfg.micro * cfg.batch * cfg.steps, kLayers.front(), kLayers.back());
    const Mlp reference = train_single(data, cfg.world * cfg.micro * cfg.batch, cfg.steps);
    auto models = train_ddp(GetParam(), data, cfg);
    for (const auto& m : models) expect_close(m, reference, 2e-5f);
    EXPECT_EQ(models[1].checksum(), models[0].checksum());
  }
}

TEST_P(DdpEquivalence, StaticGraphAndFindUnusedStillMatch) {
  for (int variant = 0; variant < 2; ++variant) {
    RunConfig cfg;
    cfg.options.reducer.static_graph = variant == 0;
    cfg.options.reducer.find_unused_parameters = variant == 1;
    cfg.options.reducer.bucket_cap_bytes = 300;
    Data data(cfg.world * cfg.batch * cfg.steps, kLayers.front(), kLayers.back());
    const Mlp reference = train_single(data, cfg.world * cfg.batch, cfg.steps);
    auto models = train_ddp(GetParam(), data, cfg);
    for (const auto& m : models) expect_close(m, reference, 2e-5f);
  }
}

TEST_P(DdpEquivalence, ConstructionCopiesRankZerosParametersAndBuffers) {
  auto groups = make_groups(GetParam(), 2);
  std::vector<std::vector<float>> weights = {{1, 2, 3}, {9, 9, 9}};
  std::vector<std::vector<float>> grads(2, std::vector<float>(3, 0.0f));
  std::vector<std::vector<std::int64_t>> running = {{5, 6}, {0, 0}};
  run_threads(2, [&](int r) {
    DistributedDataParallel model(groups[r],
                                  {{"w", {3}, Buffer::of(weights[r]), Buffer::of(grads[r])}},
                                  {{"running", Buffer::of(running[r])}});
    EXPECT_EQ(weights[r], (std::vector<float>{1, 2, 3}));
    EXPECT_EQ(running[r], (std::vector<std::int64_t>{5, 6}));
    // broadcast_buffers: rank 0's buffer values reach every rank at each forward.
    if (r == 0) running[0] = {7, 8};
    model.begin_forward();
    EXPECT_EQ(running[r], (std::vector<std::int64_t>{7, 8}));
  });
  EXPECT_EQ(weights[1], (std::vector<float>{1, 2, 3}));
}

TEST_P(DdpEquivalence, ShapeMismatchAcrossRanksFailsOnEveryRankNamingTheParameter) {
  auto groups = make_groups(GetParam(), 2);
  std::vector<float> a(6), ga(6), b(4), gb(4);
  std::vector<std::string> messages(2);
  run_threads(2, [&](int r) {
    std::vector<Parameter> params = {{"fc.bias", {4}, Buffer::of(b), Buffer::of(gb)}};
    if (r == 0) {
      params.insert(params.begin(), {"fc.weight", {2, 3}, Buffer::of(a), Buffer::of(ga)});
    } else {
      params.insert(params.begin(), {"fc.weight", {3, 2}, Buffer::of(a), Buffer::of(ga)});
    }
    try {
      DistributedDataParallel model(groups[r], params);
    } catch (const InvalidArgument& e) {
      messages[r] = e.what();
    }
  });
  EXPECT_NE(messages[0].find("rank(s) 1"), std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("parameter 0 ('fc.weight') is [3, 2] float32 on this rank (1) but "
                             "[2, 3] float32 on rank 0"),
            std::string::npos)
      << messages[1];

  // A different number of parameters.
  run_threads(2, [&](int r) {
    std::vector<Parameter> params = {{"fc.weight", {6}, Buffer::of(a), Buffer::of(ga)}};
    if (r == 1) params.push_back({"extra", {4}, Buffer::of(b), Buffer::of(gb)});
    try {
      DistributedDataParallel model(groups[r], params);
      messages[r] = "no error";
    } catch (const InvalidArgument& e) {
      messages[r] = e.what();
    }
  });
  EXPECT_NE(messages[0].find("rank 1 has 2 parameters"), std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("extra parameter 1 ('extra')"), std::string::npos) << messages[1];
}

INSTANTIATE_TEST_SUITE_P(Backends, DdpEquivalence,
                         ::testing::Values(Backend::kThread, Backend::kGloo),
                         [](const auto& info) { return backend_name(info.param); });

}  // namespace
}  // namespace ddp::testing
