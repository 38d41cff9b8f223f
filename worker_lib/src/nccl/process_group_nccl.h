// ProcessGroupNccl: see ddp/worker/process_group_nccl.h for the contract.
// Device-independent parts (id exchange, ordering, watchdog) live in work_tracker.h.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/worker/process_group_nccl.h"
#include "process_group_base.h"
#include "work_tracker.h"

namespace ddp::detail {

class NcclWork;  // process_group_nccl.cc

class ProcessGroupNccl final : public ProcessGroupBase<NcclOptions> {
 public:
  ProcessGroupNccl(std::shared_ptr<Store> store, int rank, int size, NcclOptions options);
  ~ProcessGroupNccl() override;

  std::string backend_name() const override { return "nccl"; }

  WorkPtr allreduce(Buffer buffer, ReduceOp op) override;
  WorkPtr broadcast(Buffer buffer, int root) override;
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

 private:
  // Enqueues `launch` (an NCCL call on stream_) under the issue-order lock and
  // returns a Work completed by the event recorded after it.
  // `kind` and `bytes` go to the progress page (collectives only).
  WorkPtr enqueue(const char* op, progress::Kind kind, std::uint64_t bytes,
                  const std::function<ncclResult_t()>& launch);
  void check_device(const Buffer& buffer, const char* what) const;
  void abort_comm();

  // Lock order: mutex_, then the tracker's lock or comm_mutex_; the watchdog
  // takes comm_mutex_ (the async_error hook) while it holds the tracker's lock,
  // so comm_mutex_ is never held while taking the tracker's.
  std::mutex mutex_;       // issue order; issued_, next_*_seq_
  std::mutex comm_mutex_;  // comm_'s lifetime and every NCCL call on it
  ncclComm_t comm_ = nullptr;
  std::vector<std::weak_ptr<NcclWork>> issued_;  // not yet seen completed
  cudaStream_t stream_ = nullptr;
  void* barrier_scratch_ = nullptr;
  std::uint64_t next_seq_ = 0;
  std::uint64_t next_p2p_seq_ = 0;
  std::unique_ptr<WorkTracker> tracker_;
};

}  // namespace ddp::detail
