// A ReLU MLP with softmax cross-entropy, forward and backward by OpenBLAS
// sgemm. Parameters in registration order: W0 [h0 x in], b0, W1, b1, ...;
// gradients are accumulated (+=) so no_sync accumulation works; backward()
// reports each gradient as soon as it is final (last layer first), which is
// what lets DDP start all-reducing while earlier layers are still computing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ddp::examples {

class Mlp {
 public:
  Mlp(std::vector<int> layers, std::uint64_t seed);

  std::size_t num_params() const { return values_.size(); }
  std::vector<float>& value(std::size_t i) { return values_[i]; }
  const std::vector<float>& value(std::size_t i) const { return values_[i]; }
  const std::vector<std::int64_t>& shape(std::size_t i) const { return shapes_[i]; }
  const std::string& name(std::size_t i) const { return names_[i]; }
  // Where backward() accumulates gradient i; defaults to the model's own memory,
  // may be pointed into DDP's buckets (gradient_as_bucket_view).
  float*& grad(std::size_t i) { return grads_[i]; }
  std::vector<float>& own_grad(std::size_t i) { return own_grads_[i]; }

  // Logits of a batch x [n x in] into out [n x classes].
  void forward(const float* x, int n, std::vector<float>& out);
  // Forward pass of a training batch: returns its mean cross-entropy loss and
  // keeps what backward() needs.
  float forward_loss(const float* x, const std::uint8_t* labels, int n);
  // grads += scale * d(loss)/d(params) of the last forward_loss(); calls ready(i)
  // as soon as gradient i is final.
  void backward(float scale, const std::function<void(std::size_t)>& ready);
  // SGD with momentum and weight decay; zeroes the gradients.
  void sgd_step(float lr, float momentum, float weight_decay);
  // Zeroes the gradients (what an interrupted step accumulated).
  void zero_grad();
  std::vector<float>& momentum(std::size_t i) { return momentum_[i]; }
  const std::vector<float>& momentum(std::size_t i) const { return momentum_[i]; }

 private:
  std::vector<int> layers_;
  std::vector<std::vector<float>> values_, own_grads_, momentum_;
  std::vector<float*> grads_;
  std::vector<std::vector<std::int64_t>> shapes_;
  std::vector<std::string> names_;
  std::vector<std::vector<float>> act_;  // activations of the last forward, per layer
  std::vector<float> delta_;             // d(loss)/d(logits) of the last forward_loss()
  int batch_ = 0;
};

}  // namespace ddp::examples
