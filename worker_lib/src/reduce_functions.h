// Element-wise reduction kernels for every DType and ReduceOp, in the shape
// Gloo's algorithms call them: out[i] = a[i] op b[i] (out may alias a or b).
#pragma once

#include <cstddef>

#include "ddp/worker/process_group.h"

namespace ddp::detail {

using ReduceFn = void (*)(void* out, const void* a, const void* b, std::size_t n);

// The kernel for `op` on `dtype` (kAvg gives the SUM kernel: divide afterwards
// with divide_by). Throws InvalidArgument for an unknown combination.
ReduceFn reduce_function(DType dtype, ReduceOp op);

// data[i] /= divisor, in the dtype's arithmetic (integers truncate toward zero).
void divide_by(void* data, std::size_t count, DType dtype, int divisor);

}  // namespace ddp::detail
