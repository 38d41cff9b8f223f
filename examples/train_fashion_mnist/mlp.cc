#include "mlp.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace ddp::examples {

Mlp::Mlp(std::vector<int> layers, std::uint64_t seed) : layers_(std::move(layers)) {
  std::mt19937_64 gen(seed);
  for (std::size_t l = 0; l + 1 < layers_.size(); ++l) {
    const int in = layers_[l], out = layers_[l + 1];
    // He initialization for ReLU layers.
    std::normal_distribution<float> dist(0.0f, std::sqrt(2.0f / static_cast<float>(in)));
    std::vector<float> w(static_cast<std::size_t>(in) * out);
    for (auto& v : w) v = dist(gen);
    values_.push_back(std::move(w));
    values_.emplace_back(static_cast<std::size_t>(out), 0.0f);
    shapes_.push_back({out, in});
    shapes_.push_back({out});
    names_.push_back("fc" + std::to_string(l) + ".weight");
    names_.push_back("fc" + std::to_string(l) + ".bias");
  }
  for (const auto& v : values_) {
    own_grads_.emplace_back(v.size(), 0.0f);
    momentum_.emplace_back(v.size(), 0.0f);
  }
  for (auto& g : own_grads_) grads_.push_back(g.data());
}

void Mlp::forward(const float* x, int n, std::vector<float>& out) {
  const std::size_t nl = layers_.size() - 1;
  act_.resize(nl + 1);
  act_[0].assign(x, x + static_cast<std::size_t>(n) * layers_[0]);
  for (std::size_t l = 0; l < nl; ++l) {
    const int in = layers_[l], outn = layers_[l + 1];
    auto& z = act_[l + 1];
    z.resize(static_cast<std::size_t>(n) * outn);
    const auto& b = values_[2 * l + 1];
    for (int s = 0; s < n; ++s)
      std::copy(b.begin(), b.end(), z.begin() + static_cast<std::ptrdiff_t>(s) * outn);
    // z = x W^T + b
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, outn, in, 1.0f, act_[l].data(), in,
                values_[2 * l].data(), in, 1.0f, z.data(), outn);
    if (l + 1 < nl) {
      for (auto& v : z) v = std::max(v, 0.0f);
    }
  }
  out = act_[nl];
}

float Mlp::forward_loss(const float* x, const std::uint8_t* labels, int n) {
  std::vector<float> logits;
  forward(x, n, logits);
  const int classes = layers_.back();
  batch_ = n;
  auto& delta = delta_;
  delta.assign(static_cast<std::size_t>(n) * classes, 0.0f);
  double loss = 0;
  for (int s = 0; s < n; ++s) {
    const float* z = &logits[static_cast<std::size_t>(s) * classes];
    const float m = *std::max_element(z, z + classes);
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c] - m));
    loss += std::log(sum) - (z[labels[s]] - m);
    for (int c = 0; c < classes; ++c) {
      const double p = std::exp(static_cast<double>(z[c] - m)) / sum;
      delta[static_cast<std::size_t>(s) * classes + c] =
          static_cast<float>((p - (c == labels[s] ? 1.0 : 0.0)) / n);
    }
  }
  return static_cast<float>(loss / n);
}

void Mlp::backward(float scale, const std::function<void(std::size_t)>& ready) {
  const std::size_t nl = layers_.size() - 1;
  const int n = batch_;
  std::vector<float> delta = delta_;
  if (scale != 1.0f) {
    for (auto& d : delta) d *= scale;
  }
  for (std::size_t l = nl; l-- > 0;) {
    const int in = layers_[l], out = layers_[l + 1];
    // gW += delta^T a_l ; gb += column sums of delta
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1.0f, delta.data(), out,
                act_[l].data(), in, 1.0f, grads_[2 * l], in);
    if (ready) ready(2 * l);
    float* gb = grads_[2 * l + 1];
    for (int s = 0; s < n; ++s) {
      for (int o = 0; o < out; ++o) gb[o] += delta[static_cast<std::size_t>(s) * out + o];
    }
    if (ready) ready(2 * l + 1);
    if (l == 0) break;
    std::vector<float> prev(static_cast<std::size_t>(n) * in);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, delta.data(), out,
                values_[2 * l].data(), in, 0.0f, prev.data(), in);
    const auto& a = act_[l];
    for (std::size_t k = 0; k < prev.size(); ++k) {
      if (a[k] <= 0.0f) prev[k] = 0.0f;
    }
    delta.swap(prev);
  }
}

void Mlp::sgd_step(float lr, float momentum, float weight_decay) {
  for (std::size_t i = 0; i < values_.size(); ++i) {
    auto& v = values_[i];
    auto& m = momentum_[i];
    float* g = grads_[i];
    const bool decay = (i % 2 == 0);  // weights only, not biases
    for (std::size_t k = 0; k < v.size(); ++k) {
      const float d = g[k] + (decay ? weight_decay * v[k] : 0.0f);
      m[k] = momentum * m[k] + d;
      v[k] -= lr * m[k];
      g[k] = 0.0f;
    }
  }
}

void Mlp::zero_grad() {
  for (std::size_t i = 0; i < values_.size(); ++i) std::fill_n(grads_[i], values_[i].size(), 0.0f);
}

}  // namespace ddp::examples
