// ProcessGroupDdp: torch.distributed's backend "ddp", a c10d::ProcessGroup
// whose collectives run on ddp::worker's process groups.
//
// CPU tensors go through a ddp Gloo group (shared memory on one host, Gloo's
// TCP between hosts) made at construction over torch's store; CUDA tensors
// through a ddp NCCL group made on the first CUDA collective (every rank must
// issue it; builds without NCCL: a RuntimeError saying so). Each torch group
// is its own ddp group, named after torch's group ("default" for the first,
// torch's number for new_group's), which is its name on the progress page.
//
// Semantics are torch's (see the collectives' comments in c10d/ProcessGroup.hpp);
// every collective returns at once with a WorkDdp (wait(), getFuture()).
// Unsupported calls, dtypes and arguments throw c10::Error (RuntimeError)
// naming them; ddp's own errors (peers disagreeing on a collective, a timeout,
// a dead peer) fail the Work with ddp's message.
//
// Ranks disagreeing on a collective's op, size, dtype or root: every
// collective is checked across the ranks first (ddp's DETAIL check: one small
// exchange per collective), unless the environment sets DDP_TORCH_CHECK=0.
//
// In-place recovery (ddp::in_place, ddp/worker/recovery.h; ddp_torch.reform()):
// when the program opted in, the group belongs to the round it was made in.
// Its ddp groups are aborted when that round ends, so every pending and later
// collective fails with ddp::GroupChanged (ddp_torch.GroupChanged), and a
// collective that failed as a peer died waits for the agent's word first, so
// that it fails with GroupChanged too. Once this worker joined a later round
// every collective throws c10::Error (RuntimeError) naming the round the
// group belonged to: groups are made again after reform().
//
// Thread-safe like ddp::ProcessGroup: issue order is the order of the calls.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/worker/process_group.h"
#include "future_completer.h"

namespace ddp {
class Store;
}

namespace ddp::torch_backend {

class ProcessGroupDdp final : public c10d::ProcessGroup {
 public:
  // Blocks until every rank of the group joined (at most `timeout`, which also
  // bounds every collective; with in-place recovery, until the round ends).
  // Throws what make_gloo_process_group throws (GroupChanged when the round ended).
  ProcessGroupDdp(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  std::chrono::milliseconds timeout);
  ~ProcessGroupDdp() override;

  const std::string getBackendName() const override { return "ddp"; }
  // The ddp group's name (progress page, error messages).
  const std::string& name() const { return name_; }
  // The ddp group behind CPU tensors (ddp_torch.sync_state moves the replica's
  // state through it); lives as long as this group.
  ddp::ProcessGroup& cpu_group() const { return *cpu_group_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  // outputs[r][i] receives rank r's inputs[i]; the inputs share one dtype.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

 private:
  // Throws c10::Error naming the round this group belonged to when this
  // worker re-formed into another since.
  void check_current_round(const char* op) const;
  // The ddp group for `tensor`'s device (the CUDA group is made on first use).
  ddp::ProcessGroup& group_for(const at::Tensor& tensor, const char* op);
  // Wraps `work` for torch; `finish` runs once it succeeded.
  c10::intrusive_ptr<c10d::Work> follow(c10d::OpType type, const char* op, ddp::WorkPtr work,
                                        std::function<void()> finish,
                                        std::vector<at::Tensor> outputs);
  // One tensor used in place (sent, received, reduced, broadcast): `issue`
  // starts the ddp operation on its buffer.
  c10::intrusive_ptr<c10d::Work> in_place(
      c10d::OpType type, const char* op, std::vector<at::Tensor>& tensors,
      const std::function<ddp::WorkPtr(ddp::ProcessGroup&, Buffer)>& issue);
  // An output and an input tensor (the *_base collectives): `issue` starts the
  // ddp operation on their buffers (output, input); the output is written back.
  c10::intrusive_ptr<c10d::Work> out_of_place(
      c10d::OpType type, const char* op, at::Tensor& output, at::Tensor& input,
      const std::function<ddp::WorkPtr(ddp::ProcessGroup&, Buffer, Buffer)>& issue);
  // allreduce and allreduce_coalesced: `tensors` reduced through one flat buffer.
  c10::intrusive_ptr<c10d::Work> allreduce_flat(c10d::OpType type, const char* op,
                                                std::vector<at::Tensor>& tensors,
                                                const c10d::ReduceOp& reduce_op);

  const std::string name_;
  const std::chrono::milliseconds timeout_;
  const int generation_;  // the round it was made in (ddp::in_place::RoundNow)
  const std::shared_ptr<ddp::Store> store_;
  const std::shared_ptr<FutureCompleter> completer_;
  std::shared_ptr<ddp::ProcessGroup> cpu_group_;
  std::mutex cuda_mutex_;
  std::shared_ptr<ddp::ProcessGroup> cuda_group_;  // under cuda_mutex_
};

}  // namespace ddp::torch_backend
