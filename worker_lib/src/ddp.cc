#include "ddp/worker/ddp.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/common/error.h"
#include "digest.h"
#include "grad_ops.h"

namespace ddp {
namespace {

constexpr const char* kOrigin = "DistributedDataParallel";

// A parameter list flattened to integers: per parameter dtype, ndim, dims.
std::vector<std::int64_t> encode(const std::vector<TensorMeta>& params) {
  std::vector<std::int64_t> out;
  for (const auto& p : params) {
    out.push_back(static_cast<std::int64_t>(p.dtype));
    out.push_back(static_cast<std::int64_t>(p.shape.size()));
    out.insert(out.end(), p.shape.begin(), p.shape.end());
  }
  return out;
}

std::string meta_str(DType dtype, const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}] {}", fmt::join(shape, ", "), to_string(dtype));
}

// Decodes parameter k of an encoded list; false when it has fewer parameters.
bool decode_at(const std::vector<std::int64_t>& enc, std::size_t k, DType& dtype,
               std::vector<std::int64_t>& shape) {
  std::size_t pos = 0;
  for (std::size_t i = 0;; ++i) {
    if (pos + 2 > enc.size()) return false;
    auto ndim = static_cast<std::size_t>(enc[pos + 1]);
    if (pos + 2 + ndim > enc.size()) return false;
    if (i == k) {
      dtype = static_cast<DType>(enc[pos]);
      shape.assign(enc.begin() + static_cast<std::ptrdiff_t>(pos + 2),
                   enc.begin() + static_cast<std::ptrdiff_t>(pos + 2 + ndim));
      return true;
    }
    pos += 2 + ndim;
  }
}

}  // namespace

void check_parameter_consistency(ProcessGroup& group, const std::vector<TensorMeta>& params) {
  const std::vector<std::int64_t> enc = encode(params);
  std::vector<std::int64_t> mine = {static_cast<std::int64_t>(params.size()), detail::fnv1a(enc),
                                    static_cast<std::int64_t>(enc.size())};
  const int world = group.size();
  std::vector<std::int64_t> all(3 * static_cast<std::size_t>(world));
  group.allgather(Buffer::of(all), Buffer::of(mine))->wait();

  std::vector<int> differ;
  for (int r = 1; r < world; ++r) {
    for (int k = 0; k < 3; ++k) {
      if (all[3 * r + k] != all[k]) {
        differ.push_back(r);
        break;
      }
    }
  }
  if (differ.empty()) return;

  // Every rank knows there is a mismatch; fetch rank 0's list to say what differs.
  std::vector<std::int64_t> root(static_cast<std::size_t>(all[2]));
  if (group.rank() == 0) root = enc;
  if (!root.empty()) group.broadcast(Buffer::of(root), 0)->wait();

  std::string message = fmt::format(
      "parameters differ across ranks: rank(s) {} registered parameters that differ from rank 0's "
      "({} parameters)",
      fmt::join(differ, ", "), all[0]);
  for (int r : differ) {
    if (all[3 * r] != all[0]) message += fmt::format("; rank {} has {} parameters", r, all[3 * r]);
  }
  if (group.rank() != 0) {
    const std::size_t n = std::max<std::size_t>(params.size(), static_cast<std::size_t>(all[0]));
    for (std::size_t k = 0; k < n; ++k) {
      DType d0{};
      std::vector<std::int64_t> s0;
      const bool has0 = decode_at(root, k, d0, s0);
      const bool has_mine = k < params.size();
      const std::string name =
          has_mine && !params[k].name.empty() ? fmt::format(" ('{}')", params[k].name) : "";
      if (has0 && has_mine && d0 == params[k].dtype && s0 == params[k].shape) continue;
      if (!has_mine) {
        message += fmt::format("; this rank ({}) lacks parameter {} ({} on rank 0)", group.rank(),
                               k, meta_str(d0, s0));
      } else if (!has0) {
        message +=
            fmt::format("; this rank ({}) has an extra parameter {}{}", group.rank(), k, name);
      } else {
        message +=
            fmt::format("; parameter {}{} is {} on this rank ({}) but {} on rank 0", k, name,
                        meta_str(params[k].dtype, params[k].shape), group.rank(), meta_str(d0, s0));
      }
      break;
    }
  }
  throw InvalidArgument(kOrigin, message);
}

void broadcast_coalesced(ProcessGroup& group, const std::vector<Buffer>& buffers, int root,
                         std::size_t chunk_bytes) {
  if (group.size() == 1) return;
  std::vector<std::uint64_t> pack;  // 8-byte aligned staging memory
  std::vector<const Buffer*> members;
  std::size_t pack_bytes = 0;
  const bool is_root = group.rank() == root;

  auto flush = [&] {
    if (members.empty()) return;
    if (members.size() == 1) {
      group.broadcast(*members.front(), root)->wait();  // no copy for a lone buffer
    } else {
      pack.assign((pack_bytes + 7) / 8, 0);
      auto* base = reinterpret_cast<std::byte*>(pack.data());
      if (is_root) {
        std::size_t off = 0;
        for (const Buffer* b : members) {
          std::memcpy(base + off, b->data, b->nbytes());
          off += b->nbytes();
        }
      }
      const DType dtype = members.front()->dtype;
      group
          .broadcast(Buffer{base, pack_bytes / element_size(dtype), dtype, members.front()->device},
                     root)
          ->wait();
      if (!is_root) {
        std::size_t off = 0;
        for (const Buffer* b : members) {
          std::memcpy(b->data, base + off, b->nbytes());
          off += b->nbytes();
        }
      }
    }
    members.clear();
    pack_bytes = 0;
  };

  for (const Buffer& b : buffers) {
    if (b.count == 0) continue;
    if (b.device.is_cuda()) {
      throw InvalidArgument("broadcast_coalesced", "CUDA buffers must be broadcast one by one");
    }
    if (!members.empty() &&
        (members.front()->dtype != b.dtype || pack_bytes + b.nbytes() > chunk_bytes)) {
      flush();
    }
    members.push_back(&b);
    pack_bytes += b.nbytes();
  }
  flush();
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<ProcessGroup> group,
                                                 std::vector<Parameter> params,
                                                 std::vector<ModuleBuffer> buffers,
                                                 DdpOptions options)
    : group_(std::move(group)), params_(std::move(params)), buffers_(std::move(buffers)),
      options_(std::move(options)) {
  if (!group_) throw InvalidArgument(kOrigin, "the process group is null");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = params_[i];
    if (p.shape.empty()) p.shape = {static_cast<std::int64_t>(p.value.count)};
    if (p.value.data == nullptr) {
      throw InvalidArgument(kOrigin, fmt::format("parameter {} ('{}') has no memory", i, p.name));
    }
    const bool view = options_.reducer.gradient_as_bucket_view;
    if (!view && (p.grad.count != p.value.count || p.grad.dtype != p.value.dtype)) {
      throw InvalidArgument(
          kOrigin, fmt::format("parameter {} ('{}'): the gradient buffer ({} x {}) does "
                               "not match the value ({} x {})",
                               i, p.name, p.grad.count, to_string(p.grad.dtype), p.value.count,
                               to_string(p.value.dtype)));
    }
  }
  construction_collectives(*group_, /*keep_values=*/false);
  reducer_ = std::make_unique<Reducer>(group_, gradient_specs(), options_.reducer);
}

std::vector<GradientSpec> DistributedDataParallel::gradient_specs() const {
  const bool view = options_.reducer.gradient_as_bucket_view;
  std::vector<GradientSpec> specs;
  specs.reserve(params_.size());
  for (const Parameter& p : params_) {
    Buffer g = view ? Buffer{nullptr, p.value.count, p.value.dtype, p.value.device} : p.grad;
    specs.push_back({p.name, p.shape, g});
  }
  return specs;
}

void DistributedDataParallel::construction_collectives(ProcessGroup& group, bool keep_values) {
  if (options_.check_consistency) {
    std::vector<TensorMeta> metas;
    metas.reserve(params_.size());
    for (const Parameter& p : params_) metas.push_back({p.name, p.shape, p.value.dtype});
    check_parameter_consistency(group, metas);
  }
  if (!options_.broadcast_parameters) return;
  std::vector<Buffer> values;
  for (const auto& p : params_) values.push_back(p.value);
  for (const auto& b : buffers_) values.push_back(b.value);
  std::vector<std::uint64_t> scratch;
  if (keep_values && group.rank() != 0) {
    // The same messages (counts, dtypes, devices, so the same packing) into
    // one scratch area that every view shares: only the last one received
    // lands there, and nothing reads it.
    std::size_t largest = 0;
    for (const Buffer& b : values) largest = std::max(largest, b.nbytes());
    scratch.assign((largest + 7) / 8, 0);
    for (Buffer& b : values) b.data = scratch.data();
  }
  broadcast_coalesced(group, values, 0);
}

void DistributedDataParallel::reform(std::shared_ptr<ProcessGroup> group) {
  if (!group) throw InvalidArgument(kOrigin, "reform(): the process group is null");
  if (!reducer_->sync_enabled()) {
    throw InvalidArgument(kOrigin,
                          "reform() called while a no_sync() guard is alive: the guard refers to "
                          "the Reducer that reform() replaces; let it go out of scope first");
  }
  // The interrupted step's gradients go: a newcomer's are zero too.
  if (!options_.reducer.gradient_as_bucket_view) {
    for (const Parameter& p : params_) {
      if (p.grad.data != nullptr) grad_ops::zero(p.grad);
    }
  }
  in_forward_ = false;
  pending_forward_ms_ = 0;
  construction_collectives(*group, /*keep_values=*/true);
  auto reducer = std::make_unique<Reducer>(group, gradient_specs(), options_.reducer);
  // The old Reducer waits for its in-flight reductions (failed at once when
  // its group was aborted) as it goes.
  reducer_ = std::move(reducer);
  group_ = std::move(group);
}

void DistributedDataParallel::begin_forward() {
  if (options_.broadcast_buffers && !buffers_.empty()) {
    std::vector<Buffer> values;
    for (const auto& b : buffers_) values.push_back(b.value);
    broadcast_coalesced(*group_, values, 0);
  }
  forward_start_ = std::chrono::steady_clock::now();
  in_forward_ = true;
}

void DistributedDataParallel::begin_backward() {
  if (in_forward_) {
    pending_forward_ms_ =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - forward_start_)
            .count();
    in_forward_ = false;
  }
  reducer_->prepare_for_backward();
}

void DistributedDataParallel::finalize() {
  const bool sync = reducer_->sync_enabled();
  reducer_->finalize();
  if (sync) forward_ms_ = pending_forward_ms_;
}

DdpStats DistributedDataParallel::stats() const { return {forward_ms_, reducer_->stats()}; }

}  // namespace ddp
