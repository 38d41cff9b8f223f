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

// divide_by(data, ...) and then a copy of the result into `copy` (count elements,
// not overlapping `data`), in one pass where the dtype allows: the same bits as
// divide_by followed by memcpy, one read of `data` fewer. What the shared-memory
// all-reduce does with its share of an average.
void divide_and_copy(void* data, void* copy, std::size_t count, DType dtype, int divisor);

}  // namespace ddp::detail
