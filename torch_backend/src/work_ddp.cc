#include "work_ddp.h"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace ddp::torch_backend {
namespace {

// The CUDA devices of `tensors`: a future whose value holds CUDA tensors must
// name their devices (it records events on their streams when completed).
std::vector<c10::Device> cuda_devices_of(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Device> devices;
  for (const auto& tensor : tensors) {
    if (tensor.is_cuda() &&
        std::find(devices.begin(), devices.end(), tensor.device()) == devices.end()) {
      devices.push_back(tensor.device());
    }
  }
  return devices;
}

}  // namespace

c10::intrusive_ptr<WorkDdp> WorkDdp::follow(int rank, c10d::OpType type, std::string op,
                                            ddp::WorkPtr work, std::function<void()> finish,
                                            std::vector<at::Tensor> outputs,
                                            const std::shared_ptr<FutureCompleter>& completer) {
  auto result = c10::make_intrusive<WorkDdp>(rank, type, std::move(op), work, std::move(finish),
                                             std::move(outputs));
  auto complete_future = [result] {
    if (auto error = result->settle()) {
      result->future_->setErrorIfNeeded(error);
    } else {
      result->future_->markCompleted(c10::IValue(result->outputs_));
    }
  };
  const bool notifies =
      work->on_completion([complete_future, completer] { completer->post(complete_future); });
  TORCH_INTERNAL_ASSERT(notifies, "ddp backend: ", result->op_, "'s Work cannot notify");
  return result;
}

WorkDdp::WorkDdp(int rank, c10d::OpType type, std::string op, ddp::WorkPtr work,
                 std::function<void()> finish, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type), op_(std::move(op)), work_(std::move(work)),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), cuda_devices_of(outputs_))),
      finish_(std::move(finish)) {}

std::exception_ptr WorkDdp::settle() {
  if (auto error = work_->exception()) return error;
  std::lock_guard lock(settle_mutex_);
  if (finish_) {
    auto finish = std::move(finish_);
    finish_ = nullptr;
    try {
      finish();
    } catch (...) {
      finish_error_ = std::current_exception();
    }
  }
  return finish_error_;
}

bool WorkDdp::isCompleted() {
  if (!work_->is_completed()) return false;
  settle();  // the outputs are in place once this says so
  return true;
}

bool WorkDdp::isSuccess() const { return work_->is_completed() && work_->exception() == nullptr; }

std::exception_ptr WorkDdp::exception() const { return work_->exception(); }

int WorkDdp::sourceRank() const { return work_->source_rank(); }

std::vector<at::Tensor> WorkDdp::result() { return outputs_; }

bool WorkDdp::wait(std::chrono::milliseconds timeout) {
  if (!work_->wait(timeout)) {
    TORCH_CHECK(false, "ddp backend: ", op_, " #", work_->sequence_number(),
                " did not complete within ", timeout.count(), " ms");
  }
  if (auto error = settle()) std::rethrow_exception(error);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkDdp::getFuture() { return future_; }

}  // namespace ddp::torch_backend
