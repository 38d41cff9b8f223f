#include "ddp/worker/comm_hooks.h"

#include <cstdint>
#include <vector>

#include "ddp/common/error.h"
#include "grad_ops.h"

namespace ddp {
namespace {

class AllreduceHook final : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  WorkPtr launch(ProcessGroup& group, const GradBucket& bucket) override {
    // The backend divides on its own thread (the Gloo shared-memory path even
    // fuses it into the reduction), keeping the division off the training thread.
    return group.allreduce(bucket.buffer, ReduceOp::kAvg);
  }
  void finish(ProcessGroup&, const GradBucket&) override {}
};

template <typename T16, DType kWire>
class CompressHook final : public CommHook {
 public:
  explicit CompressHook(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }

  WorkPtr launch(ProcessGroup& group, const GradBucket& bucket) override {
    if (scratch_.size() < bucket.num_buckets) scratch_.resize(bucket.num_buckets);
    const Buffer& b = bucket.buffer;
    if (b.dtype != DType::kFloat32 && b.dtype != DType::kFloat64) {
      scratch_[bucket.index].clear();  // already 16-bit: nothing to compress
      return group.allreduce(b, ReduceOp::kSum);
    }
    auto& wire = scratch_[bucket.index];
    wire.resize(b.count);
    // Divide before narrowing (as PyTorch's hooks do) so the sum of W values
    // stays within binary16's range whenever each value does.
    grad_ops::compress<T16>(b, wire.data(), 1.0f / static_cast<float>(group.size()));
    return group.allreduce(Buffer{wire.data(), wire.size(), kWire, b.device}, ReduceOp::kSum);
  }

  void finish(ProcessGroup& group, const GradBucket& bucket) override {
    const Buffer& b = bucket.buffer;
    if (b.dtype != DType::kFloat32 && b.dtype != DType::kFloat64) {
      if (group.size() > 1) grad_ops::scale(b, 1.0 / group.size());
      return;
    }
    grad_ops::decompress<T16>(scratch_.at(bucket.index).data(), b);
  }

 private:
  std::string name_;
  std::vector<std::vector<std::uint16_t>> scratch_;  // per bucket index, reused every step
};

}  // namespace

CommHookPtr allreduce_hook() { return std::make_shared<AllreduceHook>(); }
CommHookPtr fp16_compress_hook() {
  return std::make_shared<CompressHook<Half, DType::kFloat16>>("fp16");
}
CommHookPtr bf16_compress_hook() {
  return std::make_shared<CompressHook<BFloat16, DType::kBFloat16>>("bf16");
}

CommHookPtr make_comm_hook(const std::string& name) {
  if (name == "allreduce") return allreduce_hook();
  if (name == "fp16") return fp16_compress_hook();
  if (name == "bf16") return bf16_compress_hook();
  throw InvalidArgument("make_comm_hook",
                        "unknown comm hook '" + name + "' (expected allreduce, fp16 or bf16)");
}

}  // namespace ddp
