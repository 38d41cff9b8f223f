// The Reducer on synthetic gradients: bucketing, launch timing and order,
// unused gradients, rebuild, tiny and huge tensors, compression hooks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "ddp/common/error.h"
#include "ddp/worker/comm_hooks.h"
#include "ddp/worker/reducer.h"
#include "ddp_test_util.h"

namespace ddp::testing {
namespace {

// Per rank: gradient buffers of the given sizes, filled with value(rank, i, k).
struct Grads {
  std::vector<std::vector<float>> data;
  std::vector<GradientSpec> specs(bool with_memory = true) {
    std::vector<GradientSpec> out;
    for (std::size_t i = 0; i < data.size(); ++i) {
      Buffer b = Buffer::of(data[i]);
      if (!with_memory) b.data = nullptr;
      out.push_back({"p" + std::to_string(i), {}, b});
    }
    return out;
  }
};

float value(int rank, std::size_t i, std::size_t k) {
  return static_cast<float>(rank + 1) * 0.5f + static_cast<float>(i) * 0.25f +
         static_cast<float>(k % 7) * 0.125f;
}

Grads make_grads(const std::vector<std::size_t>& sizes, int rank) {
  Grads g;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    g.data.emplace_back(sizes[i]);
    for (std::size_t k = 0; k < sizes[i]; ++k) g.data[i][k] = value(rank, i, k);
  }
  return g;
}

float mean_value(int world, std::size_t i, std::size_t k) {
  float s = 0;
  for (int r = 0; r < world; ++r) s += value(r, i, k);
  return s / static_cast<float>(world);
}

TEST(ReducerBuckets, ReverseOrderSizeCapsAndFirstBucket) {
  auto groups = make_groups(Backend::kThread, 1);
  // 6 gradients of 100 floats (400 bytes); first cap 400, cap 1000.
  Grads g = make_grads(std::vector<std::size_t>(6, 100), 0);
  ReducerOptions o;
  o.first_bucket_cap_bytes = 400;
  o.bucket_cap_bytes = 1000;
  Reducer reducer(groups[0], g.specs(), o);
  const std::vector<std::vector<std::size_t>> expected = {{5}, {4, 3}, {2, 1}, {0}};
  EXPECT_EQ(reducer.bucket_assignment(), expected);
}

TEST(ReducerBuckets, TensorLargerThanCapGetsItsOwnBucket) {
  auto groups = make_groups(Backend::kThread, 2);
  // Gradient 1 (4000 bytes) exceeds the 256-byte cap.
  const std::vector<std::size_t> sizes = {10, 1000, 10, 10};
  std::vector<Grads> g = {make_grads(sizes, 0), make_grads(sizes, 1)};
  std::vector<std::vector<std::vector<std::size_t>>> assignment(2);
  run_threads(2, [&](int r) {
    ReducerOptions o;
    o.first_bucket_cap_bytes = 256;
    o.bucket_cap_bytes = 256;
    o.rebuild_buckets = false;
    Reducer reducer(groups[r], g[r].specs(), o);
    assignment[r] = reducer.bucket_assignment();
    for (std::size_t i = sizes.size(); i-- > 0;) reducer.mark_grad_ready(i);
    reducer.finalize();
  });
  const std::vector<std::vector<std::size_t>> expected = {{3, 2}, {1}, {0}};
  EXPECT_EQ(assignment[0], expected);
  for (int r = 0; r < 2; ++r) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      for (std::size_t k = 0; k < sizes[i]; ++k)
        ASSERT_FLOAT_EQ(g[r].data[i][k], mean_value(2, i, k));
    }
  }
}

TEST(ReducerBuckets, SeparateBucketsPerDtype) {
  auto groups = make_groups(Backend::kThread, 1);
  std::vector<float> f1(4), f2(4);
  std::vector<double> d1(4);
  std::vector<GradientSpec> specs = {
      {"a", {}, Buffer::of(f1)}, {"b", {}, Buffer::of(d1)}, {"c", {}, Buffer::of(f2)}};
  Reducer reducer(groups[0], specs);
  const std::vector<std::vector<std::size_t>> expected = {{2, 0}, {1}};
  EXPECT_EQ(reducer.bucket_assignment(), expected);
}

TEST(ReducerBuckets, RejectsBadSpecsAndOptions) {
  auto groups = make_groups(Backend::kThread, 1);
  std::vector<std::int32_t> ints(4);
  std::vector<float> f(6);
  EXPECT_THROW(Reducer(groups[0], {{"i", {}, Buffer::of(ints)}}), InvalidArgument);
  try {
    Reducer(groups[0], {{"w", {4, 2}, Buffer::of(f)}});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "gradient 0 ('w'): shape [4, 2] has 8 elements but the buffer has 6"),
              std::string::npos)
        << e.what();
  }
  ReducerOptions o;
  o.bucket_cap_bytes = 0;
  EXPECT_THROW(Reducer(groups[0], {{"w", {}, Buffer::of(f)}}, o), InvalidArgument);
  Reducer ok(groups[0], {{"w", {}, Buffer::of(f)}});
  EXPECT_THROW(ok.mark_grad_ready(1), InvalidArgument);
  ok.mark_grad_ready(0);
  EXPECT_THROW(ok.mark_grad_ready(0), InvalidArgument);  // twice in one backward
}

TEST(ReducerOverlap, BucketLaunchesWhenItsLastGradientIsReadyAndInOrder) {
  auto world = std::make_shared<ThreadWorld>(1);
  auto pg = std::make_shared<ThreadProcessGroup>(world, 0);
  Grads g = make_grads(std::vector<std::size_t>(4, 100), 0);
  ReducerOptions o;
  o.first_bucket_cap_bytes = 800;
  o.bucket_cap_bytes = 800;
  o.rebuild_buckets = false;
  Reducer reducer(pg, g.specs(), o);
  ASSERT_EQ(reducer.bucket_assignment(), (std::vector<std::vector<std::size_t>>{{3, 2}, {1, 0}}));
  // Bucket 1 completes first: it must wait for bucket 0 (same order on every rank).
  reducer.mark_grad_ready(0);
  reducer.mark_grad_ready(1);
  EXPECT_EQ(pg->issued(), 0u);
  reducer.mark_grad_ready(3);
  EXPECT_EQ(pg->issued(), 0u);
  reducer.mark_grad_ready(2);  // completes bucket 0: both launch now, before finalize()
  EXPECT_EQ(pg->issued(), 2u);
  reducer.finalize();
  EXPECT_EQ(pg->issued(), 2u);
  EXPECT_EQ(reducer.stats().num_buckets, 2u);
  EXPECT_EQ(reducer.stats().iterations, 1u);
}

TEST(ReducerNoSync, NoCommunicationUnderTheGuard) {
  auto world = std::make_shared<ThreadWorld>(1);
  auto pg = std::make_shared<ThreadProcessGroup>(world, 0);
  Grads g = make_grads({8, 8}, 0);
  Reducer reducer(pg, g.specs());
  {
    auto guard = reducer.no_sync();
    EXPECT_FALSE(reducer.sync_enabled());
    reducer.mark_grad_ready(1);
    reducer.mark_grad_ready(0);
    reducer.finalize();
  }
  EXPECT_TRUE(reducer.sync_enabled());
  EXPECT_EQ(pg->issued(), 0u);
  EXPECT_EQ(reducer.stats().no_sync_iterations, 1u);
  reducer.mark_grad_ready(1);
  reducer.mark_grad_ready(0);
  reducer.finalize();
  EXPECT_GT(pg->issued(), 0u);
}

class ReducerBackends : public ::testing::TestWithParam<Backend> {};

TEST_P(ReducerBackends, UnusedParametersContributeZerosAndGloballyUnusedAreUntouched) {
  auto groups = make_groups(GetParam(), 2);
  const std::vector<std::size_t> sizes = {5, 5, 5, 5};
  std::vector<Grads> g = {make_grads(sizes, 0), make_grads(sizes, 1)};
  for (auto& v : g[1].data[1]) v = 1234.0f;  // rank 1 does not use gradient 1
  for (int r = 0; r < 2; ++r)
    std::fill(g[r].data[3].begin(), g[r].data[3].end(), -7.0f);  // nobody uses 3
  run_threads(2, [&](int r) {
    ReducerOptions o;
    o.find_unused_parameters = true;
    o.bucket_cap_bytes = 40;
    o.first_bucket_cap_bytes = 40;
    Reducer reducer(groups[r], g[r].specs(), o);
    reducer.mark_grad_ready(2);
    if (r == 0) reducer.mark_grad_ready(1);
    reducer.mark_grad_ready(0);
    reducer.finalize();
  });
  for (int r = 0; r < 2; ++r) {
    for (std::size_t k = 0; k < 5; ++k) {
      EXPECT_FLOAT_EQ(g[r].data[0][k], mean_value(2, 0, k));
      EXPECT_FLOAT_EQ(g[r].data[1][k], value(0, 1, k) / 2.0f) << "rank " << r;  // (g0 + 0) / 2
      EXPECT_FLOAT_EQ(g[r].data[3][k], -7.0f);  // globally unused: left as it was
    }
  }
}

TEST_P(ReducerBackends, MissingGradientWithoutFindUnusedNamesTheParameter) {
  auto groups = make_groups(GetParam(), 2);
  std::vector<Grads> g = {make_grads({3, 3, 3, 3}, 0), make_grads({3, 3, 3, 3}, 1)};
  std::vector<std::string> messages(2);
  run_threads(2, [&](int r) {
    Reducer reducer(groups[r], g[r].specs());
    reducer.mark_grad_ready(3);
    reducer.mark_grad_ready(1);
    reducer.mark_grad_ready(0);
    try {
      reducer.finalize();
    } catch (const InvalidArgument& e) {
      messages[r] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(messages[r].find("gradient 2 ('p2')"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("find_unused_parameters"), std::string::npos) << messages[r];
  }
}

TEST(ReducerUnused, OneRankMissingAGradientErrorsThereAndTimesOutElsewhere) {
  auto groups = make_groups(Backend::kThread, 2, std::chrono::milliseconds(300));
  std::vector<Grads> g = {make_grads({3, 3}, 0), make_grads({3, 3}, 1)};
  std::vector<std::string> errors(2);
  run_threads(2, [&](int r) {
    ReducerOptions o;
    o.first_bucket_cap_bytes = 4;  // one bucket per gradient
    o.bucket_cap_bytes = 4;
    Reducer reducer(groups[r], g[r].specs(), o);
    if (r == 0) reducer.mark_grad_ready(1);
    reducer.mark_grad_ready(0);
    try {
      reducer.finalize();
    } catch (const InvalidArgument& e) {
      errors[r] = std::string("invalid: ") + e.what();
    } catch (const TimeoutError& e) {
      errors[r] = std::string("timeout: ") + e.what();
    }
  });
  EXPECT_EQ(errors[0].rfind("timeout: ", 0), 0u) << errors[0];
  EXPECT_EQ(errors[1].rfind("invalid: ", 0), 0u) << errors[1];
  EXPECT_NE(errors[1].find("gradient 1 ('p1')"), std::string::npos) << errors[1];
}

TEST_P(ReducerBackends, StaticGraphLaunchesUnusedBucketsBeforeFinalizeAfterFirstIteration) {
  auto groups = make_groups(GetParam(), 2);
  std::vector<Grads> g = {make_grads({4, 4, 4}, 0), make_grads({4, 4, 4}, 1)};
  run_threads(2, [&](int r) {
    ReducerOptions o;
    o.static_graph = true;
    o.first_bucket_cap_bytes = 4;
    o.bucket_cap_bytes = 4;
    Reducer reducer(groups[r], g[r].specs(), o);
    for (int it = 0; it < 3; ++it) {
      for (std::size_t i = 0; i < 3; ++i) {
        for (std::size_t k = 0; k < 4; ++k) g[r].data[i][k] = value(r, i, k);
      }
      reducer.prepare_for_backward();
      reducer.mark_grad_ready(2);  // gradient 1 is never used
      reducer.mark_grad_ready(0);
      reducer.finalize();  // no error, even without find_unused_parameters
      for (std::size_t k = 0; k < 4; ++k) {
        EXPECT_FLOAT_EQ(g[r].data[0][k], mean_value(2, 0, k));
        EXPECT_FLOAT_EQ(g[r].data[2][k], mean_value(2, 2, k));
      }
    }
    EXPECT_TRUE(reducer.buckets_rebuilt());
    // After the rebuild the observed order (2, 0) comes first and the unused 1 last.
    EXPECT_EQ(reducer.bucket_assignment(), (std::vector<std::vector<std::size_t>>{{2}, {0}, {1}}));
  });
  // Over the thread double, check that nothing waits for finalize(): mark the
  // used gradients and every bucket has been launched.
  if (GetParam() != Backend::kThread) return;
  auto world = std::make_shared<ThreadWorld>(1);
  auto pg = std::make_shared<ThreadProcessGroup>(world, 0);
  Grads one = make_grads({4, 4, 4}, 0);
  ReducerOptions o;
  o.static_graph = true;
  o.first_bucket_cap_bytes = 4;
  o.bucket_cap_bytes = 4;
  o.rebuild_buckets = false;
  Reducer reducer(pg, one.specs(), o);
  reducer.mark_grad_ready(2);
  reducer.mark_grad_ready(0);
  reducer.finalize();
  const auto before = pg->issued();
  reducer.prepare_for_backward();
  reducer.mark_grad_ready(2);
  reducer.mark_grad_ready(0);
  EXPECT_EQ(pg->issued() - before, 3u);  // all 3 buckets, including the unused one
  reducer.finalize();
}

TEST_P(ReducerBackends, RebuildUsesRankZerosObservedOrder) {
  auto groups = make_groups(GetParam(), 2);
  const std::vector<std::size_t> sizes = {10, 10, 10, 10, 10, 10};
  std::vector<Grads> g = {make_grads(sizes, 0), make_grads(sizes, 1)};
  std::vector<std::vector<std::vector<std::size_t>>> before(2), after(2);
  for (bool view : {false, true}) {
    run_threads(2, [&](int r) {
      ReducerOptions o;
      o.first_bucket_cap_bytes = 80;
      o.bucket_cap_bytes = 80;
      o.gradient_as_bucket_view = view;
      Reducer reducer(groups[r], g[r].specs(!view), o);
      auto fill = [&] {
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          auto* p = static_cast<float*>(reducer.grad(i).data);
          for (std::size_t k = 0; k < sizes[i]; ++k) p[k] = value(r, i, k);
        }
      };
      before[r] = reducer.bucket_assignment();
      // Rank 0 produces gradients in registration order, rank 1 in another order.
      const std::vector<std::size_t> order0 = {0, 1, 2, 3, 4, 5};
      const std::vector<std::size_t> order1 = {5, 3, 1, 4, 2, 0};
      fill();
      for (std::size_t i : (r == 0 ? order0 : order1)) reducer.mark_grad_ready(i);
      reducer.finalize();
      EXPECT_TRUE(reducer.buckets_rebuilt());
      after[r] = reducer.bucket_assignment();
      // The averaged values survive the rebuild (they move with bucket views).
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const auto* p = static_cast<const float*>(reducer.grad(i).data);
        for (std::size_t k = 0; k < sizes[i]; ++k) ASSERT_FLOAT_EQ(p[k], mean_value(2, i, k));
      }
      // A second iteration over the new buckets is still correct.
      fill();
      for (std::size_t i : (r == 0 ? order0 : order1)) reducer.mark_grad_ready(i);
      reducer.finalize();
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const auto* p = static_cast<const float*>(reducer.grad(i).data);
        for (std::size_t k = 0; k < sizes[i]; ++k) ASSERT_FLOAT_EQ(p[k], mean_value(2, i, k));
      }
    });
    const std::vector<std::vector<std::size_t>> initial = {{5, 4}, {3, 2}, {1, 0}};
    const std::vector<std::vector<std::size_t>> rebuilt = {{0, 1}, {2, 3}, {4, 5}};
    EXPECT_EQ(before[0], initial);
    EXPECT_EQ(after[0], rebuilt);
    EXPECT_EQ(after[1], rebuilt);  // rank 0's order, not rank 1's own
  }
}

TEST_P(ReducerBackends, ThousandTinyTensors) {
  auto groups = make_groups(GetParam(), 2);
  const std::vector<std::size_t> sizes(1000, 1);
  std::vector<Grads> g = {make_grads(sizes, 0), make_grads(sizes, 1)};
  std::vector<std::size_t> buckets(2);
  run_threads(2, [&](int r) {
    ReducerOptions o;
    o.first_bucket_cap_bytes = 256;
    o.bucket_cap_bytes = 1024;
    o.rebuild_buckets = false;
    Reducer reducer(groups[r], g[r].specs(), o);
    for (int it = 0; it < 2; ++it) {
      for (std::size_t i = 0; i < 1000; ++i)
        g[r].data[i][0] = value(r, i, 0) * static_cast<float>(it + 1);
      for (std::size_t i = 1000; i-- > 0;) reducer.mark_grad_ready(i);
      reducer.finalize();
      for (std::size_t i = 0; i < 1000; ++i) {
        ASSERT_FLOAT_EQ(g[r].data[i][0], mean_value(2, i, 0) * static_cast<float>(it + 1)) << i;
      }
    }
    buckets[r] = reducer.bucket_assignment().size();
  });
  EXPECT_EQ(buckets[0],
            1u + (4000u - 256u + 1023u) / 1024u);  // 64 in the first, then 256 per bucket
}

TEST_P(ReducerBackends, BucketViewsAccumulateUnderNoSyncAndMatchCopiesBitForBit) {
  // Several buckets; a no_sync micro-step then a synchronized one. The copies
  // path (averages copied back bucket by bucket) and bucket views must end with
  // the same bits, and the views must be the buckets' memory (grad(i) is not
  // the registered buffer, and consecutive gradients of a bucket are adjacent).
  auto groups = make_groups(GetParam(), 2);
  const std::vector<std::size_t> sizes = {300, 7, 300, 7, 129};
  std::vector<Grads> copies = {make_grads(sizes, 0), make_grads(sizes, 1)};
  std::vector<std::vector<std::vector<float>>> views(2);
  run_threads(2, [&](int r) {
    ReducerOptions o;
    o.first_bucket_cap_bytes = 600;
    o.bucket_cap_bytes = 1300;
    o.rebuild_buckets = false;
    Reducer plain(groups[r], copies[r].specs(), o);
    o.gradient_as_bucket_view = true;
    Grads unused = make_grads(sizes, r);
    Reducer viewed(groups[r], unused.specs(false), o);
    ASSERT_GT(plain.bucket_assignment().size(), 2u);
    ASSERT_EQ(plain.bucket_assignment(), viewed.bucket_assignment());
    for (const auto& bucket : viewed.bucket_assignment()) {
      for (std::size_t k = 1; k < bucket.size(); ++k) {
        const Buffer before = viewed.grad(bucket[k - 1]);
        EXPECT_EQ(static_cast<float*>(before.data) + before.count,
                  static_cast<float*>(viewed.grad(bucket[k]).data));
      }
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_NE(viewed.grad(i).data, static_cast<void*>(unused.data[i].data()));
      auto* v = static_cast<float*>(viewed.grad(i).data);
      std::copy(copies[r].data[i].begin(), copies[r].data[i].end(), v);  // first micro-step
    }
    auto step = [&](Reducer& reducer) {
      for (std::size_t i = sizes.size(); i-- > 0;) reducer.mark_grad_ready(i);
      reducer.finalize();
    };
    {
      auto a = plain.no_sync();
      auto b = viewed.no_sync();
      step(plain);
      step(viewed);
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {  // the second micro-step adds its part
      auto* v = static_cast<float*>(viewed.grad(i).data);
      for (std::size_t k = 0; k < sizes[i]; ++k) {
        copies[r].data[i][k] += value(r, i, k);
        v[k] += value(r, i, k);
      }
    }
    step(plain);
    step(viewed);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const auto* v = static_cast<const float*>(viewed.grad(i).data);
      views[r].emplace_back(v, v + sizes[i]);
    }
  });
  for (int r = 0; r < 2; ++r) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      ASSERT_EQ(copies[r].data[i], views[r][i]) << "rank " << r << " gradient " << i;
      for (std::size_t k = 0; k < sizes[i]; ++k)
        ASSERT_FLOAT_EQ(copies[r].data[i][k], 2.0f * mean_value(2, i, k)) << i << " " << k;
    }
  }
}

// fp16 / bf16 compression: result within the bound stated in comm_hooks.h.
void check_hook(Backend backend, const std::string& hook, double unit, double tiny) {
  const int world = 2;
  auto groups = make_groups(backend, world);
  const std::size_t n = 4096;
  std::vector<std::vector<float>> grads(world, std::vector<float>(n));
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& v : grads) {
    for (std::size_t k = 0; k < n; ++k) {
      // Magnitudes from 1e-6 to 1e3.
      v[k] = dist(gen) * std::pow(10.0f, static_cast<float>(k % 10) - 6.0f);
    }
  }
  const auto original = grads;
  run_threads(world, [&](int r) {
    ReducerOptions o;
    o.comm_hook = make_comm_hook(hook);
    o.first_bucket_cap_bytes = 4096;
    o.bucket_cap_bytes = 4096;
    std::vector<GradientSpec> specs;
    for (std::size_t p = 0; p < 8; ++p) {
      specs.push_back({"g" + std::to_string(p),
                       {},
                       Buffer{grads[r].data() + p * 512, 512, DType::kFloat32, {}}});
    }
    Reducer reducer(groups[r], specs, o);
    for (std::size_t p = 8; p-- > 0;) reducer.mark_grad_ready(p);
    reducer.finalize();
  });
  double worst = 0;
  for (std::size_t k = 0; k < n; ++k) {
    double exact = 0, abs_sum = 0;
    for (int r = 0; r < world; ++r) {
      exact += original[r][k];
      abs_sum += std::fabs(original[r][k]);
    }
    exact /= world;
    const double bound = (world + 1) * unit * abs_sum / world + world * tiny;
    for (int r = 0; r < world; ++r) {
      const double err = std::fabs(grads[r][k] - exact);
      ASSERT_LE(err, bound) << hook << " element " << k << " exact " << exact;
      worst = std::max(worst, err / (abs_sum / world + 1e-30));
    }
    EXPECT_EQ(grads[0][k], grads[1][k]);
  }
  // The hook really compressed: some element is not exact to float precision.
  EXPECT_GT(worst, 1e-6) << hook;
}

TEST_P(ReducerBackends, Fp16HookWithinBound) {
  check_hook(GetParam(), "fp16", std::ldexp(1.0, -11), std::ldexp(1.0, -24));
}

TEST_P(ReducerBackends, Bf16HookWithinBound) {
  check_hook(GetParam(), "bf16", std::ldexp(1.0, -8), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Backends, ReducerBackends,
                         ::testing::Values(Backend::kThread, Backend::kGloo),
                         [](const auto& info) { return backend_name(info.param); });

}  // namespace
}  // namespace ddp::testing
