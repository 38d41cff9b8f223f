#include "ddp/worker/reducer.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "ddp/common/env.h"
#include "ddp/common/error.h"
#include "grad_ops.h"
#include "progress_recorder.h"

namespace ddp {
namespace {

constexpr const char* kOrigin = "Reducer";

std::string describe(const GradientSpec& spec, std::size_t i) {
  if (spec.name.empty()) return fmt::format("gradient {}", i);
  return fmt::format("gradient {} ('{}')", i, spec.name);
}

bool env_debug() {
  auto value = env::get("DDP_DEBUG");
  if (!value || value->empty()) return false;
  std::string v = *value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  return !(v == "0" || v == "false" || v == "no" || v == "off");
}

double ms_between(std::chrono::steady_clock::time_point a,
                  std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

void ReducerOptions::validate() const {
  if (bucket_cap_bytes == 0) {
    throw InvalidArgument("ReducerOptions", "bucket_cap_bytes must be > 0");
  }
  if (first_bucket_cap_bytes == 0) {
    throw InvalidArgument("ReducerOptions", "first_bucket_cap_bytes must be > 0");
  }
}

Reducer::Reducer(std::shared_ptr<ProcessGroup> group, std::vector<GradientSpec> grads,
                 ReducerOptions options)
    : group_(std::move(group)), grads_(std::move(grads)), options_(std::move(options)),
      step_progress_(std::make_unique<detail::StepProgress>()) {
  if (!group_) throw InvalidArgument(kOrigin, "the process group is null");
  options_.validate();
  options_.debug = options_.debug || env_debug();
  if (options_.debug) {
    // A private logger: statistics are asked for explicitly, whatever DDP_LOG_LEVEL says.
    debug_log_ =
        std::make_shared<spdlog::logger>("ddp", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    debug_log_->set_level(spdlog::level::info);
  }
  hook_ = options_.comm_hook ? options_.comm_hook : allreduce_hook();
  for (std::size_t i = 0; i < grads_.size(); ++i) {
    GradientSpec& spec = grads_[i];
    if (!grad_ops::is_floating(spec.grad.dtype)) {
      throw InvalidArgument(kOrigin,
                            fmt::format("{} has dtype {}; gradients must be floating point",
                                        describe(spec, i), to_string(spec.grad.dtype)));
    }
    if (spec.grad.device.is_cuda()) {
      throw InvalidArgument(kOrigin, fmt::format("{} is on {}; the Reducer handles CPU memory only",
                                                 describe(spec, i), spec.grad.device.str()));
    }
    if (spec.grad.count == 0) {
      throw InvalidArgument(kOrigin, fmt::format("{} has no elements", describe(spec, i)));
    }
    if (spec.shape.empty()) spec.shape = {static_cast<std::int64_t>(spec.grad.count)};
    std::int64_t product = 1;
    for (auto d : spec.shape) {
      if (d < 0) {
        throw InvalidArgument(kOrigin,
                              fmt::format("{} has a negative dimension", describe(spec, i)));
      }
      product *= d;
    }
    if (static_cast<std::size_t>(product) != spec.grad.count) {
      throw InvalidArgument(
          kOrigin,
          fmt::format("{}: shape [{}] has {} elements but the buffer has {}", describe(spec, i),
                      fmt::join(spec.shape, ", "), product, spec.grad.count));
    }
    if (!options_.gradient_as_bucket_view && spec.grad.data == nullptr) {
      throw InvalidArgument(kOrigin,
                            fmt::format("{} has no memory (data is null)", describe(spec, i)));
    }
  }
  ready_.assign(grads_.size(), 0);
  used_since_sync_.assign(grads_.size(), 0);
  static_unused_.assign(grads_.size(), 0);
  std::vector<std::size_t> order(grads_.size());
  std::iota(order.rbegin(), order.rend(), std::size_t{0});  // reverse registration order
  build_buckets(order);
}

Reducer::~Reducer() { wait_all_noexcept(); }

const GradientSpec& Reducer::spec(std::size_t i) const {
  if (i >= grads_.size()) {
    throw InvalidArgument(
        kOrigin, fmt::format("gradient index {} out of range ({} gradients)", i, grads_.size()));
  }
  return grads_[i];
}

Buffer Reducer::grad(std::size_t i) const {
  const GradientSpec& s = spec(i);
  if (!options_.gradient_as_bucket_view) return s.grad;
  const Location& loc = location_[i];
  const Bucket& b = buckets_[loc.bucket];
  auto* base = reinterpret_cast<std::byte*>(const_cast<std::uint64_t*>(b.storage.data()));
  return Buffer{base + loc.offset * element_size(b.dtype), s.grad.count, b.dtype, b.device};
}

Buffer Reducer::slot(std::size_t i) {
  const Location& loc = location_[i];
  Bucket& b = buckets_[loc.bucket];
  auto* base = reinterpret_cast<std::byte*>(b.data());
  return Buffer{base + loc.offset * element_size(b.dtype), grads_[i].grad.count, b.dtype, b.device};
}

std::vector<std::vector<std::size_t>> Reducer::bucket_assignment() const {
  std::vector<std::vector<std::size_t>> out;
  out.reserve(buckets_.size());
  for (const auto& b : buckets_) out.push_back(b.grads);
  return out;
}

void Reducer::build_buckets(const std::vector<std::size_t>& order) {
  // Buckets are formed per (dtype, device) while walking `order`; their launch
  // order is the order in which they were opened, which every rank computes
  // identically from the same order and shapes.
  struct Open {
    std::size_t bucket = 0;
    std::size_t bytes = 0;
    std::size_t cap = 0;
    bool open = false;
    bool any = false;  // a bucket of this key exists already (the first cap is used)
  };
  std::map<std::pair<int, int>, Open> open;  // (dtype, device index) -> open bucket
  std::vector<Bucket> buckets;
  for (std::size_t i : order) {
    const Buffer& g = grads_[i].grad;
    Open& o = open[{static_cast<int>(g.dtype), g.device.index}];
    const std::size_t nbytes = g.nbytes();
    if (o.open && o.bytes + nbytes > o.cap) o.open = false;
    if (!o.open) {
      o.bucket = buckets.size();
      o.bytes = 0;
      o.cap = o.any ? options_.bucket_cap_bytes : options_.first_bucket_cap_bytes;
      o.open = true;
      o.any = true;
      Bucket b;
      b.dtype = g.dtype;
      b.device = g.device;
      buckets.push_back(std::move(b));
    }
    Bucket& b = buckets[o.bucket];
    b.grads.push_back(i);
    b.offsets.push_back(b.count);
    b.count += g.count;
    o.bytes += nbytes;
    if (o.bytes >= o.cap) o.open = false;  // full, or one gradient larger than the cap
  }

  std::vector<Bucket> old = std::move(buckets_);
  std::vector<Location> old_location = std::move(location_);
  buckets_ = std::move(buckets);
  location_.assign(grads_.size(), Location{});
  for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
    Bucket& b = buckets_[bi];
    b.storage.assign((b.count * element_size(b.dtype) + 7) / 8, 0);
    b.pending = b.grads.size();
    for (std::size_t k = 0; k < b.grads.size(); ++k) location_[b.grads[k]] = {bi, b.offsets[k]};
  }
  if (options_.gradient_as_bucket_view && !old.empty()) {
    // The gradients live in the buckets: carry their values over to the new views.
    for (std::size_t i = 0; i < grads_.size(); ++i) {
      const Location& from = old_location[i];
      Bucket& ob = old[from.bucket];
      auto* src = reinterpret_cast<std::byte*>(ob.data()) + from.offset * element_size(ob.dtype);
      grad_ops::copy(slot(i), Buffer{src, grads_[i].grad.count, ob.dtype, ob.device});
    }
  }
  ++layout_version_;
}

void Reducer::start_iteration_locked() {
  in_iteration_ = true;
  iteration_sync_ = sync_enabled_;
  std::fill(ready_.begin(), ready_.end(), 0);
  ready_order_.clear();
  for (auto& b : buckets_) {
    b.pending = b.grads.size();
    b.work.reset();
    b.launched = false;
  }
  next_launch_ = 0;
  any_launched_ = false;
  launch_error_ = nullptr;
  backward_start_ = Clock::now();
  if (iteration_sync_ && options_.static_graph && static_known_) {
    // Known unused gradients are ready from the start: their buckets need not
    // wait for finalize().
    for (std::size_t i = 0; i < grads_.size(); ++i) {
      if (static_unused_[i]) mark_ready_locked(i, false);
    }
  }
}

void Reducer::prepare_for_backward() {
  std::lock_guard lock(mutex_);
  if (in_iteration_) {
    // A previous backward that was never finalized: only legal without sync.
    if (iteration_sync_) {
      throw InvalidArgument(kOrigin,
                            "prepare_for_backward() called again before finalize() of the "
                            "previous synchronized iteration");
    }
  }
  start_iteration_locked();
}

void Reducer::mark_grad_ready(std::size_t i) {
  std::lock_guard lock(mutex_);
  if (i >= grads_.size()) {
    throw InvalidArgument(
        kOrigin,
        fmt::format("mark_grad_ready({}): index out of range ({} gradients)", i, grads_.size()));
  }
  if (!in_iteration_) start_iteration_locked();
  if (ready_[i]) {
    throw InvalidArgument(kOrigin, fmt::format("{} was marked ready twice in one backward pass",
                                               describe(grads_[i], i)));
  }
  mark_ready_locked(i, true);
}

void Reducer::mark_ready_locked(std::size_t i, bool used) {
  ready_[i] = 1;
  if (used) {
    ready_order_.push_back(i);
    used_since_sync_[i] = 1;
  }
  if (!iteration_sync_) return;
  const Buffer dst = slot(i);
  if (!used && !used_since_sync_[i]) {
    grad_ops::zero(dst);  // an unused gradient contributes zeros
  } else if (!options_.gradient_as_bucket_view) {
    grad_ops::copy(dst, grads_[i].grad);
  }
  Bucket& b = buckets_[location_[i].bucket];
  if (--b.pending == 0) launch_ready_buckets_locked();
}

void Reducer::launch_ready_buckets_locked() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_];
    if (!any_launched_) {
      first_launch_ = Clock::now();
      any_launched_ = true;
    }
    GradBucket gb{next_launch_, buckets_.size(), Buffer{b.data(), b.count, b.dtype, b.device}};
    try {
      b.work = hook_->launch(*group_, gb);
    } catch (...) {
      launch_error_ = std::current_exception();
      throw;
    }
    b.launched = true;
    ++next_launch_;
  }
}

void Reducer::finalize() {
  std::lock_guard lock(mutex_);
  if (!in_iteration_) start_iteration_locked();  // a backward pass that produced no gradient
  const auto backward_end = Clock::now();
  step_progress_->gradients_ready();
  if (!iteration_sync_) {
    in_iteration_ = false;
    ++stats_.no_sync_iterations;
    step_progress_->step_end(false);
    return;
  }
  if (launch_error_) std::rethrow_exception(launch_error_);

  std::vector<std::size_t> missing;
  for (std::size_t i = 0; i < grads_.size(); ++i) {
    if (!ready_[i]) missing.push_back(i);
  }
  const bool first_static = options_.static_graph && !static_known_;
  if (!missing.empty()) {
    if (!options_.find_unused_parameters && !first_static) {
      in_iteration_ = false;
      throw_missing(missing);
    }
    for (std::size_t i : missing) mark_ready_locked(i, false);
  }

  // Which gradients some rank used: only needed to leave globally unused ones
  // untouched, and only when gradients may go unused.
  std::vector<std::int32_t> global_used;
  WorkPtr used_work;
  if (options_.find_unused_parameters && !options_.gradient_as_bucket_view) {
    global_used.assign(used_since_sync_.begin(), used_since_sync_.end());
    used_work = group_->allreduce(Buffer::of(global_used), ReduceOp::kSum);
  }

  // Without bucket views each bucket's averages are copied back into its
  // gradients as soon as it is finished, while the later buckets are still
  // being reduced; with find_unused_parameters, once it is known which
  // gradients some rank used (the used-flags go last).
  // The statistics' communication ends when the last bucket is finished, not
  // after its copy.
  const bool copy_back = !options_.gradient_as_bucket_view;
  auto comm_end = Clock::now();
  for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
    comm_end = finish_bucket_locked(bi, copy_back && !used_work);
  }
  if (used_work) {
    used_work->wait();
    comm_end = Clock::now();
  }

  std::size_t bytes = 0;
  for (const auto& b : buckets_) bytes += b.count * element_size(b.dtype);
  if (copy_back && used_work) {
    for (std::size_t i = 0; i < grads_.size(); ++i) {
      if (global_used[i] == 0) continue;
      grad_ops::copy(grads_[i].grad, slot(i));
    }
  }

  stats_.iterations += 1;
  stats_.backward_ms = ms_between(backward_start_, backward_end);
  stats_.comm_ms = any_launched_ ? ms_between(first_launch_, comm_end) : 0.0;
  stats_.exposed_comm_ms = ms_between(backward_end, comm_end);
  stats_.overlap = stats_.comm_ms > 0
                       ? std::clamp(1.0 - stats_.exposed_comm_ms / stats_.comm_ms, 0.0, 1.0)
                       : 0.0;
  stats_.num_buckets = buckets_.size();
  stats_.bytes_reduced = bytes;

  if (first_static) {
    for (std::size_t i = 0; i < grads_.size(); ++i) static_unused_[i] = used_since_sync_[i] ? 0 : 1;
    static_known_ = true;
  }
  std::fill(used_since_sync_.begin(), used_since_sync_.end(), 0);
  in_iteration_ = false;
  step_progress_->step_end(true);

  if (options_.debug) {
    debug_log_->info(
        "ddp rank {} iter {}: backward {:.2f} ms, comm {:.2f} ms, exposed comm {:.2f} ms, "
        "overlap {:.0f}%, {} buckets, {:.2f} MiB",
        group_->rank(), stats_.iterations, stats_.backward_ms, stats_.comm_ms,
        stats_.exposed_comm_ms, stats_.overlap * 100.0, stats_.num_buckets,
        static_cast<double>(bytes) / static_cast<double>(kMiB));
  }

  const bool may_rebuild = options_.static_graph || !options_.find_unused_parameters;
  if (!rebuilt_ && options_.rebuild_buckets && may_rebuild) rebuild();
}

Reducer::Clock::time_point Reducer::finish_bucket_locked(std::size_t bi, bool copy_back) {
  Bucket& b = buckets_[bi];
  b.work->wait();
  hook_->finish(*group_,
                GradBucket{bi, buckets_.size(), Buffer{b.data(), b.count, b.dtype, b.device}});
  const auto finished = Clock::now();
  if (copy_back) {
    for (std::size_t i : b.grads) grad_ops::copy(grads_[i].grad, slot(i));
  }
  return finished;
}

void Reducer::rebuild() {
  // The observed ready order, unused gradients last (reverse registration order).
  std::vector<std::int64_t> order;
  order.reserve(grads_.size());
  std::vector<char> seen(grads_.size(), 0);
  for (std::size_t i : ready_order_) {
    order.push_back(static_cast<std::int64_t>(i));
    seen[i] = 1;
  }
  for (std::size_t i = grads_.size(); i-- > 0;) {
    if (!seen[i]) order.push_back(static_cast<std::int64_t>(i));
  }
  if (group_->size() > 1 && !order.empty()) {
    // Ranks may observe different orders (threads, timing); rank 0's wins so
    // that every rank builds the same buckets.
    group_->broadcast(Buffer::of(order), 0)->wait();
  }
  std::vector<std::size_t> new_order;
  new_order.reserve(order.size());
  std::fill(seen.begin(), seen.end(), 0);
  for (auto v : order) {
    if (v < 0 || static_cast<std::size_t>(v) >= grads_.size() || seen[v]) {
      throw InternalError(kOrigin, "the bucket order received from rank 0 is not a permutation");
    }
    seen[v] = 1;
    new_order.push_back(static_cast<std::size_t>(v));
  }
  build_buckets(new_order);
  rebuilt_ = true;
  if (options_.debug) {
    debug_log_->info("ddp rank {}: rebuilt {} buckets in ready order", group_->rank(),
                     buckets_.size());
  }
}

void Reducer::throw_missing(const std::vector<std::size_t>& missing) const {
  std::string names;
  const std::size_t shown = std::min<std::size_t>(missing.size(), 20);
  for (std::size_t k = 0; k < shown; ++k) {
    if (k) names += ", ";
    names += describe(grads_[missing[k]], missing[k]);
  }
  if (shown < missing.size()) names += fmt::format(" and {} more", missing.size() - shown);
  throw InvalidArgument(
      kOrigin,
      fmt::format("rank {}: {} gradient(s) were never marked ready in this backward pass: {}. "
                  "If these parameters are unused in the forward pass, enable "
                  "find_unused_parameters (or static_graph when the same ones are always unused)",
                  group_->rank(), missing.size(), names));
}

void Reducer::wait_all_noexcept() {
  for (auto& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (...) {
      // Destruction or error path: the error was (or will be) reported elsewhere.
    }
  }
}

Reducer::NoSyncGuard::NoSyncGuard(Reducer& reducer) : reducer_(reducer) {
  std::lock_guard lock(reducer_.mutex_);
  previous_ = reducer_.sync_enabled_;
  reducer_.sync_enabled_ = false;
}

Reducer::NoSyncGuard::~NoSyncGuard() {
  std::lock_guard lock(reducer_.mutex_);
  reducer_.sync_enabled_ = previous_;
}

}  // namespace ddp
