#include "ddp/worker/process_group.h"

#include <fmt/format.h>

#include <chrono>
#include <exception>
#include <utility>
#include <vector>

#include "ddp/common/error.h"

namespace ddp {

std::size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kFloat16:
      return 2;
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kBool:
      return 1;
  }
  throw InvalidArgument("element_size", fmt::format("unknown dtype {}", static_cast<int>(dtype)));
}

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt8:
      return "int8";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kProduct:
      return "product";
    case ReduceOp::kBand:
      return "band";
    case ReduceOp::kBor:
      return "bor";
    case ReduceOp::kBxor:
      return "bxor";
  }
  return "unknown";
}

std::string Device::str() const {
  return is_cuda() ? fmt::format("cuda:{}", index) : std::string("cpu");
}

namespace {

// The default broadcast_many()'s Work: one broadcast() a buffer, issued in order.
class BroadcastsWork final : public Work {
 public:
  explicit BroadcastsWork(std::vector<WorkPtr> works) : works_(std::move(works)) {}

  bool wait(std::chrono::milliseconds timeout) override {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (const WorkPtr& w : works_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (timeout.count() > 0 && left.count() <= 0) return false;
      if (!w->wait(timeout.count() > 0 ? left : timeout)) return false;
    }
    return true;
  }
  bool is_completed() const override {
    for (const WorkPtr& w : works_) {
      if (!w->is_completed()) return false;
    }
    return true;
  }
  std::exception_ptr exception() const override {
    for (const WorkPtr& w : works_) {
      if (auto e = w->exception()) return e;
    }
    return nullptr;
  }
  std::uint64_t sequence_number() const override {
    return works_.empty() ? 0 : works_.back()->sequence_number();
  }

 private:
  std::vector<WorkPtr> works_;
};

}  // namespace

WorkPtr ProcessGroup::broadcast_many(std::vector<Buffer> buffers, int root) {
  std::vector<WorkPtr> works;
  works.reserve(buffers.size());
  for (const Buffer& b : buffers) works.push_back(broadcast(b, root));
  return std::make_shared<BroadcastsWork>(std::move(works));
}

}  // namespace ddp
