// DDP_DEBUG=DETAIL: a fixed-size description of one collective call, exchanged
// among the ranks before the collective runs so that a rank calling a different
// operation, size or dtype is reported instead of hanging the group.
// Pure logic (no I/O) so it is unit-tested directly.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/worker/process_group.h"
#include "ddp/worker_contract/progress_page.h"

namespace ddp::detail {

enum class CollectiveOp : std::uint8_t {
  kAllreduce,
  kBroadcast,
  kAllgather,
  kReduceScatter,
  kReduce,
  kBarrier
};
const char* to_string(CollectiveOp op);
// The progress page's name for it.
progress::Kind progress_kind(CollectiveOp op);

struct CollectiveDescriptor {
  CollectiveOp op = CollectiveOp::kBarrier;
  DType dtype = DType::kUInt8;
  ReduceOp reduce_op = ReduceOp::kSum;
  std::int32_t root = -1;
  std::uint64_t seq = 0;
  std::uint64_t count = 0;  // elements of the (input) buffer

  static constexpr std::size_t kEncodedSize = 32;
  std::array<std::uint8_t, kEncodedSize> encode() const;
  // Throws ProtocolError when the bytes are not an encoded descriptor.
  static CollectiveDescriptor decode(const std::uint8_t* bytes);

  // "allreduce(seq=3, count=100, dtype=float32, op=sum)"
  std::string describe() const;
  friend bool operator==(const CollectiveDescriptor&, const CollectiveDescriptor&) = default;
};

// Empty when every rank's descriptor matches; otherwise a message naming each
// group of ranks and the call they made.
std::string find_mismatch(const std::vector<CollectiveDescriptor>& per_rank);

}  // namespace ddp::detail
