// Shared pieces of the DDP tests: ranks as threads over the thread test double
// or real Gloo (MemoryStore), and a small tanh MLP with a hand-written backward
// that reports each gradient as soon as it is final, like autograd hooks do.
#pragma once

#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../test_util.h"
#include "ddp/store/memory_store.h"
#include "ddp/worker/process_group.h"
#include "ddp/worker/process_group_gloo.h"
#include "thread_process_group.h"

namespace ddp::testing {

enum class Backend { kThread, kGloo };

inline std::string backend_name(Backend b) { return b == Backend::kThread ? "thread" : "gloo"; }

using ::ddp::test::run_threads;

inline std::vector<std::shared_ptr<ProcessGroup>> make_groups(
    Backend backend, int n, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  std::vector<std::shared_ptr<ProcessGroup>> groups(n);
  if (backend == Backend::kThread) {
    auto world = std::make_shared<ThreadWorld>(n, timeout);
    for (int r = 0; r < n; ++r) groups[r] = std::make_shared<ThreadProcessGroup>(world, r);
    return groups;
  }
  auto store = std::make_shared<MemoryStore>();
  GlooOptions options;
  options.hostname = "127.0.0.1";
  options.timeout = timeout;
  run_threads(n, [&](int r) { groups[r] = make_gloo_process_group(store, r, n, options); });
  return groups;
}

// A tanh MLP: layers[0] inputs -> ... -> layers.back() outputs, loss = mean over
// the batch of 0.5 * ||y - t||^2. Parameters in registration order:
// W0 [l1 x l0], b0 [l1], W1, b1, ...
class Mlp {
 public:
  explicit Mlp(std::vector<int> layers, std::uint32_t seed = 1) : layers_(std::move(layers)) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (std::size_t l = 0; l + 1 < layers_.size(); ++l) {
      const int in = layers_[l], out = layers_[l + 1];
      std::vector<float> w(static_cast<std::size_t>(in * out)), b(static_cast<std::size_t>(out));
      for (auto& v : w) v = dist(gen) / std::sqrt(static_cast<float>(in));
      for (auto& v : b) v = 0.1f * dist(gen);
      values.push_back(std::move(w));
      values.push_back(std::move(b));
      shapes.push_back({out, in});
      shapes.push_back({out});
      names.push_back("layer" + std::to_string(l) + ".weight");
      names.push_back("layer" + std::to_string(l) + ".bias");
    }
    own_grads.resize(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) own_grads[i].assign(values[i].size(), 0.0f);
    for (auto& g : own_grads) grads.push_back(g.data());
  }

  std::size_t num_params() const { return values.size(); }

  // grads += scale * d(loss)/d(params) for the batch x [n x in], t [n x out];
  // calls ready(i) once gradient i is final, last layer first (weight, then bias).
  void backward(const float* x, const float* t, int n, float scale,
                const std::function<void(std::size_t)>& ready) {
    const std::size_t nl = layers_.size() - 1;
    std::vector<std::vector<float>> act(nl + 1);
    act[0].assign(x, x + static_cast<std::size_t>(n) * layers_[0]);
    for (std::size_t l = 0; l < nl; ++l) {
      const int in = layers_[l], out = layers_[l + 1];
      act[l + 1].assign(static_cast<std::size_t>(n) * out, 0.0f);
      const auto& w = values[2 * l];
      const auto& b = values[2 * l + 1];
      for (int s = 0; s < n; ++s) {
        for (int o = 0; o < out; ++o) {
          float z = b[o];
          for (int i = 0; i < in; ++i) z += w[o * in + i] * act[l][s * in + i];
          act[l + 1][s * out + o] = (l + 1 < nl) ? std::tanh(z) : z;
        }
      }
    }
    const int last = layers_.back();
    std::vector<float> delta(static_cast<std::size_t>(n) * last);
    for (std::size_t k = 0; k < delta.size(); ++k) delta[k] = (act[nl][k] - t[k]) * scale / n;
    for (std::size_t l = nl; l-- > 0;) {
      const int in = layers_[l], out = layers_[l + 1];
      float* gw = grads[2 * l];
      float* gb = grads[2 * l + 1];
      for (int s = 0; s < n; ++s) {
        for (int o = 0; o < out; ++o) {
          const float d = delta[s * out + o];
          for (int i = 0; i < in; ++i) gw[o * in + i] += d * act[l][s * in + i];
        }
      }
      if (ready) ready(2 * l);
      for (int s = 0; s < n; ++s) {
        for (int o = 0; o < out; ++o) gb[o] += delta[s * out + o];
      }
      if (ready) ready(2 * l + 1);
      if (l == 0) break;
      std::vector<float> prev(static_cast<std::size_t>(n) * in, 0.0f);
      const auto& w = values[2 * l];
      for (int s = 0; s < n; ++s) {
        for (int i = 0; i < in; ++i) {
          float acc = 0;
          for (int o = 0; o < out; ++o) acc += w[o * in + i] * delta[s * out + o];
          const float a = act[l][s * in + i];
          prev[s * in + i] = acc * (1.0f - a * a);
        }
      }
      delta.swap(prev);
    }
  }

  void sgd_step(float lr) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      for (std::size_t k = 0; k < values[i].size(); ++k) {
        values[i][k] -= lr * grads[i][k];
        grads[i][k] = 0.0f;
      }
    }
  }

  std::uint64_t checksum() const {
    std::uint64_t h = 1469598103934665603ull;
    for (const auto& v : values) {
      const auto* p = reinterpret_cast<const unsigned char*>(v.data());
      for (std::size_t k = 0; k < v.size() * sizeof(float); ++k) {
        h ^= p[k];
        h *= 1099511628211ull;
      }
    }
    return h;
  }

  std::vector<int> layers_;
  std::vector<std::vector<float>> values;
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<std::string> names;
  std::vector<std::vector<float>> own_grads;
  std::vector<float*> grads;  // where backward accumulates (own_grads or bucket views)
};

// Deterministic data set: n samples of `in` inputs and `out` targets.
struct Data {
  std::vector<float> x, t;
  Data(int n, int in, int out, std::uint32_t seed = 7) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    x.resize(static_cast<std::size_t>(n) * in);
    t.resize(static_cast<std::size_t>(n) * out);
    for (auto& v : x) v = dist(gen);
    for (auto& v : t) v = dist(gen);
  }
};

}  // namespace ddp::testing
