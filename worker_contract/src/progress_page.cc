#include "ddp/worker_contract/progress_page.h"

#include <time.h>

namespace ddp::progress {

const char* to_string(Kind kind) {
  switch (kind) {
    case Kind::kNone:
      return "none";
    case Kind::kAllreduce:
      return "allreduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kAllgather:
      return "allgather";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kReduce:
      return "reduce";
    case Kind::kBarrier:
      return "barrier";
    case Kind::kAlltoall:
      return "alltoall";
    case Kind::kGather:
      return "gather";
    case Kind::kScatter:
      return "scatter";
  }
  return "unknown";
}

std::optional<Kind> kind_of(std::int64_t value) {
  if (value < 0 || value > static_cast<std::int64_t>(Kind::kScatter)) return std::nullopt;
  return static_cast<Kind>(value);
}

std::int64_t now_ns() {
  // The vDSO answers CLOCK_MONOTONIC without entering the kernel.
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace ddp::progress
