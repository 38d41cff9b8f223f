// Communication hooks: how the Reducer reduces one bucket of gradients.
//
// The Reducer hands each bucket to its hook twice: launch() when the bucket's
// last gradient is ready (asynchronous: it returns the Work of the collective),
// then finish() after that Work completed, which must leave in the bucket the
// AVERAGE over ranks of every rank's bucket. Buckets are launched in the same
// order on every rank, and finished in that order too.
//
// Built-in hooks:
//   allreduce_hook()        allreduce with ReduceOp::kAvg (the backend divides). Exact
//                           up to the float rounding of the sum. The default.
//   fp16_compress_hook()    float32/float64 buckets are divided by the world size,
//                           rounded to IEEE binary16, summed in binary16 and
//                           widened back: half the bytes on the wire. Bound, per
//                           element, W = world size, g_r = rank r's gradient:
//                             |result - mean_r g_r| <= (W + 1) * 2^-11 * (sum_r |g_r|) / W + W * 2^-24
//                           as long as no |g_r| / W exceeds 65504 (binary16's max).
//   bf16_compress_hook()    the same with bfloat16 (the range of float32):
//                             |result - mean_r g_r| <= (W + 1) * 2^-8 * (sum_r |g_r|) / W
//                           (the backend must support DType::kBFloat16 sums).
// Buckets that are already 16-bit are reduced by plain allreduce by every hook.
//
// Thread-safety: a hook instance belongs to one Reducer, which calls it under
// its own lock; do not share an instance between Reducers.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "ddp/worker/process_group.h"

namespace ddp {

// One bucket as a hook sees it: the flattened gradients of one dtype and device.
struct GradBucket {
  std::size_t index = 0;  // position in the launch order (0 is launched first)
  std::size_t num_buckets = 0;
  Buffer buffer;  // the bucket's memory; the hook may read and write it
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;

  // Starts reducing `bucket` among the ranks of `group`; must not block on the
  // collective. The bucket's memory stays untouched by the Reducer until finish().
  // Throws what the process group throws.
  virtual WorkPtr launch(ProcessGroup& group, const GradBucket& bucket) = 0;

  // Called after the Work returned by launch() completed successfully; leaves
  // the average over ranks in bucket.buffer.
  virtual void finish(ProcessGroup& group, const GradBucket& bucket) = 0;
};

using CommHookPtr = std::shared_ptr<CommHook>;

CommHookPtr allreduce_hook();
CommHookPtr fp16_compress_hook();
CommHookPtr bf16_compress_hook();

// "allreduce", "fp16" or "bf16" -> the hook; throws InvalidArgument otherwise.
CommHookPtr make_comm_hook(const std::string& name);

}  // namespace ddp
