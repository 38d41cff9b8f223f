// The libtorch adapter: DistributedDataParallel for torch::nn modules (torch
// 1.13), built when libtorch is found (DDP_WITH_TORCH). Users write an
// ordinary libtorch loop:
//
//   ddp::init_process_group();
//   auto net = std::make_shared<Net>();
//   ddp::torch::DistributedDataParallel model(net, ddp::default_group());
//   torch::optim::SGD opt(net->parameters(), 0.05);
//   for (auto& batch : loader) {
//     opt.zero_grad();
//     auto loss = torch::nll_loss(model.forward(batch.data), batch.target);
//     loss.backward();   // gradients are averaged over ranks when it returns
//     opt.step();
//   }
//
// How: every parameter's gradient accumulator (AccumulateGrad) gets a post-hook
// that tells the Reducer "gradient i is ready" the moment autograd has
// accumulated it, so buckets are all-reduced while the rest of the backward
// pass runs; the first hook of a backward pass queues an autograd-engine
// callback that finalizes the Reducer before backward() returns. See reducer.h
// for bucketing, rebuild, no_sync, unused parameters and comm hooks.
//
// Construction is collective: it checks that all ranks have the same
// parameters (count, shapes, dtypes; InvalidArgument otherwise), copies rank 0's
// parameters and buffers to every rank, and gives every parameter a gradient
// tensor (with gradient_as_bucket_view a view into the Reducer's buckets).
// Only CPU, contiguous, floating-point parameters are supported (InvalidArgument
// otherwise). optimizer.zero_grad() may zero the gradients or set them to
// undefined; either works. The module and the group must outlive this object.
// Errors inside backward() (a missing gradient without find_unused_parameters,
// a failed collective) propagate out of loss.backward(); afterwards the object
// is unusable and forward() throws InvalidArgument saying so.
// Linking: users link ddp::worker and ${TORCH_LIBRARIES}.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <utility>
#include <vector>

#include "ddp/worker/ddp.h"
#include "ddp/worker/process_group.h"
#include "ddp/worker/reducer.h"

namespace ddp::torch {

struct DistributedDataParallelOptions {
  ReducerOptions reducer;         // bucket caps, hooks, find_unused_parameters, ...
  bool broadcast_buffers = true;  // rank 0's module buffers before every forward()
  bool check_consistency = true;  // the cross-rank parameter check at construction
};

// The framework glue without the module's forward() type; see the template below.
class DistributedDataParallelBase {
 public:
  DistributedDataParallelBase(std::shared_ptr<::torch::nn::Module> module,
                              std::shared_ptr<ProcessGroup> group,
                              DistributedDataParallelOptions options);
  virtual ~DistributedDataParallelBase();
  DistributedDataParallelBase(const DistributedDataParallelBase&) = delete;
  DistributedDataParallelBase& operator=(const DistributedDataParallelBase&) = delete;

  // Iterations whose backward starts while the guard lives do not communicate.
  [[nodiscard]] Reducer::NoSyncGuard no_sync() { return reducer_->no_sync(); }
  Reducer& reducer() { return *reducer_; }
  const ReducerStats& stats() const { return reducer_->stats(); }
  ProcessGroup& group() { return *group_; }
  // Registered parameters, in registration order (the Reducer's indices).
  const std::vector<::torch::Tensor>& parameters() const { return params_; }

  // Called by forward(): broadcasts buffers when enabled.
  void pre_forward();

 private:
  class ReadyHook;
  void on_grad_ready(std::size_t i);
  void finalize_backward();
  void point_grads_at_buckets();

  std::shared_ptr<::torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DistributedDataParallelOptions options_;
  std::vector<::torch::Tensor> params_;
  std::vector<::torch::Tensor> buffers_;
  std::vector<::torch::Tensor> grads_;  // stable gradient memory registered with the Reducer
  std::vector<std::shared_ptr<::torch::autograd::Node>>
      accumulators_;  // kept alive: hooks live there
  std::unique_ptr<Reducer> reducer_;
  std::uint64_t layout_version_ = 0;
  bool callback_queued_ = false;
  std::shared_ptr<bool> alive_;
};

// The module-typed wrapper: forward(args...) calls module->forward(args...).
// `ModulePtr` is a std::shared_ptr<M> or a torch ModuleHolder (TORCH_MODULE).
template <typename ModulePtr>
class DistributedDataParallel : public DistributedDataParallelBase {
 public:
  DistributedDataParallel(ModulePtr module, std::shared_ptr<ProcessGroup> group,
                          DistributedDataParallelOptions options = {})
      : DistributedDataParallelBase(as_module(module), std::move(group), std::move(options)),
        module_(std::move(module)) {}

  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    pre_forward();
    return module_->forward(std::forward<Args>(args)...);
  }
  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }
  ModulePtr& module() { return module_; }

 private:
  static std::shared_ptr<::torch::nn::Module> as_module(const ModulePtr& m) {
    if constexpr (requires { m.ptr(); }) {
      return m.ptr();
    } else {
      return std::static_pointer_cast<::torch::nn::Module>(m);
    }
  }
  ModulePtr module_;
};

}  // namespace ddp::torch
