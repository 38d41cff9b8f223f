// torch tensors as ddp::Buffer views for ddp::worker's collectives.
//
// A contiguous tensor is used in place (the Buffer points at its storage); a
// non-contiguous one through a contiguous copy that write_back() copies into
// it once the collective completed. Zero-element tensors give empty Buffers.
// Every call throws c10::Error (a RuntimeError in Python) naming the
// operation and the problem: an unsupported dtype (complex, int16, ...), a
// sparse tensor, a device other than the CPU and CUDA.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "ddp/worker/process_group.h"

namespace ddp::torch_backend {

// The ddp dtype of a torch dtype; throws naming `op` and the dtype when ddp has none.
DType ddp_dtype(at::ScalarType type, const char* op);

// The ddp device of a tensor's device (CPU, or CUDA with its index).
Device ddp_device(const at::Tensor& tensor, const char* op);

// One tensor taking part in a collective. Not thread-safe; the tensor (and its
// staging copy) live as long as the StagedTensor.
class StagedTensor {
 public:
  StagedTensor(at::Tensor tensor, const char* op);

  // The view ddp reads and writes (the staging copy when there is one).
  Buffer buffer() const;
  const at::Tensor& tensor() const { return tensor_; }
  // The contiguous tensor behind buffer().
  const at::Tensor& contiguous() const { return contiguous_; }
  // Copies the staging copy back into the tensor (nothing when used in place).
  void write_back() const;

 private:
  at::Tensor tensor_;
  at::Tensor contiguous_;
};

// Checks that `tensors` all have `like`'s dtype and device; throws naming `op`.
void check_same_dtype_and_device(const std::vector<at::Tensor>& tensors, const at::Tensor& like,
                                 const char* op);
// ... and `like`'s number of elements too (the outputs of allgather, the inputs
// of scatter ...).
void check_same_shape(const std::vector<at::Tensor>& tensors, const at::Tensor& like,
                      const char* op);

}  // namespace ddp::torch_backend
