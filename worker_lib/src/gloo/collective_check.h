// DDP_DEBUG=DETAIL: a fixed-size description of one collective call, exchanged
// among the ranks before the collective runs so that a rank calling a different
// operation, size, dtype or root is reported instead of hanging the group; and
// the check of an all-to-all's per-peer counts, which every all-to-all makes.
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
  kBarrier,
  kGather,
  kScatter,
  kAlltoall,
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
  // Elements of the input buffer (scatter: of the output buffer, the one every
  // rank has). An all-to-all's counts may differ among ranks: they are checked
  // by find_alltoall_mismatch instead, and neither compared nor described here.
  std::uint64_t count = 0;

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

// One rank's side of an all-to-all: the element size of its dtype and its
// element counts to (input) and from (output) each rank.
struct AlltoallCounts {
  DType dtype = DType::kUInt8;
  std::vector<std::uint64_t> input;
  std::vector<std::uint64_t> output;

  // [dtype, input..., output...]: 1 + 2 x size words.
  std::vector<std::uint64_t> encode() const;
  // Throws ProtocolError when `words` (1 + 2 x size of them) is not an encoding.
  static AlltoallCounts decode(const std::uint64_t* words, std::size_t size);
};

// Empty when the ranks agree (same dtype; rank i's input count to j equals rank
// j's output count from i, for every pair); otherwise a message naming the
// ranks, the dtypes or the counts that differ.
std::string find_alltoall_mismatch(const std::vector<AlltoallCounts>& per_rank);

}  // namespace ddp::detail
