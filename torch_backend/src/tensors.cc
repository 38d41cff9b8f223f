#include "tensors.h"

#include <c10/util/Exception.h>

namespace ddp::torch_backend {

DType ddp_dtype(at::ScalarType type, const char* op) {
  switch (type) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kDouble:
      return DType::kFloat64;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kChar:
      return DType::kInt8;
    case at::kByte:
      return DType::kUInt8;
    case at::kInt:
      return DType::kInt32;
    case at::kLong:
      return DType::kInt64;
    case at::kBool:
      return DType::kBool;
    default:
      TORCH_CHECK(false, "ddp backend: ", op, " does not support dtype ", c10::toString(type),
                  " (supported: float16, bfloat16, float32, float64, int8, uint8, int32, "
                  "int64, bool)");
  }
}

Device ddp_device(const at::Tensor& tensor, const char* op) {
  TORCH_CHECK(tensor.layout() == at::kStrided, "ddp backend: ", op,
              " supports only dense tensors, got layout ", tensor.layout());
  if (tensor.is_cpu()) return Device::cpu();
  TORCH_CHECK(tensor.is_cuda(), "ddp backend: ", op,
              " supports CPU and CUDA tensors, got a tensor on ", tensor.device().str());
  return Device::cuda(tensor.device().index());
}

StagedTensor::StagedTensor(at::Tensor tensor, const char* op)
    : tensor_(std::move(tensor)), contiguous_(tensor_.contiguous()) {
  ddp_dtype(tensor_.scalar_type(), op);
  ddp_device(tensor_, op);
}

Buffer StagedTensor::buffer() const {
  Buffer buffer;
  buffer.count = static_cast<std::size_t>(contiguous_.numel());
  buffer.data = buffer.count == 0 ? nullptr : contiguous_.data_ptr();
  buffer.dtype = ddp_dtype(contiguous_.scalar_type(), "collective");
  buffer.device = ddp_device(contiguous_, "collective");
  return buffer;
}

void StagedTensor::write_back() const {
  if (!contiguous_.is_same(tensor_)) tensor_.copy_(contiguous_);
}

void check_same_dtype_and_device(const std::vector<at::Tensor>& tensors, const at::Tensor& like,
                                 const char* op) {
  for (const auto& tensor : tensors) {
    TORCH_CHECK(tensor.scalar_type() == like.scalar_type(), "ddp backend: ", op,
                ": tensors of different dtypes (", c10::toString(tensor.scalar_type()), " and ",
                c10::toString(like.scalar_type()), ")");
    TORCH_CHECK(tensor.device() == like.device(), "ddp backend: ", op,
                ": tensors on different devices (", tensor.device().str(), " and ",
                like.device().str(), ")");
  }
}

void check_same_shape(const std::vector<at::Tensor>& tensors, const at::Tensor& like,
                      const char* op) {
  check_same_dtype_and_device(tensors, like, op);
  for (const auto& tensor : tensors) {
    TORCH_CHECK(tensor.numel() == like.numel(), "ddp backend: ", op,
                ": tensors of different sizes (", tensor.numel(), " and ", like.numel(),
                " elements)");
  }
}

}  // namespace ddp::torch_backend
