#include "ddp/worker/replica_state.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <map>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/common/error.h"
#include "ddp/worker/ddp.h"
#include "ddp/worker_contract/worker_contract.h"
#include "digest.h"
#include "recovery/control_client.h"

#ifdef DDP_WITH_NCCL
#include <cuda_runtime_api.h>
#endif

namespace ddp {
namespace {

constexpr const char* kOrigin = "ReplicaState";

// Columns of the table that sync() allreduces: one row per rank.
enum Column : std::size_t { kLive, kEntries, kDigest, kEncodedSize, kBytes, kColumns };

// At most this many differing ranks' lists are fetched to describe a mismatch.
constexpr std::size_t kMaxDescribed = 8;

// One registration as the ranks compare it.
struct Meta {
  std::string name;
  bool counter = false;
  DType dtype = DType::kFloat32;
  std::int64_t count = 0;
  bool cuda = false;
  friend bool operator==(const Meta&, const Meta&) = default;
};

// Per entry: kind, dtype, count, device type, name length, the name's bytes
// packed 8 to an int64.
std::vector<std::int64_t> encode(const std::vector<Meta>& metas) {
  std::vector<std::int64_t> out;
  for (const Meta& m : metas) {
    out.push_back(m.counter ? 1 : 0);
    out.push_back(static_cast<std::int64_t>(m.dtype));
    out.push_back(m.count);
    out.push_back(m.cuda ? 1 : 0);
    out.push_back(static_cast<std::int64_t>(m.name.size()));
    for (std::size_t i = 0; i < m.name.size(); i += 8) {
      std::uint64_t word = 0;
      std::memcpy(&word, m.name.data() + i, std::min<std::size_t>(8, m.name.size() - i));
      out.push_back(static_cast<std::int64_t>(word));
    }
  }
  return out;
}

// The inverse of encode(); stops at the first malformed entry.
std::vector<Meta> decode(const std::vector<std::int64_t>& enc) {
  std::vector<Meta> out;
  std::size_t pos = 0;
  while (pos + 5 <= enc.size()) {
    Meta m;
    m.counter = enc[pos] != 0;
    m.dtype = static_cast<DType>(enc[pos + 1]);
    m.count = enc[pos + 2];
    m.cuda = enc[pos + 3] != 0;
    const auto len = static_cast<std::size_t>(enc[pos + 4]);
    const std::size_t words = (len + 7) / 8;
    pos += 5;
    if (pos + words > enc.size()) break;
    m.name.resize(len);
    for (std::size_t i = 0; i < len; i += 8) {
      const auto word = static_cast<std::uint64_t>(enc[pos + i / 8]);
      std::memcpy(m.name.data() + i, &word, std::min<std::size_t>(8, len - i));
    }
    pos += words;
    out.push_back(std::move(m));
  }
  return out;
}

std::string describe(const Meta& m) {
  if (m.counter) return fmt::format("'{}' (counter)", m.name);
  return fmt::format("'{}' ({} x {}, {})", m.name, to_string(m.dtype), m.count,
                     m.cuda ? "cuda" : "cpu");
}

// The first difference of rank `rank`'s list from the root's.
std::string first_difference(int rank, const std::vector<Meta>& mine, int root,
                             const std::vector<Meta>& ref) {
  const std::size_t n = std::min(mine.size(), ref.size());
  for (std::size_t k = 0; k < n; ++k) {
    if (mine[k] == ref[k]) continue;
    return fmt::format("entry {} is {} on rank {} but {} on rank {}", k, describe(mine[k]), rank,
                       describe(ref[k]), root);
  }
  if (mine.size() < ref.size()) {
    return fmt::format("rank {} registered {} entries, rank {} {}: rank {} lacks entry {} {}", rank,
                       mine.size(), root, ref.size(), rank, n, describe(ref[n]));
  }
  if (mine.size() > ref.size()) {
    return fmt::format(
        "rank {} registered {} entries, rank {} {}: rank {} has an extra entry {} {}", rank,
        mine.size(), root, ref.size(), rank, n, describe(mine[n]));
  }
  return "the registrations' digests differ";  // a hash collision's mirror: not expected
}

// Host <-> device copies of the staged CUDA buffers.
void copy_device(void* dst, const void* src, std::size_t bytes, bool to_host) {
#ifdef DDP_WITH_NCCL
  const cudaError_t status =
      cudaMemcpy(dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice);
  if (status != cudaSuccess) {
    throw BackendError(kOrigin, fmt::format("cudaMemcpy: {}", cudaGetErrorString(status)));
  }
#else
  (void)dst;
  (void)src;
  (void)bytes;
  (void)to_host;
  throw InternalError(kOrigin, "a CUDA buffer in a build without CUDA");
#endif
}

// The registered buffers laid end to end, each padded to whole int64 words:
// what the transfer moves, a range of bytes at a time.
class Stream {
 public:
  explicit Stream(const std::vector<Buffer>& buffers) : buffers_(buffers) {
    for (const Buffer& b : buffers_) bytes_ += padded(b);
  }
  std::size_t bytes() const { return bytes_; }

  // Copies the stream's bytes [first, first + count) from the buffers to
  // `host` (to_host) or back; the padding is not copied (its bytes in `host`
  // stay as they are).
  void copy(std::size_t first, std::size_t count, std::byte* host, bool to_host) const {
    std::size_t offset = 0;  // of the current buffer in the stream
    for (const Buffer& b : buffers_) {
      if (offset >= first + count) break;
      const std::size_t lo = std::max(offset, first);
      const std::size_t hi = std::min(offset + b.nbytes(), first + count);
      if (lo < hi) {
        auto* at = static_cast<std::byte*>(b.data) + (lo - offset);
        std::byte* staged = host + (lo - first);
        if (b.device.is_cuda()) {
          copy_device(to_host ? staged : at, to_host ? at : staged, hi - lo, to_host);
        } else {
          std::memcpy(to_host ? staged : at, to_host ? at : staged, hi - lo);
        }
      }
      offset += padded(b);
    }
  }

 private:
  static std::size_t padded(const Buffer& b) { return (b.nbytes() + 7) / 8 * 8; }

  const std::vector<Buffer>& buffers_;
  std::size_t bytes_ = 0;
};

// Waits for every work. When one fails, still waits for the others (they use
// memory the caller may free once this returns), then rethrows the first error.
void wait_all(const std::vector<WorkPtr>& works) {
  std::exception_ptr error;
  for (const WorkPtr& work : works) {
    try {
      work->wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// Moves the root's buffers to every rank through host staging memory, a
// slice of the stream at a time, each slice in pieces: the root copies a piece
// in, the others zero it, and it is all-reduced in place as int64 words (SUM:
// adding zeros leaves every bit of the root's words as it is, whatever the
// buffers' dtypes, NaN payloads and -0.0 included); once a piece's all-reduce
// completed the others copy it out. Every piece is issued before the first is
// waited for, so the copies overlap the all-reduces. The all-reduce is the
// group's fastest path (shared memory on one host), where a broadcast goes
// over TCP, and a few large ones replace one per buffer.
// `b` as the widest integer words its address and size allow (adding zeros
// to integers leaves every bit as it is, whatever b's own dtype).
Buffer as_integer_words(const Buffer& b) {
  const auto address = reinterpret_cast<std::uintptr_t>(b.data);
  for (auto [dtype, size] : {std::pair{DType::kInt64, 8}, std::pair{DType::kInt32, 4}}) {
    const auto bytes = static_cast<std::size_t>(size);
    if (address % bytes == 0 && b.nbytes() % bytes == 0) {
      return Buffer{b.data, b.nbytes() / bytes, dtype, b.device};
    }
  }
  return Buffer{b.data, b.nbytes(), DType::kUInt8, b.device};
}

// Waits for `works` when the transfer failed before it could: they use the
// caller's memory. Their own errors are dropped (the first one is reported).
void drain(const std::vector<WorkPtr>& works) noexcept {
  try {
    wait_all(works);
  } catch (...) {
    // the transfer's own error is the one to report
  }
}

// Moves the root's buffers to every rank through all-reduces (SUM) of integer
// words, in which every other rank contributes zeros: adding zero to an
// integer leaves every bit as it is, whatever the buffer's own dtype (NaN
// payloads and -0.0 included). For a group whose broadcast is not faster
// (Gloo over TCP: the path bench/replica_state measures).
//   - CPU buffers of at least `in_place_bytes`: in place, one all-reduce each
//     (a receiver zeroes its buffer first);
//   - the others (smaller buffers, counters, CUDA buffers) laid end to end,
//     each padded to whole int64 words, through host staging memory of at most
//     `staging_bytes`, one all-reduce a slice: the root copies the slice in, a
//     receiver zeroes it and copies it out.
// Everything the in-place all-reduces and the first slice's read is written
// before the first is issued: copying while they run would compete with them
// for the cores (with more ranks than cores, a rank then misses its peers'
// barriers and sleeps; measured, half of the syncs took 2-3x as long).
void transfer_by_allreduce(ProcessGroup& group, const std::vector<Buffer>& buffers, int root,
                           std::size_t in_place_bytes, std::size_t staging_bytes) {
  const bool is_root = group.rank() == root;
  std::vector<Buffer> large, small;
  for (const Buffer& b : buffers) {
    (b.device.is_cuda() || b.nbytes() < in_place_bytes ? small : large).push_back(b);
  }
  const Stream stream(small);
  const std::size_t capacity = std::min(stream.bytes(), staging_bytes);
  // Not value-initialized: a receiver zeroes each slice, and the root's
  // padding words only meet the receivers' zeros and are never copied out.
  const std::unique_ptr<std::int64_t[]> staging(new std::int64_t[capacity / 8]);
  auto* host = reinterpret_cast<std::byte*>(staging.get());
  auto slice_at = [&](std::size_t first) { return std::min(capacity, stream.bytes() - first); };
  auto stage = [&](std::size_t first) {
    if (is_root) {
      stream.copy(first, slice_at(first), host, true);
    } else {
      std::memset(host, 0, slice_at(first));
    }
  };
  if (!is_root) {
    for (const Buffer& b : large) std::memset(b.data, 0, b.nbytes());
  }
  if (stream.bytes() > 0) stage(0);
  std::vector<WorkPtr> in_place;
  for (const Buffer& b : large)
    in_place.push_back(group.allreduce(as_integer_words(b), ReduceOp::kSum));
  try {
    for (std::size_t first = 0; first < stream.bytes(); first += capacity) {
      if (first > 0) stage(first);
      group
          .allreduce(Buffer{host, slice_at(first) / 8, DType::kInt64, Device::cpu()},
                     ReduceOp::kSum)
          ->wait();
      if (!is_root) stream.copy(first, slice_at(first), host, false);
    }
  } catch (...) {
    drain(in_place);
    throw;
  }
  wait_all(in_place);
}

// Moves the root's buffers to every rank by broadcasts, for a group whose
// broadcast is fast (Gloo on one host: through its shared-memory segment, one
// copy in on the root and one out on each other rank, against the all-reduce's
// three passes). Every CPU buffer, counters included, in place in one
// broadcast_many (no staging memory: fresh memory's first touch is dear, a
// guest fault and a hypervisor's shadow-page fault, some 60 us a page on this
// project's VM, where 1 MiB of staging cost a newcomer 5-8 ms of a 4 MiB
// transfer); CUDA buffers through host staging of at most `staging_bytes`, one
// broadcast a slice.
void transfer_by_broadcast(ProcessGroup& group, const std::vector<Buffer>& buffers, int root,
                           std::size_t staging_bytes) {
  const bool is_root = group.rank() == root;
  std::vector<Buffer> host_buffers, cuda;
  for (const Buffer& b : buffers) (b.device.is_cuda() ? cuda : host_buffers).push_back(b);
  const WorkPtr in_place = group.broadcast_many(std::move(host_buffers), root);
  try {
    const Stream stream(cuda);
    const std::size_t capacity = std::min(stream.bytes(), staging_bytes);
    std::vector<std::int64_t> staging(capacity / 8);
    auto* host = reinterpret_cast<std::byte*>(staging.data());
    for (std::size_t first = 0; first < stream.bytes(); first += capacity) {
      const std::size_t slice = std::min(capacity, stream.bytes() - first);
      if (is_root) stream.copy(first, slice, host, true);
      group.broadcast(Buffer{host, slice, DType::kUInt8, Device::cpu()}, root)->wait();
      if (!is_root) stream.copy(first, slice, host, false);
    }
  } catch (...) {
    drain({in_place});
    throw;
  }
  in_place->wait();
}

}  // namespace

void ReplicaState::add(std::string name, Buffer buffer) {
  if (name.empty()) throw InvalidArgument(kOrigin, "add(): the name is empty");
  for (const Entry& e : entries_) {
    if (e.name == name) {
      throw InvalidArgument(kOrigin, fmt::format("add(): '{}' is registered already", name));
    }
  }
  if (buffer.data == nullptr && buffer.count > 0) {
    throw InvalidArgument(
        kOrigin, fmt::format("add(): '{}' has {} elements but no memory", name, buffer.count));
  }
  (void)element_size(buffer.dtype);  // throws for an unknown dtype
#ifndef DDP_WITH_NCCL
  if (buffer.device.is_cuda()) {
    throw InvalidArgument(kOrigin, fmt::format("add(): '{}' is on {} but this build has no CUDA",
                                               name, buffer.device.str()));
  }
#endif
  entries_.push_back({std::move(name), false, buffer});
}

void ReplicaState::add(std::string name, std::int64_t* counter) {
  if (counter == nullptr) {
    throw InvalidArgument(kOrigin, fmt::format("add(): counter '{}' is a null pointer", name));
  }
  add(std::move(name), Buffer::of(counter, 1));
  entries_.back().counter = true;
}

void ReplicaState::set_in_place_bytes(std::size_t bytes) { in_place_bytes_ = bytes; }

void ReplicaState::set_staging_bytes(std::size_t bytes) {
  if (bytes < 8 || bytes % 8 != 0) {
    throw InvalidArgument(
        kOrigin, fmt::format("set_staging_bytes({}): not a positive multiple of 8", bytes));
  }
  staging_bytes_ = bytes;
}

std::size_t ReplicaState::bytes() const {
  std::size_t total = 0;
  for (const Entry& e : entries_) total += e.buffer.nbytes();
  return total;
}

SyncResult ReplicaState::sync(ProcessGroup& group) {
  const auto start = std::chrono::steady_clock::now();
  const int world = group.size();
  const int rank = group.rank();

  std::vector<Meta> metas;
  metas.reserve(entries_.size());
  for (const Entry& e : entries_) {
    metas.push_back({e.name, e.counter, e.buffer.dtype, static_cast<std::int64_t>(e.buffer.count),
                     e.buffer.device.is_cuda()});
  }
  const std::vector<std::int64_t> enc = encode(metas);

  // 1. Liveness and registration digests of every rank (an allgather made of
  // an allreduce: each rank fills its own row).
  std::vector<std::int64_t> table(kColumns * static_cast<std::size_t>(world), 0);
  std::int64_t* row = &table[kColumns * static_cast<std::size_t>(rank)];
  row[kLive] = live_ ? 1 : 0;
  row[kEntries] = static_cast<std::int64_t>(entries_.size());
  row[kDigest] = detail::fnv1a(enc);
  row[kEncodedSize] = static_cast<std::int64_t>(enc.size());
  row[kBytes] = static_cast<std::int64_t>(bytes());
  group.allreduce(Buffer::of(table), ReduceOp::kSum)->wait();
  auto at = [&](int r, Column c) { return table[kColumns * static_cast<std::size_t>(r) + c]; };

  int root = 0;
  for (int r = 0; r < world; ++r) {
    if (at(r, kLive) != 0) {
      root = r;
      break;
    }
  }

  // 2. Registrations that differ from the root's: every rank fetches the lists
  // it needs to describe them, and throws.
  std::vector<int> differ;
  for (int r = 0; r < world; ++r) {
    for (Column c : {kEntries, kDigest, kEncodedSize, kBytes}) {
      if (at(r, c) != at(root, c)) {
        differ.push_back(r);
        break;
      }
    }
  }
  if (!differ.empty()) {
    auto fetch = [&](int src) {
      std::vector<std::int64_t> list(static_cast<std::size_t>(at(src, kEncodedSize)));
      if (src == rank) list = enc;
      if (!list.empty()) group.broadcast(Buffer::of(list), src)->wait();
      return decode(list);
    };
    const std::vector<Meta> ref = fetch(root);
    std::vector<std::string> parts;
    for (std::size_t k = 0; k < differ.size() && k < kMaxDescribed; ++k) {
      parts.push_back(first_difference(differ[k], fetch(differ[k]), root, ref));
    }
    if (differ.size() > kMaxDescribed) {
      parts.push_back(fmt::format("and {} more rank(s)", differ.size() - kMaxDescribed));
    }
    throw InvalidArgument(
        kOrigin, fmt::format("sync(): rank(s) {} registered state that differs from rank {}'s "
                             "(the {}): {}",
                             fmt::join(differ, ", "), root,
                             at(root, kLive) != 0 ? "lowest live rank" : "fresh start's rank 0",
                             fmt::join(parts, "; ")));
  }

  return transfer(group, root, at(root, kLive) != 0, start);
}

SyncResult ReplicaState::sync_agreed(ProcessGroup& group, int root, bool root_live) {
  if (root < 0 || root >= group.size()) {
    throw InvalidArgument(kOrigin, fmt::format("sync_agreed(): root {} is not a rank of a group "
                                               "of {}",
                                               root, group.size()));
  }
  return transfer(group, root, root_live, std::chrono::steady_clock::now());
}

SyncResult ReplicaState::transfer(ProcessGroup& group, int root, bool root_live,
                                  std::chrono::steady_clock::time_point start) {
  // A receiving rank is not live until the transfer completed.
  SyncResult result;
  result.root = root;
  result.received = group.rank() != root;
  result.from_live = root_live;
  if (group.size() > 1) {
    if (result.received) live_ = false;
    std::vector<Buffer> buffers;  // counters included: one int64 each
    buffers.reserve(entries_.size());
    for (const Entry& e : entries_) buffers.push_back(e.buffer);
    if (group.broadcast_is_fast()) {
      transfer_by_broadcast(group, buffers, root, staging_bytes_);
    } else {
      transfer_by_allreduce(group, buffers, root, in_place_bytes_, staging_bytes_);
    }
    result.bytes = bytes();
  }
  live_ = true;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // A worker that recovers in place tells its agent, for the recovery's report.
  if (auto* control = detail::ControlClient::get()) {
    result.round = control->round();
    control->send(contract::encode(
        contract::Synced{result.round, root, result.received, result.from_live,
                         static_cast<std::int64_t>(result.bytes), result.seconds}));
  }
  return result;
}

}  // namespace ddp
