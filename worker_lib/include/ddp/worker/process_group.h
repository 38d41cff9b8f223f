// The process group: collectives among the ranks of one group.
//
// Contract shared by every backend (Gloo on CPU, NCCL on CUDA):
// - Every collective is asynchronous: it returns a Work at once and runs on the
//   backend's own thread(s) (or CUDA stream), never blocking the caller until
//   Work::wait. Collectives of one group run in the order they were issued, and
//   every rank must issue the same collectives in the same order.
// - Buffers are views: the caller owns the memory and keeps it alive and
//   untouched until the Work completes.
// - A collective that does not complete within the group's timeout fails its
//   Work with TimeoutError naming the operation, its sequence number and the
//   ranks that did not arrive (when the backend can tell).
// - Methods are thread-safe; issue order across threads is the order in which
//   the calls took the group's lock.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace ddp {

struct Half;      // half.h
struct BFloat16;  // half.h

// kInt8 is signed; kBool is one byte holding 0 or 1 (like torch.bool).
enum class DType : std::uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt32,
  kInt64,
  kUInt8,
  kInt8,
  kBool,
};

std::size_t element_size(DType dtype);
const char* to_string(DType dtype);

struct Device {
  enum class Type : std::uint8_t { kCpu, kCuda };
  Type type = Type::kCpu;
  int index = -1;  // CUDA device ordinal; -1 for the CPU

  static Device cpu() { return {}; }
  static Device cuda(int index) { return {Type::kCuda, index}; }
  bool is_cuda() const { return type == Type::kCuda; }
  std::string str() const;  // "cpu" or "cuda:N"
  friend bool operator==(const Device&, const Device&) = default;
};

// A typed view of memory owned by the caller.
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;  // number of elements
  DType dtype = DType::kFloat32;
  Device device = Device::cpu();

  std::size_t nbytes() const { return count * element_size(dtype); }

  template <typename T>
  static Buffer of(T* data, std::size_t count, Device device = Device::cpu());
  template <typename Vec>
  static Buffer of(Vec& vec) {
    return of(vec.data(), vec.size());
  }
};

// kBand, kBor, kBxor (bitwise and/or/xor) take the integer dtypes and kBool
// only: any other dtype is InvalidArgument naming the op and the dtype, thrown
// by the call before anything is sent. On kBool (torch's semantics): kSum is
// logical or, kProduct logical and, kMin/kMax act on 0/1, kAvg is refused.
enum class ReduceOp : std::uint8_t { kSum, kAvg, kMin, kMax, kProduct, kBand, kBor, kBxor };
const char* to_string(ReduceOp op);

// The handle of one asynchronous operation.
class Work {
 public:
  virtual ~Work() = default;

  // Blocks until the operation completes; rethrows its error (TimeoutError,
  // BackendError, NetworkError...). Returns false when `timeout` passed first
  // (the operation goes on). A zero timeout means the group's timeout.
  virtual bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) = 0;
  // true once the operation succeeded or failed; never blocks.
  virtual bool is_completed() const = 0;
  // The failure, or nullptr (also while still running).
  virtual std::exception_ptr exception() const = 0;
  // The group's sequence number of this operation (0, 1, 2, ... in issue order).
  virtual std::uint64_t sequence_number() const = 0;
  // The rank a recv_any received from, once it completed successfully; -1 before
  // that and for every other operation.
  virtual int source_rank() const { return -1; }
  // Calls `callback` once the operation completed (succeeded or failed): at once
  // on the calling thread when it already has, else on the thread that completes
  // it, after is_completed() turned true. The callback must be quick and must not
  // throw or issue operations on the group. Returns false, and never calls
  // `callback`, when this Work cannot notify (then use wait() or is_completed()).
  virtual bool on_completion(std::function<void()> callback) {
    (void)callback;
    return false;
  }
};

using WorkPtr = std::shared_ptr<Work>;

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend_name() const = 0;

  // In place on every rank. kAvg divides by size() (integer types truncate).
  virtual WorkPtr allreduce(Buffer buffer, ReduceOp op = ReduceOp::kSum) = 0;
  // From `root` into every rank's buffer.
  virtual WorkPtr broadcast(Buffer buffer, int root) = 0;
  // output.count == input.count * size(); rank r's input lands at r * input.count.
  virtual WorkPtr allgather(Buffer output, Buffer input) = 0;
  // input.count == output.count * size(); rank r gets the reduction of chunk r.
  virtual WorkPtr reduce_scatter(Buffer output, Buffer input, ReduceOp op = ReduceOp::kSum) = 0;
  // The reduction lands in `root`'s buffer; other ranks' buffers are unspecified.
  virtual WorkPtr reduce(Buffer buffer, int root, ReduceOp op = ReduceOp::kSum) = 0;
  virtual WorkPtr barrier() = 0;
  // Rank r's input lands in `root`'s output at r * input.count; on `root`
  // output.count == input.count * size(); on the other ranks output is ignored
  // (may be empty).
  virtual WorkPtr gather(Buffer output, Buffer input, int root) = 0;
  // On `root` input.count == output.count * size(); rank r gets chunk r of it;
  // on the other ranks input is ignored (may be empty).
  virtual WorkPtr scatter(Buffer output, Buffer input, int root) = 0;
  // Rank r's input chunk j goes to rank j's output chunk r; chunks lie back to
  // back in rank order, with the element counts per peer given (size() entries
  // each). Empty count vectors mean even splits (count / size() each, which must
  // divide). Counts that do not add up to the buffers: InvalidArgument, thrown by
  // the call. Peers that disagree (this rank's output count from j differs from
  // j's input count to this rank): the Work fails on both with an error naming
  // the ranks and counts, never a hang (Gloo: InvalidArgument at once, on every
  // rank; NCCL: by its watchdog's timeout). output and input must not overlap.
  virtual WorkPtr alltoall(Buffer output, Buffer input, std::vector<std::size_t> output_counts,
                           std::vector<std::size_t> input_counts) = 0;
  // Point to point; `tag` distinguishes concurrent messages between two ranks.
  virtual WorkPtr send(Buffer buffer, int dst, int tag = 0) = 0;
  virtual WorkPtr recv(Buffer buffer, int src, int tag = 0) = 0;
  // Receives from whichever rank's send (with `tag`) arrives first; the Work's
  // source_rank() names it once completed. Not every backend supports it (NCCL:
  // InvalidArgument).
  virtual WorkPtr recv_any(Buffer buffer, int tag = 0) = 0;

  // From `root` into every rank's `buffers`, as one collective: every rank
  // passes as many buffers, of the same dtypes and counts, in the same order.
  // Gloo on one host streams them all through its shared-memory segment (no
  // staging memory, one barrier per slot set); elsewhere each is broadcast in
  // turn. The default does that with broadcast(): its Work completes once every
  // broadcast did, failing with the first one's error.
  virtual WorkPtr broadcast_many(std::vector<Buffer> buffers, int root);

  // Whether broadcast() moves a buffer at least as fast as allreduce() would:
  // true for Gloo when every rank is on this host (both go through one shared-
  // memory segment, a broadcast with a third of the copies), false otherwise
  // (Gloo over TCP, NCCL: not measured against each other). ReplicaState picks
  // its transfer by it. Constant for the group's life; thread-safe.
  virtual bool broadcast_is_fast() const { return false; }

  // Ends the group because the job's membership changed: every operation
  // still pending and every later one fails with GroupChanged naming `reason`,
  // at once (Gloo closes its connections, so peers blocked on this rank fail
  // too; NCCL aborts its communicator with ncclCommAbort). Never waits for the
  // peers. Thread-safe (any thread, while collectives run) and idempotent: the
  // first reason stays. The group cannot be used again; a worker that recovers
  // in place re-forms (ddp::reform, recovery.h) and gets a new one.
  virtual void abort(const std::string& reason) = 0;

 protected:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}

 private:
  int rank_;
  int size_;
};

// ---- implementation of the templates above ---------------------------------

namespace detail {
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kFloat64;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::kInt32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::kInt64;
}
template <>
constexpr DType dtype_of<std::uint8_t>() {
  return DType::kUInt8;
}
template <>
constexpr DType dtype_of<std::int8_t>() {
  return DType::kInt8;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::kBool;
}
template <>
constexpr DType dtype_of<Half>() {
  return DType::kFloat16;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::kBFloat16;
}
}  // namespace detail

template <typename T>
Buffer Buffer::of(T* data, std::size_t count, Device device) {
  return Buffer{static_cast<void*>(data), count, detail::dtype_of<std::remove_const_t<T>>(),
                device};
}

}  // namespace ddp
