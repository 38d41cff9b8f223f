// DistributedDataParallel::reform with ReplicaState and DistributedSampler::set_position:
// a small MLP trained with momentum SGD on 3 ranks loses a rank in the middle
// of a step (the groups are aborted, as the agent does); the survivors re-form
// on a new group (alone, or with a newcomer that takes the lost rank's place),
// sync their state and go on. The global batch stays 6 samples, read in the
// order of the unshuffled sampler, so every step reduces the same samples as a
// single process with batch 6 would: the replicas must stay bit-identical and
// end within float rounding of that reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <latch>

#include <fmt/format.h>

#include "ddp/common/error.h"
#include "ddp/worker/ddp.h"
#include "ddp/worker/distributed_sampler.h"
#include "ddp/worker/replica_state.h"
#include "ddp_test_util.h"

namespace ddp::testing {
namespace {

const std::vector<int> kLayers = {6, 16, 16, 3};
constexpr float kLr = 0.1f;
constexpr float kMomentum = 0.9f;
constexpr int kGlobalBatch = 6;
constexpr std::int64_t kStepsBefore = 3;  // completed by all 3 ranks
constexpr std::int64_t kSteps = 7;        // in all
constexpr int kSamples = static_cast<int>(kSteps) * kGlobalBatch;

// v = momentum * v + g; w -= lr * v; g = 0.
void momentum_step(Mlp& m, std::vector<std::vector<float>>& velocity) {
  for (std::size_t i = 0; i < m.num_params(); ++i) {
    for (std::size_t k = 0; k < m.values[i].size(); ++k) {
      velocity[i][k] = kMomentum * velocity[i][k] + m.grads[i][k];
      m.values[i][k] -= kLr * velocity[i][k];
      m.grads[i][k] = 0.0f;
    }
  }
}

std::vector<std::vector<float>> zeros_like(const Mlp& m) {
  std::vector<std::vector<float>> out;
  for (const auto& v : m.values) out.emplace_back(v.size(), 0.0f);
  return out;
}

// One process, batch 6, consecutive samples.
Mlp train_reference(const Data& data) {
  Mlp model(kLayers);
  auto velocity = zeros_like(model);
  for (std::int64_t s = 0; s < kSteps; ++s) {
    const std::size_t off = static_cast<std::size_t>(s) * kGlobalBatch;
    model.backward(&data.x[off * kLayers.front()], &data.t[off * kLayers.back()], kGlobalBatch,
                   1.0f, {});
    momentum_step(model, velocity);
  }
  return model;
}

// One worker process: its model, optimizer state and counters. Not movable.
struct Worker {
  Mlp m;
  std::vector<std::vector<float>> velocity;
  std::int64_t step = 0;
  std::int64_t position = 0;  // samples of the epoch consumed by all ranks together
  std::unique_ptr<DistributedDataParallel> model;
  ReplicaState state;
  bool view = false;

  explicit Worker(std::uint32_t seed) : m(kLayers, seed), velocity(zeros_like(m)) {}

  std::vector<Parameter> parameters() {
    std::vector<Parameter> params;
    for (std::size_t i = 0; i < m.num_params(); ++i) {
      params.push_back({m.names[i], m.shapes[i], Buffer::of(m.values[i]),
                        Buffer::of(m.own_grads[i].data(), m.own_grads[i].size())});
    }
    return params;
  }
  void refresh_grads() {
    if (!view) return;
    for (std::size_t i = 0; i < m.num_params(); ++i)
      m.grads[i] = static_cast<float*>(model->grad(i).data);
  }
  // A process's start (fresh or a newcomer): construct DDP, register, sync.
  SyncResult start(std::shared_ptr<ProcessGroup> group, const DdpOptions& options) {
    view = options.reducer.gradient_as_bucket_view;
    model = std::make_unique<DistributedDataParallel>(group, parameters(),
                                                      std::vector<ModuleBuffer>{}, options);
    refresh_grads();
    for (std::size_t i = 0; i < m.num_params(); ++i) {
      state.add(m.names[i], Buffer::of(m.values[i]));
      state.add("momentum." + m.names[i], Buffer::of(velocity[i]));
    }
    state.add("step", &step);
    state.add("position", &position);
    return state.sync(*group);
  }
  // A survivor after the re-form.
  SyncResult reform(const std::shared_ptr<ProcessGroup>& group) {
    model->reform(group);
    refresh_grads();
    return state.sync(*group);
  }
  // Trains until `step` reaches `until`, reading this rank's share of the epoch
  // from `position` on (batch = 6 / world per rank).
  void train(const Data& data, std::int64_t until) {
    const ProcessGroup& group = model->group();
    const int world = group.size();
    const int batch = kGlobalBatch / world;
    DistributedSampler sampler(kSamples, world, group.rank(), /*shuffle=*/false);
    sampler.set_epoch(0);
    sampler.set_position(static_cast<std::size_t>(position));
    const auto indices = sampler.indices();
    std::vector<float> x(static_cast<std::size_t>(batch) * kLayers.front());
    std::vector<float> t(static_cast<std::size_t>(batch) * kLayers.back());
    for (std::size_t j = 0; step < until; ++j) {
      for (int k = 0; k < batch; ++k) {
        const auto sample = static_cast<std::size_t>(indices.at(j * batch + k));
        std::copy_n(&data.x[sample * kLayers.front()], kLayers.front(), &x[k * kLayers.front()]);
        std::copy_n(&data.t[sample * kLayers.back()], kLayers.back(), &t[k * kLayers.back()]);
      }
      model->begin_forward();
      model->begin_backward();
      m.backward(x.data(), t.data(), batch, 1.0f, [&](std::size_t i) { model->grad_ready(i); });
      model->finalize();
      refresh_grads();
      momentum_step(m, velocity);
      ++step;
      position += kGlobalBatch;
    }
  }
};

// The first step of the survivors after the loss fails: GroupChanged from
// their own aborted group, or NetworkError when Gloo saw the lost rank's
// connections close first.
void train_expecting_loss(Worker& w, const Data& data) {
  try {
    w.train(data, kSteps);
  } catch (const Error& e) {
    EXPECT_TRUE(e.kind() == ErrorKind::kGroupChanged || e.kind() == ErrorKind::kNetwork)
        << e.what();
    EXPECT_EQ(w.step, kStepsBefore);
    return;
  }
  ADD_FAILURE() << "training went on without the lost rank";
}

void expect_replicas_match(const std::vector<Worker*>& workers, const Mlp& reference,
                           const std::string& what) {
  for (std::size_t r = 0; r < workers.size(); ++r) {
    EXPECT_EQ(workers[r]->step, kSteps) << what;
    EXPECT_EQ(workers[r]->position, kSamples) << what;
    EXPECT_EQ(workers[r]->m.values, workers[0]->m.values) << what << ": rank " << r;
    EXPECT_EQ(workers[r]->velocity, workers[0]->velocity) << what << ": rank " << r;
  }
  for (std::size_t i = 0; i < reference.num_params(); ++i) {
    for (std::size_t k = 0; k < reference.values[i].size(); ++k) {
      ASSERT_NEAR(workers[0]->m.values[i][k], reference.values[i][k], 2e-5f)
          << what << ": " << reference.names[i] << "[" << k << "]";
    }
  }
}

struct ReformCase {
  Backend backend;
  bool view;
};

class DdpReform : public ::testing::TestWithParam<ReformCase> {
 protected:
  DdpOptions options() const {
    DdpOptions o;
    o.reducer.gradient_as_bucket_view = GetParam().view;
    o.reducer.first_bucket_cap_bytes = 256;  // several buckets
    o.reducer.bucket_cap_bytes = 1024;
    return o;
  }
};

// Rank 2 is lost after kStepsBefore steps; ranks 0 and 1 go on as a world of 2
// (3 samples per rank and step).
TEST_P(DdpReform, SurvivorsGoOnAlone) {
  const Data data(kSamples, kLayers.front(), kLayers.back());
  const Mlp reference = train_reference(data);
  auto groups = make_groups(GetParam().backend, 3);
  auto next = make_groups(GetParam().backend, 2);
  std::vector<std::unique_ptr<Worker>> workers;
  for (int r = 0; r < 3; ++r) workers.push_back(std::make_unique<Worker>(r == 0 ? 1u : 50u + r));
  std::latch steps_done(3);
  run_threads(3, [&](int r) {
    Worker& w = *workers[r];
    SyncResult first = w.start(groups[r], options());
    EXPECT_EQ(first.root, 0);
    w.train(data, kStepsBefore);
    steps_done.arrive_and_wait();
    if (r == 2) {
      // Lost; then the agent ends the round for everyone.
      groups[2]->abort("rank 2 lost");
      groups[0]->abort("round 1 ended: rank 2 lost");
      groups[1]->abort("round 1 ended: rank 2 lost");
      return;
    }
    train_expecting_loss(w, data);
    SyncResult sync = w.reform(next[r]);
    EXPECT_EQ(sync.root, 0);
    EXPECT_EQ(sync.received, r != 0);
    EXPECT_EQ(w.step, kStepsBefore);
    w.train(data, kSteps);
  });
  expect_replicas_match({workers[0].get(), workers[1].get()}, reference, "survivors");
}

// Rank 0 is lost; a newcomer (a fresh process with other initial values)
// takes rank 0 of the new world of 3 and receives the survivors' state, which
// rank 1 (the lowest live rank) provides. The newcomer's constructor
// broadcasts its own parameters from rank 0: the survivors' reform() must take
// part without taking them.
TEST_P(DdpReform, NewcomerTakesTheLostRanksPlace) {
  const Data data(kSamples, kLayers.front(), kLayers.back());
  const Mlp reference = train_reference(data);
  auto groups = make_groups(GetParam().backend, 3);
  auto next = make_groups(GetParam().backend, 3);
  std::vector<std::unique_ptr<Worker>> workers;
  for (int r = 0; r < 3; ++r) workers.push_back(std::make_unique<Worker>(r == 0 ? 1u : 50u + r));
  auto newcomer = std::make_unique<Worker>(999u);
  std::latch steps_done(3);
  run_threads(4, [&](int r) {
    if (r == 3) {  // the newcomer, at rank 0 of the new world
      steps_done.wait();
      SyncResult sync = newcomer->start(next[0], options());
      EXPECT_EQ(sync.root, 1);
      EXPECT_TRUE(sync.received);
      EXPECT_EQ(newcomer->step, kStepsBefore);
      EXPECT_EQ(newcomer->position, kStepsBefore * kGlobalBatch);
      newcomer->train(data, kSteps);
      return;
    }
    Worker& w = *workers[r];
    w.start(groups[r], options());
    w.train(data, kStepsBefore);
    steps_done.arrive_and_wait();
    if (r == 0) {
      groups[0]->abort("rank 0 lost");
      groups[1]->abort("round 1 ended: rank 0 lost");
      groups[2]->abort("round 1 ended: rank 0 lost");
      return;
    }
    train_expecting_loss(w, data);
    SyncResult sync = w.reform(next[r]);
    EXPECT_EQ(sync.root, 1);
    EXPECT_EQ(sync.received, r != 1);
    w.train(data, kSteps);
  });
  expect_replicas_match({newcomer.get(), workers[1].get(), workers[2].get()}, reference,
                        "newcomer and survivors");
}

INSTANTIATE_TEST_SUITE_P(Backends, DdpReform,
                         ::testing::Values(ReformCase{Backend::kThread, false},
                                           ReformCase{Backend::kThread, true},
                                           ReformCase{Backend::kGloo, false},
                                           ReformCase{Backend::kGloo, true}),
                         [](const auto& info) {
                           return fmt::format("{}_{}", backend_name(info.param.backend),
                                              info.param.view ? "bucket_view" : "own_grads");
                         });

TEST(DdpReformArguments, RejectsNullGroupAndLiveNoSyncGuard) {
  auto groups = make_groups(Backend::kThread, 1);
  Worker w(1);
  w.start(groups[0], {});
  EXPECT_THROW(w.model->reform(nullptr), InvalidArgument);
  auto next = make_groups(Backend::kThread, 1);
  {
    auto guard = w.model->no_sync();
    EXPECT_THROW(w.model->reform(next[0]), InvalidArgument);
  }
  w.model->reform(next[0]);
  EXPECT_EQ(&w.model->group(), next[0].get());
}

// reform() drops the interrupted step: the gradients of a backward pass that
// never finalized are zeroed, and the next step starts clean.
TEST(DdpReformArguments, DropsTheInterruptedStepsGradients) {
  auto groups = make_groups(Backend::kThread, 1);
  Worker w(1);
  w.start(groups[0], {});
  const Data data(2, kLayers.front(), kLayers.back());
  w.model->begin_forward();
  w.model->begin_backward();
  w.m.backward(data.x.data(), data.t.data(), 2, 1.0f, {});  // half a step: nothing marked ready
  bool any = false;
  for (const auto& g : w.m.own_grads) {
    for (float v : g) any = any || v != 0.0f;
  }
  ASSERT_TRUE(any);
  auto next = make_groups(Backend::kThread, 1);
  w.model->reform(next[0]);
  for (const auto& g : w.m.own_grads) {
    for (float v : g) ASSERT_EQ(v, 0.0f);
  }
  // A full step on the new group.
  w.model->begin_forward();
  w.model->begin_backward();
  w.m.backward(data.x.data(), data.t.data(), 2, 1.0f,
               [&](std::size_t i) { w.model->grad_ready(i); });
  w.model->finalize();
  EXPECT_EQ(w.model->stats().reducer.iterations, 1u);
}

}  // namespace
}  // namespace ddp::testing
