// ReplicaState: what makes this process a replica of the job (parameters,
// module buffers, optimizer state, and the program's own counters such as the
// global step, the epoch and the sampler's position), so that after the job's
// membership changed every rank can be made identical to the survivors.
//
//   ddp::ReplicaState state;
//   for (auto& p : params) state.add(p.name, p.value);      // caller-owned memory
//   state.add("optimizer.momentum.fc1", ddp::Buffer::of(m1));
//   state.add("global_step", &global_step);                 // an int64 counter
//   state.sync(*ddp::default_group());                      // at start: rank 0's wins
//   for (;;) {
//     try { ... train ... }
//     catch (const ddp::GroupChanged&) {
//       ddp::reform();                                      // recovery.h: the new group
//       model.reform(ddp::default_group());                 // ddp.h
//       state.sync(*ddp::default_group());                  // the survivors' state wins
//     }
//   }
//
// sync(group) is collective: every rank of `group` calls it, with the same
// registrations. Afterwards every rank's registered memory holds the state of
// the ROOT: the lowest rank whose state is live (see live()), or rank 0 when no
// rank's is (a fresh start). A process that joined a running job (a newcomer:
// nothing synced in this process yet) thus receives the survivors' state,
// wherever the new round placed it. The root's own memory is never written.
//
// live(): true once a sync() succeeded in this process; the registered memory
// then holds the job's state as of that sync, carried forward by training.
// Call sync() once at the start, after loading any checkpoint (on every rank
// or only on rank 0): every rank then gets rank 0's state and becomes live. A
// program that never synced before a failure has no live rank, and the next
// sync() takes rank 0's state, which after a re-form may be a newcomer's.
// A sync() that fails after the transfer began leaves a receiving rank not live
// (its memory may be partly overwritten); the root keeps its liveness.
//
// Collectives (only allreduce, broadcast and broadcast_many of `group`, so the calls match on
// every rank as long as every rank calls sync() at the same point):
//   1. one int64 allreduce of a table with every rank's liveness and a digest
//      of its registrations (count, names, kinds, dtypes, element counts, CPU or
//      CUDA); the root follows from it;
//   2. when the digests differ: broadcasts of the registration lists of the
//      root and of (at most 8 of) the ranks that differ, then InvalidArgument on
//      every rank naming each such rank's first difference from the root's
//      list. Nothing is transferred and liveness is unchanged;
//   3. otherwise the state from the root. Where the group's broadcast is fast
//      (ProcessGroup::broadcast_is_fast: Gloo with every rank on one host), by
//      one broadcast_many of every CPU buffer and counter, in place (through
//      the shared-memory segment: no staging memory, one copy in and one out).
//      Elsewhere by all-reduces (SUM, in place) of integer words in which every
//      other rank contributes zeros: adding zero leaves every bit of the root's
//      values as it is, whatever their dtype (NaN payloads, -0.0). A CPU buffer
//      of at least in_place_bytes() (1 MiB unless set) goes in place, in one
//      all-reduce of its own; the other buffers and the counters are laid end
//      to end in host staging memory (at most staging_bytes(), 64 MiB unless
//      set): one all-reduce a slice, copied in on the root and out on the
//      others. CUDA buffers always go through host staging.
// sync_agreed(group, root, root_live) is step 3 alone, for a caller that
// compared the ranks' registrations and liveness itself (ddp_torch.sync_state
// exchanges them first, with the optimizer state's layout to allocate).
// The group must take CPU buffers (Gloo); CUDA buffers are copied to and from
// host memory with cudaMemcpy (a build without NCCL/CUDA rejects them in add()).
//
// Ownership: the registered memory is the caller's and must stay valid (and
// not be used by anything else) during sync(); ReplicaState only keeps views.
// Blocking: sync() blocks until done, bounded by the group's timeout.
// Thread-safety: none (like the program's training loop that owns it); add()
// and sync() belong to one thread, live() and bytes() may be read by it.
// Errors: add() throws InvalidArgument for an empty or duplicate name, a null
// pointer with a nonzero count, or a CUDA buffer in a build without CUDA.
// sync() throws InvalidArgument when the ranks' registrations differ, and
// whatever the group throws (GroupChanged, TimeoutError, NetworkError, ...).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/worker/process_group.h"

namespace ddp {

struct SyncResult {
  int root = 0;            // the rank whose state every rank now holds
  bool received = false;   // this rank's memory was overwritten with the root's (rank != root)
  bool from_live = false;  // the root had live state (a survivor), not a fresh start's
  std::size_t bytes = 0;   // bytes of state moved from the root (0 in a group of one)
  double seconds = 0;      // wall time of sync()
  int round = -1;          // the agent's round it synced in (-1: none named; see Synced)
};

class ReplicaState {
 public:
  ReplicaState() = default;
  ReplicaState(const ReplicaState&) = delete;
  ReplicaState& operator=(const ReplicaState&) = delete;
  ReplicaState(ReplicaState&&) = default;
  ReplicaState& operator=(ReplicaState&&) = default;

  // A tensor of the replica (parameter, module buffer, optimizer state), any
  // dtype, on the CPU or a CUDA device. Register everything before the first
  // sync(), in the same order on every rank.
  void add(std::string name, Buffer buffer);
  // A counter of the program (global step, epoch, sampler position...).
  void add(std::string name, std::int64_t* counter);

  // Collective; see the header comment.
  SyncResult sync(ProcessGroup& group);
  // Collective: the transfer alone, from `root` (whose state was live or not:
  // `root_live`, reported in the result). Every rank must pass the same root
  // and hold the same registrations: nothing checks it here (a group with
  // debug_detail catches sizes that differ). InvalidArgument when root is not
  // a rank of the group.
  SyncResult sync_agreed(ProcessGroup& group, int root, bool root_live);

  // Whether this process holds live state (a sync() succeeded here).
  bool live() const { return live_; }
  // Carries the liveness of an earlier ReplicaState of this process, for a
  // caller that registers its state anew for each sync (ddp_torch.sync_state:
  // a torch optimizer's state appears lazily). Pass what live() said after
  // that earlier sync() returned or threw.
  void set_live(bool live) { live_ = live; }
  // CPU buffers of at least this many bytes move in place, one all-reduce
  // each; smaller ones are staged together (see the header comment). Each
  // all-reduce costs a group with debug_detail one more exchange (the torch
  // backend's groups check every collective): such a caller stages more.
  void set_in_place_bytes(std::size_t bytes);
  std::size_t in_place_bytes() const { return in_place_bytes_; }
  // The most host memory sync() stages state in (see the header comment):
  // a multiple of 8, at least 8; InvalidArgument otherwise.
  void set_staging_bytes(std::size_t bytes);
  std::size_t staging_bytes() const { return staging_bytes_; }
  // Bytes of registered state (buffers plus 8 per counter).
  std::size_t bytes() const;
  // Number of registrations (buffers and counters).
  std::size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string name;
    bool counter = false;
    Buffer buffer;  // a counter is one kInt64 element on the CPU
  };
  // Step 3 of sync(), which began at `start`.
  SyncResult transfer(ProcessGroup& group, int root, bool root_live,
                      std::chrono::steady_clock::time_point start);

  std::vector<Entry> entries_;
  bool live_ = false;
  std::size_t in_place_bytes_ = std::size_t{1} << 20;
  std::size_t staging_bytes_ = std::size_t{64} << 20;
};

}  // namespace ddp
