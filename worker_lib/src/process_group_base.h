// What the process groups of every backend (ProcessGroupGloo, ProcessGroupNccl)
// share: their options and store, the checks their constructors make before
// anything connects, the arrival tracker, the group's slot of the progress page
// and the abort signal. Internal to the worker library; a backend derives from
// ProcessGroupBase<ItsOptions> and implements ProcessGroup's operations.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "arrival_tracker.h"
#include "ddp/worker/process_group.h"
#include "progress_recorder.h"
#include "work_impl.h"

namespace ddp {
class Store;
}  // namespace ddp

namespace ddp::detail {

// The abort of one group (ProcessGroup::abort): set once, with the first reason.
// Thread-safety: set() is called with the group's issue lock held (one caller at
// a time); is_set() and error() from any thread. reason() and error() only once
// is_set() was seen true.
class GroupAbort {
 public:
  // `backend` names the errors' origin ("ProcessGroupGloo" gives
  // "ProcessGroupGloo::allreduce"); `group` ("group 'default' rank 0/2") starts
  // their message.
  GroupAbort(std::string backend, std::string group);

  // Marks the group aborted with `reason`; false (nothing changes) when it
  // already was.
  bool set(const std::string& reason);
  bool is_set() const { return aborted_.load(std::memory_order_acquire); }
  const std::string& reason() const { return reason_; }
  // GroupChanged for operation `op` #`seq`: "<group>: <op> #<seq> failed: the
  // group was aborted: <reason>".
  std::exception_ptr error(const std::string& op, std::uint64_t seq) const;

 private:
  const std::string backend_;
  const std::string group_;
  std::atomic<bool> aborted_{false};
  std::string reason_;  // written before aborted_ is set (release), read after (acquire)
};

// The constructors' preamble: InvalidArgument (origin `backend`) for a null
// store, a size below 1, a rank outside [0, size) or a timeout that is not
// positive. A rank that refuses its arguments connects to no peer.
void check_group_arguments(const char* backend, const Store* store, int rank, int size,
                           std::chrono::milliseconds timeout);

// The collectives' argument checks, InvalidArgument (origin `origin`, e.g.
// "ProcessGroupGloo::gather") when they fail:
// - `root` is a rank of a group of `size`;
void check_root(const char* origin, int root, int size);
// - `whole` holds `size` chunks of `chunk`'s dtype and count (gather's output,
//   scatter's input, allgather's output, reduce_scatter's input);
void check_chunks(const char* origin, const Buffer& whole, const Buffer& chunk,
                  const char* whole_name, const char* chunk_name, int size);
// - an all-to-all's buffers: the same dtype, each one's counts per rank as
//   given (`size` entries adding up to its count) or, when empty, an even split
//   of it, and as many elements from this rank `rank` to itself as it expects.
struct AlltoallSplit {
  std::vector<std::uint64_t> input;   // elements to each rank
  std::vector<std::uint64_t> output;  // elements from each rank
};
AlltoallSplit split_alltoall(const char* origin, const Buffer& output, const Buffer& input,
                             const std::vector<std::size_t>& output_counts,
                             const std::vector<std::size_t>& input_counts, int rank, int size);

// `Options` has `timeout` (std::chrono::milliseconds) and `name` (std::string).
// Thread-safety: the members are set in the constructor and start_tracking()
// (the derived constructor's thread) and only read afterwards, except as each
// member's own type allows (ArrivalTracker, GroupProgress, GroupAbort).
template <typename Options>
class ProcessGroupBase : public ProcessGroup {
 protected:
  // Checks the arguments (check_group_arguments); `backend` names the errors'
  // origin ("ProcessGroupGloo").
  ProcessGroupBase(const char* backend, std::shared_ptr<Store> store, int rank, int size,
                   Options options)
      : ProcessGroup(rank, size), store_(std::move(store)), options_(std::move(options)) {
    check_group_arguments(backend, store_.get(), rank, size, options_.timeout);
    abort_ = std::make_shared<GroupAbort>(
        backend,
        "group '" + options_.name + "' rank " + std::to_string(rank) + "/" + std::to_string(size));
  }

  // Once the backend is connected: the arrival tracker (its publisher thread
  // starts) and the group's slot of the progress page (claimed for good).
  void start_tracking() {
    arrivals_ = std::make_shared<ArrivalTracker>(store_, rank(), size());
    progress_ = GroupProgress(options_.name, rank(), size());
  }

  // A Work failed at once with the abort's GroupChanged (an operation issued
  // after abort()). Only once abort_->is_set().
  std::shared_ptr<WorkImpl> failed_work(std::uint64_t seq, const char* op) const {
    auto work = std::make_shared<WorkImpl>(seq, op, options_.timeout + std::chrono::seconds(10));
    work->fail(abort_->error(op, seq));
    return work;
  }

  std::shared_ptr<Store> store_;  // the group's own namespace
  Options options_;
  std::shared_ptr<ArrivalTracker> arrivals_;  // null until start_tracking()
  GroupProgress progress_;                    // this group's slot of the progress page
  // Shared with Works that check it themselves (NCCL's).
  std::shared_ptr<GroupAbort> abort_;
};

}  // namespace ddp::detail
