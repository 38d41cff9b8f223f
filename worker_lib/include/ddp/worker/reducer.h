// The Reducer: DDP-style gradient bucketing with communication overlapped
// with the backward pass. Framework-agnostic: it knows gradient buffers
// (pointer, count, dtype, device, name, shape), not tensors or autograd.
//
// One training step, as the training code drives it:
//
//   reducer.prepare_for_backward();     // optional: start of the backward pass
//   ... backward computes grad i, then reducer.mark_grad_ready(i) ...
//   reducer.finalize();                 // waits; grads now hold the average
//   ... optimizer step; the caller zeroes the gradients when it wants to ...
//
// Buckets: gradients are grouped into buckets by size, in REVERSE registration
// order (the backward pass produces the last layers first), separately per dtype
// and device. A bucket holds at most bucket_cap_bytes (the very first bucket of
// each dtype/device at most first_bucket_cap_bytes, so communication starts
// early); a gradient larger than the cap gets a bucket of its own.
//
// Overlap: when the last gradient of a bucket is marked ready, its reduction is
// launched asynchronously through the comm hook, on the marking thread. Buckets
// are launched strictly in bucket order, identically on every rank: a bucket
// that is complete before its predecessors waits for them.
//
// finalize(): launches whatever is left, waits for every bucket in order, and
// (unless the gradients are bucket views) copies the averages back into the
// gradient buffers, each bucket's as soon as it is finished, while later
// buckets are still being reduced (with find_unused_parameters: after all, once
// the used-flags are known). Bucket views skip both copies, into the buckets
// and back: with 2 ranks on 2 cores they are what most of DDP's added step
// time was (bench/RESULTS.md).
//
// Rebuild: after the first synchronized iteration the buckets are rebuilt once
// in the order in which gradients became ready, as observed on rank 0 (the order
// is broadcast from rank 0, so every rank gets the same buckets). Skipped when
// find_unused_parameters is on without static_graph (the order may change).
//
// no_sync(): under the guard, finalize() communicates nothing; gradients just
// stay (and the caller's backward accumulates into them). The first synchronized
// iteration after it reduces the accumulated sums.
//
// Unused parameters: with find_unused_parameters, gradients never marked ready
// by finalize() contribute zeros (or their locally accumulated value from no_sync
// iterations); a gradient that no rank used is left untouched (non-view mode).
// Without it, finalize() throws InvalidArgument naming every missing gradient
// (index and name) rather than waiting forever. With static_graph the gradients
// left unused in the first iteration are marked ready at the start of later
// backward passes, so their buckets do not wait for finalize().
//
// gradient_as_bucket_view: the Reducer owns the gradient memory (register specs
// with grad.data == nullptr or any pointer: it is ignored), grad(i) is a view into
// a bucket, the backward writes there directly and nothing is copied either way.
// The views move exactly once, when the buckets are rebuilt at the end of the
// first synchronized finalize() (values are preserved): fetch grad(i) again
// after each finalize() (layout_version() tells when they moved).
//
// Threading: mark_grad_ready() may be called from any thread (it takes the
// Reducer's lock); the other methods belong to the training thread. The process
// group must be used by nobody else while a step is in flight, or must see the
// same collectives in the same order on every rank.
//
// Errors: InvalidArgument for misuse (index out of range, a gradient marked twice
// in one iteration, gradients missing at finalize, bad specs or options);
// whatever the process group throws (TimeoutError, BackendError, ...) from
// mark_grad_ready() (launch) or finalize() (wait). After a communication error the
// Reducer is unusable.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/worker/comm_hooks.h"
#include "ddp/worker/process_group.h"

namespace spdlog {
class logger;
}

namespace ddp {

namespace detail {
class StepProgress;  // progress_recorder.h: step boundaries for the agent
}

inline constexpr std::size_t kMiB = std::size_t{1} << 20;

struct ReducerOptions {
  // Maximum bytes of a bucket (PyTorch's bucket_cap_mb = 25). Must be > 0.
  std::size_t bucket_cap_bytes = 25 * kMiB;
  // Maximum bytes of the first bucket of each dtype/device (PyTorch: 1 MiB). Must be > 0.
  std::size_t first_bucket_cap_bytes = 1 * kMiB;
  // The gradients live in the buckets; see the header comment.
  bool gradient_as_bucket_view = false;
  // Gradients not marked ready by finalize() contribute zeros instead of an error.
  bool find_unused_parameters = false;
  // The set of used gradients and their ready order are the same every iteration.
  bool static_graph = false;
  // Rebuild the buckets once, in observed ready order, after the first iteration.
  // A process resumed from a checkpoint rebuilds again, so for some steps its
  // layout differs from the uninterrupted run's; with Gloo's ring all-reduce
  // (TCP, 3 or more ranks) an element's summation order depends on its place in
  // the bucket, and the last bits differ. Bit-identical resumes: false.
  bool rebuild_buckets = true;
  // How buckets are reduced; nullptr means allreduce_hook().
  CommHookPtr comm_hook;
  // Log the statistics of every synchronized iteration to stderr; also on when
  // the environment has DDP_DEBUG set to anything but 0/false/no/off.
  bool debug = false;

  // Throws InvalidArgument naming the bad field.
  void validate() const;
};

// One gradient, as registered. The memory behind grad is owned by the caller
// (except with gradient_as_bucket_view) and must outlive the Reducer.
struct GradientSpec {
  std::string name;                 // used in error messages; may be empty
  std::vector<std::int64_t> shape;  // product must equal grad.count; empty means {grad.count}
  Buffer grad;                      // floating dtypes only: kFloat32/64, kFloat16, kBFloat16
};

// Timings of the last synchronized iteration, in milliseconds.
struct ReducerStats {
  std::uint64_t iterations = 0;  // synchronized iterations finalized
  std::uint64_t no_sync_iterations = 0;
  double backward_ms = 0;      // prepare_for_backward (or first ready) -> finalize() called
  double comm_ms = 0;          // first bucket launched -> last bucket complete
  double exposed_comm_ms = 0;  // time finalize() spent waiting for communication
  double overlap = 0;          // 1 - exposed/comm: the share of comm hidden behind backward
  std::size_t num_buckets = 0;
  std::size_t bytes_reduced = 0;
};

class Reducer {
 public:
  // Validates specs and options and builds the initial buckets. Collective-free:
  // the rank consistency checks and parameter broadcast live in ddp.h.
  Reducer(std::shared_ptr<ProcessGroup> group, std::vector<GradientSpec> grads,
          ReducerOptions options = {});
  // Waits for in-flight reductions (errors are swallowed).
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  std::size_t num_gradients() const { return grads_.size(); }
  const GradientSpec& spec(std::size_t i) const;
  // The gradient memory of i (a bucket view with gradient_as_bucket_view).
  Buffer grad(std::size_t i) const;
  // Incremented whenever grad(i) pointers may have changed (bucket rebuild).
  std::uint64_t layout_version() const { return layout_version_; }

  // Gradient indices per bucket, in launch order. For tests and logging.
  std::vector<std::vector<std::size_t>> bucket_assignment() const;
  bool buckets_rebuilt() const { return rebuilt_; }

  // Starts the backward pass of an iteration (optional: mark_grad_ready() starts
  // one too). Captures whether this iteration synchronizes (see no_sync()).
  void prepare_for_backward();
  // Gradient i is final for this backward pass. Thread-safe. May launch buckets.
  void mark_grad_ready(std::size_t i);
  // Ends the iteration; blocks until every bucket is reduced. See the header.
  void finalize();

  // RAII: iterations started while a guard is alive do not synchronize.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Reducer& reducer);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    Reducer& reducer_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  bool sync_enabled() const { return sync_enabled_; }

  const ReducerStats& stats() const { return stats_; }
  ProcessGroup& group() const { return *group_; }
  const ReducerOptions& options() const { return options_; }

 private:
  struct Bucket {
    std::vector<std::size_t> grads;    // gradient indices, in order
    std::vector<std::size_t> offsets;  // element offset of each gradient
    DType dtype = DType::kFloat32;
    Device device;
    std::size_t count = 0;               // elements
    std::vector<std::uint64_t> storage;  // the flat memory (8-byte aligned)
    std::size_t pending = 0;             // gradients not yet ready this iteration
    WorkPtr work;
    bool launched = false;
    void* data() { return storage.data(); }
  };
  struct Location {
    std::size_t bucket = 0;
    std::size_t offset = 0;  // elements
  };

  void build_buckets(const std::vector<std::size_t>& order);
  void start_iteration_locked();
  void mark_ready_locked(std::size_t i, bool used);
  void launch_ready_buckets_locked();
  // Waits for bucket bi and runs the hook's finish(); with copy_back, copies its
  // averages into its gradients' own memory. Returns when the bucket was finished
  // (before the copy).
  std::chrono::steady_clock::time_point finish_bucket_locked(std::size_t bi, bool copy_back);
  void rebuild();
  void wait_all_noexcept();
  Buffer slot(std::size_t i);
  [[noreturn]] void throw_missing(const std::vector<std::size_t>& missing) const;

  std::shared_ptr<ProcessGroup> group_;
  std::vector<GradientSpec> grads_;
  ReducerOptions options_;
  CommHookPtr hook_;

  std::vector<Bucket> buckets_;
  std::vector<Location> location_;
  std::uint64_t layout_version_ = 0;
  bool rebuilt_ = false;

  mutable std::mutex mutex_;
  bool in_iteration_ = false;
  bool iteration_sync_ = true;
  bool sync_enabled_ = true;
  std::vector<char> ready_;               // per gradient, this iteration
  std::vector<char> used_since_sync_;     // per gradient, across no_sync iterations
  std::vector<std::size_t> ready_order_;  // this iteration
  std::vector<char> static_unused_;       // static_graph: unused in the first iteration
  bool static_known_ = false;
  std::size_t next_launch_ = 0;
  std::exception_ptr launch_error_;

  using Clock = std::chrono::steady_clock;
  Clock::time_point backward_start_{};
  Clock::time_point first_launch_{};
  bool any_launched_ = false;
  ReducerStats stats_;
  std::unique_ptr<detail::StepProgress> step_progress_;
  std::shared_ptr<spdlog::logger> debug_log_;  // set when options_.debug
};

}  // namespace ddp
