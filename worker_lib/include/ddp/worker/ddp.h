// DistributedDataParallel for plain C++ models: parameters (value + gradient
// buffers) and module buffers (running statistics and the like) registered by
// pointer, a Reducer underneath (see reducer.h for bucketing, overlap, no_sync,
// unused parameters and comm hooks).
//
//   std::vector<ddp::Parameter> params = {{"fc1.weight", {128, 784}, Buffer::of(w1), Buffer::of(g1)}, ...};
//   ddp::DistributedDataParallel model(pg, params, {}, options);  // collective: rank 0's values win
//   for (...) {
//     model.begin_forward();            // broadcasts module buffers (broadcast_buffers)
//     ... forward ...
//     model.begin_backward();
//     ... backward: after computing gradient i -> model.grad_ready(i) ...
//     model.finalize();                 // gradients hold the average over ranks
//     ... optimizer step, zero gradients ...
//   }
//
// Construction is collective (every rank of the group must construct it with the
// same parameter list): it checks that every rank registered the same number of
// parameters with the same shapes and dtypes, throwing InvalidArgument on every
// rank on a mismatch (naming the first differing parameter), then copies rank
// 0's parameter and buffer values to every rank.
//
// reform(group) (in-place recovery, see ddp::reform() in recovery.h): after
// the old group was aborted (GroupChanged), moves the model onto the new
// group. The interrupted step is dropped: the old Reducer goes (after waiting
// for its in-flight reductions, which fail at once on an aborted group), with
// its bucket state and its no_sync state, and the gradients are zeroed (the
// caller's buffers; the bucket views of gradient_as_bucket_view are new and
// zero, at other addresses: fetch grad(i) again after reform(); the new
// Reducer's layout_version() starts over, so it cannot tell). Then reform()
// makes the collectives construction makes (the consistency check when
// check_consistency is set, the broadcast of rank 0's parameters and buffers
// when broadcast_parameters is set) and builds a new Reducer with the same
// options, so a survivor calling reform() matches a newcomer that constructs
// a fresh DistributedDataParallel on the same group. Unlike construction,
// reform() takes part in the broadcast without changing this rank's values
// (it receives into scratch memory): rank 0 of the new group may be a
// newcomer, whose values must not overwrite the survivors'. Make the replicas
// identical afterwards with ReplicaState::sync (replica_state.h), which copies
// the lowest live rank's state. A stateful comm hook is kept as it is (a
// newcomer's starts fresh). Throws InvalidArgument when the group is null or a
// no_sync() guard is alive (let it go out of scope first), and what the
// collectives throw; after a failed reform() the model keeps the old (aborted)
// group and Reducer, and reform() may be called again with another group.
//
// Threading and errors: as the Reducer's.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/worker/process_group.h"
#include "ddp/worker/reducer.h"

namespace ddp {

struct Parameter {
  std::string name;
  std::vector<std::int64_t> shape;  // empty means {value.count}
  Buffer value;                     // the weights; broadcast from rank 0 at construction
  Buffer grad;                      // same count and dtype (ignored with gradient_as_bucket_view)
};

struct ModuleBuffer {
  std::string name;
  Buffer value;  // any dtype; broadcast from rank 0 at construction and each begin_forward()
};

struct DdpOptions {
  ReducerOptions reducer;
  // Copy rank 0's module buffers to every rank at the start of every forward pass.
  bool broadcast_buffers = true;
  // Copy rank 0's parameters and buffers to every rank at construction.
  bool broadcast_parameters = true;
  // Verify at construction that all ranks registered the same parameters.
  bool check_consistency = true;
};

struct DdpStats {
  double forward_ms = 0;  // begin_forward() -> begin_backward() of the last synchronized step
  ReducerStats reducer;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<ProcessGroup> group, std::vector<Parameter> params,
                          std::vector<ModuleBuffer> buffers = {}, DdpOptions options = {});

  // Moves the model onto a new group after a re-form; see the header comment.
  // Collective on `group`.
  void reform(std::shared_ptr<ProcessGroup> group);

  void begin_forward();
  void begin_backward();
  void grad_ready(std::size_t i) { reducer_->mark_grad_ready(i); }
  void finalize();

  // The gradient memory of parameter i (a bucket view with gradient_as_bucket_view;
  // fetch it again after finalize(), see reducer.h).
  Buffer grad(std::size_t i) const { return reducer_->grad(i); }
  const Parameter& parameter(std::size_t i) const { return params_.at(i); }
  std::size_t num_parameters() const { return params_.size(); }

  [[nodiscard]] Reducer::NoSyncGuard no_sync() { return reducer_->no_sync(); }
  Reducer& reducer() { return *reducer_; }
  DdpStats stats() const;
  ProcessGroup& group() const { return *group_; }

 private:
  std::vector<GradientSpec> gradient_specs() const;
  // The collectives of construction on `group`; with keep_values, rank != 0
  // receives the broadcast into scratch memory.
  void construction_collectives(ProcessGroup& group, bool keep_values);

  std::shared_ptr<ProcessGroup> group_;
  std::vector<Parameter> params_;
  std::vector<ModuleBuffer> buffers_;
  DdpOptions options_;
  std::unique_ptr<Reducer> reducer_;
  std::chrono::steady_clock::time_point forward_start_{};
  bool in_forward_ = false;
  double forward_ms_ = 0;
  double pending_forward_ms_ = 0;
};

// ---- collective helpers (also used by the libtorch adapter) ---------------------

struct TensorMeta {
  std::string name;
  std::vector<std::int64_t> shape;
  DType dtype = DType::kFloat32;
};

// Collective. Throws InvalidArgument on every rank when any rank's list differs
// from rank 0's in count, shapes or dtypes; the message names the ranks that
// differ and, on each such rank, the first differing parameter.
void check_parameter_consistency(ProcessGroup& group, const std::vector<TensorMeta>& params);

// Collective. Copies `root`'s buffers into every rank's, packing small buffers of
// one dtype into messages of at most `chunk_bytes`. Every rank passes the same
// counts and dtypes in the same order. Blocks until done.
void broadcast_coalesced(ProcessGroup& group, const std::vector<Buffer>& buffers, int root,
                         std::size_t chunk_bytes = 25 * kMiB);

}  // namespace ddp
