// A torch Work over one ddp::worker operation.
//
// wait() blocks on the ddp Work and rethrows its error (a RuntimeError in
// Python carrying ddp's message: the operation, sequence number, ranks); with
// a timeout that passes first it throws a RuntimeError saying so. The
// operation's `finish` step (copying staged results into the caller's
// tensors) runs once, after the ddp Work succeeded, on whichever thread sees
// that first: wait(), isCompleted() or the group's FutureCompleter, which then completes the
// future (getFuture(): value = the output tensors, or the error) that DDP's
// reducer and comm hooks chain on.
//
// Thread-safe.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/worker/process_group.h"
#include "future_completer.h"

namespace ddp::torch_backend {

class WorkDdp final : public c10d::Work {
 public:
  // Starts following `work`: `finish` (may be empty; must not block) runs once
  // it succeeded; `outputs` become the future's value.
  static c10::intrusive_ptr<WorkDdp> follow(int rank, c10d::OpType type, std::string op,
                                            ddp::WorkPtr work, std::function<void()> finish,
                                            std::vector<at::Tensor> outputs,
                                            const std::shared_ptr<FutureCompleter>& completer);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  WorkDdp(int rank, c10d::OpType type, std::string op, ddp::WorkPtr work,
          std::function<void()> finish, std::vector<at::Tensor> outputs);

 private:
  // Runs finish_ once after success; returns the operation's error, if any.
  std::exception_ptr settle();

  const std::string op_;
  const ddp::WorkPtr work_;
  const std::vector<at::Tensor> outputs_;
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::mutex settle_mutex_;
  std::function<void()> finish_;  // emptied once run (under settle_mutex_)
  std::exception_ptr finish_error_;
};

}  // namespace ddp::torch_backend
