// ProcessGroupGloo: see ddp/worker/process_group_gloo.h for the contract.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include <gloo/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "ddp/worker/process_group_gloo.h"
#include "gloo/collective_check.h"
#include "gloo/hierarchical.h"
#include "joined_thread.h"
#include "process_group_base.h"
#include "reduce_functions.h"
#include "shm/shm_allreduce.h"
#include "work_impl.h"

namespace ddp::detail {

// The Work of a recv_any: it also names the rank the message came from.
class RecvAnyWork final : public WorkImpl {
 public:
  using WorkImpl::WorkImpl;
  int source_rank() const override { return source_.load(std::memory_order_acquire); }
  // Before the Work completes: the rank received from.
  void set_source_rank(int rank) { source_.store(rank, std::memory_order_release); }

 private:
  std::atomic<int> source_{-1};
};

class ProcessGroupGloo final : public ProcessGroupBase<GlooOptions> {
 public:
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, GlooOptions options);
  ~ProcessGroupGloo() override;

  std::string backend_name() const override { return "gloo"; }

  WorkPtr allreduce(Buffer buffer, ReduceOp op) override;
  WorkPtr broadcast(Buffer buffer, int root) override;
  WorkPtr broadcast_many(std::vector<Buffer> buffers, int root) override;
  WorkPtr allgather(Buffer output, Buffer input) override;
  WorkPtr reduce_scatter(Buffer output, Buffer input, ReduceOp op) override;
  WorkPtr reduce(Buffer buffer, int root, ReduceOp op) override;
  WorkPtr barrier() override;
  WorkPtr gather(Buffer output, Buffer input, int root) override;
  WorkPtr scatter(Buffer output, Buffer input, int root) override;
  WorkPtr alltoall(Buffer output, Buffer input, std::vector<std::size_t> output_counts,
                   std::vector<std::size_t> input_counts) override;
  WorkPtr send(Buffer buffer, int dst, int tag) override;
  WorkPtr recv(Buffer buffer, int src, int tag) override;
  WorkPtr recv_any(Buffer buffer, int tag) override;
  void abort(const std::string& reason) override;
  bool broadcast_is_fast() const override { return shm_ != nullptr; }

 private:
  struct Task {
    std::shared_ptr<WorkImpl> work;
    std::optional<CollectiveDescriptor> collective;  // nullopt for send/recv
    std::function<void(std::uint32_t tag, const std::shared_ptr<WorkImpl>&)> run;  // throws
  };
  struct PendingP2p {
    std::shared_ptr<WorkImpl> work;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    bool is_send;
    int peer;  // -1: any other rank (recv_any)
    int tag;
  };

  WorkPtr enqueue_collective(CollectiveDescriptor desc, std::function<void(std::uint32_t)> run);
  // A send to `peer`, or a receive from `peer` (-1: from any other rank, with a
  // RecvAnyWork), posted on the worker thread in issue order.
  WorkPtr enqueue_p2p(const char* op, Buffer buffer, bool is_send, int peer, int tag);
  // On the worker thread: `buffers` from `root`, through shared memory when the
  // group has it, else one Gloo broadcast each.
  void broadcast_now(const std::vector<Buffer>& buffers, int root, std::uint32_t tag);
  void worker_loop();
  void p2p_loop();
  void run_task(Task& task);
  // Wakes the send or receive p2p_loop waits on, if any. p2p_mutex_ held.
  void wake_p2p_wait();
  void check_consistency(const CollectiveDescriptor& desc);
  std::exception_ptr translate(const std::exception& error, const CollectiveDescriptor& desc);
  // In place, by the configured algorithm; AVG divides. Worker thread only.
  void allreduce_in_place(void* data, std::size_t count, DType dtype, ReduceOp op, ReduceFn fn,
                          std::uint32_t tag);
  void allreduce_direct(void* data, std::size_t count, DType dtype, ReduceOp op, std::uint32_t tag);
  // Within the host through local_shm_, between hosts a ring of their leaders,
  // pipelined by chunks (see GlooOptions::hierarchical). No division (AVG).
  void allreduce_hierarchical(void* data, std::size_t count, DType dtype, ReduceFn fn,
                              std::uint32_t tag);
  // Sets up the hierarchy's per-host segments after plan_; "" or why not.
  std::string setup_hierarchy(bool want_shm);

 public:
  AllreduceAlgorithm last_allreduce_algorithm() const {
    return last_algorithm_.load(std::memory_order_acquire);
  }

 private:
  // Completes `work` (it succeeded) unless the group was aborted meanwhile: then
  // it fails with GroupChanged.
  void complete_unless_aborted(const std::shared_ptr<WorkImpl>& work);
  // Fails every connection of the group that still works with an IoException
  // (`message`): every operation pending on one wakes at once, every later one
  // throws, and each is closed (with a TCP reset when `reset`, so that the
  // peers' watchers tell it from a group destroyed in order). Returns once all
  // are closed: up to 10 ms per peer (a tick of Gloo's event loop each).
  void fail_connections(const std::string& message, bool reset);
  // The watcher thread: fails the whole group once one of its connections was
  // reset by a peer (see ddp/worker/process_group_gloo.h).
  void watch_loop();
  bool check_connections(std::vector<char>& inspected);  // true: nothing more to watch

  bool debug_detail_ = false;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<ShmAllreduce> shm_;        // null: no same-host segment
  HostPlan plan_;                            // where the group's ranks are
  bool hierarchical_ = false;                // the hierarchical all-reduce applies
  std::unique_ptr<ShmAllreduce> local_shm_;  // this host's ranks (hierarchical, > 1 local rank)
  std::vector<std::uint8_t> ring_scratch_;   // leader's network thread only
  std::atomic<AllreduceAlgorithm> last_algorithm_{AllreduceAlgorithm::kAuto};

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::atomic<int> queued_{0};  // queue_.size(), readable without the lock
  bool stop_ = false;
  std::uint64_t next_seq_ = 0;
  std::uint64_t next_p2p_seq_ = 0;
  std::vector<std::uint8_t> direct_scratch_;  // worker thread only
  std::exception_ptr broken_;                 // touched by the worker thread only
  std::string broken_what_;

  std::mutex p2p_mutex_;
  std::condition_variable p2p_cv_;
  std::deque<PendingP2p> p2p_queue_;
  bool p2p_stop_ = false;
  gloo::transport::UnboundBuffer* p2p_current_ = nullptr;  // being waited on; guarded by p2p_mutex_
  bool p2p_current_is_send_ = false;

  // Abort: abort_mutex_ serializes abort() calls (a second one returns once the
  // first has finished); abort_ (the base's) is set under mutex_.
  std::mutex abort_mutex_;

  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;
  std::mutex fail_mutex_;  // one fail_connections() at a time

  JoinedThread worker_;
  JoinedThread p2p_worker_;
  JoinedThread watcher_;  // only for groups of more than one rank
};

}  // namespace ddp::detail
