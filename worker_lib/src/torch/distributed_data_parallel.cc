#include "ddp/worker/torch/distributed_data_parallel.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <fmt/format.h>

#include "ddp/common/error.h"

namespace ddp::torch {
namespace {

constexpr const char* kOrigin = "ddp::torch::DistributedDataParallel";

DType to_dtype(c10::ScalarType t, const std::string& what) {
  switch (t) {
    case c10::ScalarType::Float:
      return DType::kFloat32;
    case c10::ScalarType::Double:
      return DType::kFloat64;
    case c10::ScalarType::Half:
      return DType::kFloat16;
    case c10::ScalarType::BFloat16:
      return DType::kBFloat16;
    case c10::ScalarType::Int:
      return DType::kInt32;
    case c10::ScalarType::Long:
      return DType::kInt64;
    case c10::ScalarType::Byte:
      return DType::kUInt8;
    case c10::ScalarType::Char:
      return DType::kInt8;
    case c10::ScalarType::Bool:
      return DType::kBool;
    default:
      throw InvalidArgument(kOrigin,
                            fmt::format("{} has unsupported dtype {}", what, c10::toString(t)));
  }
}

Buffer to_buffer(const ::torch::Tensor& t, const std::string& what) {
  if (!t.device().is_cpu()) {
    throw InvalidArgument(kOrigin,
                          what + " is not on the CPU (the adapter supports CPU tensors only)");
  }
  if (!t.is_contiguous()) throw InvalidArgument(kOrigin, what + " is not contiguous");
  return Buffer{t.data_ptr(), static_cast<std::size_t>(t.numel()), to_dtype(t.scalar_type(), what),
                Device::cpu()};
}

}  // namespace

// Runs after AccumulateGrad stored the parameter's gradient for this backward pass.
class DistributedDataParallelBase::ReadyHook final : public ::torch::autograd::FunctionPostHook {
 public:
  ReadyHook(DistributedDataParallelBase* owner, std::size_t index, std::shared_ptr<bool> alive)
      : owner_(owner), index_(index), alive_(std::move(alive)) {}
  ::torch::autograd::variable_list operator()(const ::torch::autograd::variable_list& outputs,
                                              const ::torch::autograd::variable_list&) override {
    if (*alive_) owner_->on_grad_ready(index_);
    return outputs;
  }

 private:
  DistributedDataParallelBase* owner_;
  std::size_t index_;
  std::shared_ptr<bool> alive_;
};

DistributedDataParallelBase::DistributedDataParallelBase(
    std::shared_ptr<::torch::nn::Module> module, std::shared_ptr<ProcessGroup> group,
    DistributedDataParallelOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(std::move(options)),
      alive_(std::make_shared<bool>(true)) {
  if (!module_) throw InvalidArgument(kOrigin, "the module is null");
  if (!group_) throw InvalidArgument(kOrigin, "the process group is null");
  std::vector<std::string> names;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    params_.push_back(item.value());
    names.push_back(item.key());
  }
  for (const auto& b : module_->buffers(/*recurse=*/true)) buffers_.push_back(b);

  std::vector<TensorMeta> metas;
  std::vector<Buffer> values;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::string what = fmt::format("parameter {} ('{}')", i, names[i]);
    Buffer b = to_buffer(params_[i], what);
    if (b.dtype != DType::kFloat32 && b.dtype != DType::kFloat64 && b.dtype != DType::kFloat16 &&
        b.dtype != DType::kBFloat16) {
      throw InvalidArgument(kOrigin, what + " is not floating point");
    }
    metas.push_back({names[i], params_[i].sizes().vec(), b.dtype});
    values.push_back(b);
  }
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    values.push_back(to_buffer(buffers_[i], fmt::format("buffer {}", i)));
  }
  if (options_.check_consistency) check_parameter_consistency(*group_, metas);
  {
    ::torch::NoGradGuard no_grad;
    broadcast_coalesced(*group_, values, 0);
  }

  const bool view = options_.reducer.gradient_as_bucket_view;
  std::vector<GradientSpec> specs;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Buffer g = values[i];
    if (view) {
      g.data = nullptr;
    } else {
      grads_.push_back(::torch::zeros_like(params_[i], ::torch::MemoryFormat::Contiguous));
      params_[i].mutable_grad() = grads_.back();
      g.data = grads_.back().data_ptr();
    }
    specs.push_back({names[i], params_[i].sizes().vec(), g});
  }
  reducer_ = std::make_unique<Reducer>(group_, std::move(specs), options_.reducer);
  if (view) point_grads_at_buckets();

  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto acc = ::torch::autograd::impl::grad_accumulator(params_[i]);
    if (!acc)
      throw InternalError(kOrigin, fmt::format("parameter {} has no gradient accumulator", i));
    acc->add_post_hook(std::make_unique<ReadyHook>(this, i, alive_));
    accumulators_.push_back(std::move(acc));
  }
}

DistributedDataParallelBase::~DistributedDataParallelBase() {
  // The accumulators (and the hooks on them) may outlive this object.
  *alive_ = false;
}

void DistributedDataParallelBase::point_grads_at_buckets() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Buffer b = reducer_->grad(i);
    auto grad =
        ::torch::from_blob(b.data, params_[i].sizes(), params_[i].options().requires_grad(false));
    params_[i].mutable_grad() = grad;
  }
  layout_version_ = reducer_->layout_version();
}

void DistributedDataParallelBase::pre_forward() {
  if (callback_queued_) {
    // The engine dropped our finalize callback: the last backward pass failed
    // midway, so the Reducer's iteration can never complete consistently.
    throw InvalidArgument(kOrigin,
                          "the previous backward pass did not complete (it threw); gradients "
                          "were not synchronized and this DistributedDataParallel is unusable");
  }
  if (!options_.broadcast_buffers || buffers_.empty() || group_->size() == 1) return;
  ::torch::NoGradGuard no_grad;
  std::vector<Buffer> values;
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    values.push_back(to_buffer(buffers_[i], fmt::format("buffer {}", i)));
  }
  broadcast_coalesced(*group_, values, 0);
}

void DistributedDataParallelBase::on_grad_ready(std::size_t i) {
  if (!callback_queued_) {
    // Finalize when the whole backward pass is done, before backward() returns.
    callback_queued_ = true;
    auto alive = alive_;
    ::torch::autograd::Engine::get_default_engine().queue_callback([this, alive] {
      if (*alive) finalize_backward();
    });
  }
  // The Reducer reads (or, with bucket views, owns) fixed memory. When autograd
  // gave the parameter a new gradient tensor (zero_grad(set_to_none) or a first
  // backward), move the values into that memory and point .grad back at it.
  ::torch::Tensor& grad = params_[i].mutable_grad();
  const Buffer expected = reducer_->grad(i);
  if (!grad.defined() || grad.data_ptr() != expected.data) {
    ::torch::NoGradGuard no_grad;
    auto fixed = options_.reducer.gradient_as_bucket_view
                     ? ::torch::from_blob(expected.data, params_[i].sizes(),
                                          params_[i].options().requires_grad(false))
                     : grads_[i];
    if (grad.defined()) {
      fixed.copy_(grad);
    } else {
      fixed.zero_();
    }
    grad = fixed;
  }
  try {
    reducer_->mark_grad_ready(i);
  } catch (...) {
    callback_queued_ = false;  // the engine drops queued callbacks when a hook throws
    throw;
  }
}

void DistributedDataParallelBase::finalize_backward() {
  callback_queued_ = false;
  reducer_->finalize();
  if (options_.reducer.gradient_as_bucket_view && reducer_->layout_version() != layout_version_) {
    point_grads_at_buckets();  // the buckets were rebuilt: the views moved (values kept)
  }
}

}  // namespace ddp::torch
