#include "ddp/worker/replica_state.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

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

// Broadcasts one CUDA buffer from `root` through host memory, in slices of at
// most `slice` bytes (so that the staging memory stays bounded).
void broadcast_cuda(ProcessGroup& group, const Buffer& b, int root, std::size_t slice) {
  const std::size_t elem = element_size(b.dtype);
  const std::size_t per = std::max<std::size_t>(1, slice / elem);
  std::vector<std::uint64_t> host((std::min(per, b.count) * elem + 7) / 8);
  const bool is_root = group.rank() == root;
  for (std::size_t first = 0; first < b.count; first += per) {
    const std::size_t n = std::min(per, b.count - first);
    auto* device = static_cast<std::byte*>(b.data) + first * elem;
    if (is_root) copy_device(host.data(), device, n * elem, true);
    group.broadcast(Buffer{host.data(), n, b.dtype, Device::cpu()}, root)->wait();
    if (!is_root) copy_device(device, host.data(), n * elem, false);
  }
}

// Fills `b` with negative zeros of its dtype (0 for the integer types): added
// to any value, one leaves every bit of it as it is, -0.0 and NaN included (a
// positive zero would turn -0.0 into +0.0).
void fill_negative_zero(const Buffer& b) {
  switch (b.dtype) {
    case DType::kFloat32:
      std::fill_n(static_cast<std::uint32_t*>(b.data), b.count, 0x80000000u);
      return;
    case DType::kFloat64:
      std::fill_n(static_cast<std::uint64_t*>(b.data), b.count, 0x8000000000000000ull);
      return;
    case DType::kFloat16:
    case DType::kBFloat16:
      std::fill_n(static_cast<std::uint16_t*>(b.data), b.count, std::uint16_t{0x8000});
      return;
    default:
      std::memset(b.data, 0, b.nbytes());
      return;
  }
}

// Moves the root's CPU buffers to every rank through all-reduces (SUM), in
// place, in which every other rank contributes negative zeros: the group's
// fastest path (shared memory on one host), where a broadcast goes over TCP.
// All are issued before the first is waited for.
void allreduce_from_root(ProcessGroup& group, const std::vector<Buffer>& buffers, int root) {
  const bool is_root = group.rank() == root;
  std::vector<WorkPtr> works;
  for (const Buffer& b : buffers) {
    if (b.count == 0) continue;
    if (!is_root) fill_negative_zero(b);
    works.push_back(group.allreduce(b, ReduceOp::kSum));
  }
  for (auto& work : works) work->wait();
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

  // 3. The transfer. A receiving rank is not live until it completed.
  SyncResult result;
  result.root = root;
  result.received = rank != root;
  result.from_live = at(root, kLive) != 0;
  if (world > 1) {
    if (result.received) live_ = false;
    std::vector<Buffer> cpu;
    std::vector<Buffer> cuda;
    std::vector<std::size_t> counters;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      if (e.counter) {
        counters.push_back(i);
      } else if (e.buffer.device.is_cuda()) {
        cuda.push_back(e.buffer);
      } else {
        cpu.push_back(e.buffer);
      }
    }
    allreduce_from_root(group, cpu, root);
    for (const Buffer& b : cuda) {
      if (b.count > 0) broadcast_cuda(group, b, root, 64 * kMiB);
    }
    if (!counters.empty()) {
      std::vector<std::int64_t> values(counters.size());
      for (std::size_t k = 0; k < counters.size(); ++k) {
        values[k] = *static_cast<std::int64_t*>(entries_[counters[k]].buffer.data);
      }
      group.broadcast(Buffer::of(values), root)->wait();
      for (std::size_t k = 0; k < counters.size() && result.received; ++k) {
        *static_cast<std::int64_t*>(entries_[counters[k]].buffer.data) = values[k];
      }
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
