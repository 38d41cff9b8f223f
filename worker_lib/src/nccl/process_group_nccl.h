// ProcessGroupNccl: see ddp/worker/process_group_nccl.h for the contract.
// Device-independent parts (id exchange, ordering, watchdog) live in work_tracker.h.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <mutex>

#include "arrival_tracker.h"
#include "ddp/worker/process_group_nccl.h"
#include "progress_recorder.h"
#include "work_tracker.h"

namespace ddp::detail {

class ProcessGroupNccl final : public ProcessGroup {
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
  WorkPtr send(Buffer buffer, int dst, int tag) override;
  WorkPtr recv(Buffer buffer, int src, int tag) override;

 private:
  // Enqueues `launch` (an NCCL call on stream_) under the issue-order lock and
  // returns a Work completed by the event recorded after it.
  // `kind` and `bytes` go to the progress page (collectives only).
  WorkPtr enqueue(const char* op, progress::Kind kind, std::uint64_t bytes,
                  const std::function<ncclResult_t()>& launch);
  void check_device(const Buffer& buffer, const char* what) const;
  void abort_comm();

  std::shared_ptr<Store> store_;
  NcclOptions options_;
  std::shared_ptr<ArrivalTracker> arrivals_;
  GroupProgress progress_;  // this group's slot of the progress page
  std::mutex mutex_;        // issue order and comm_ lifetime
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* barrier_scratch_ = nullptr;
  std::uint64_t next_seq_ = 0;
  std::uint64_t next_p2p_seq_ = 0;
  std::unique_ptr<WorkTracker> tracker_;
};

}  // namespace ddp::detail
