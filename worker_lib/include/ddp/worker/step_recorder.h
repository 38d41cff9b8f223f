// DDP step boundaries for a training loop whose data parallelism is not
// ddp::DistributedDataParallel (ddp.h records its own steps): the torch
// backend records torch's DistributedDataParallel through this. The steps go
// into the worker's progress page (ddp/worker_contract/progress_page.h), where
// ddprun's straggler scores and live view read them.
//
// A step is what lies between two step_end() calls. Its compute time runs from
// the previous step's end to gradients_ready(), so the time spent waiting for
// slower ranks in the gradients' all-reduce is not in it.
//
// One recorder per training loop. Not thread-safe: call it from the thread
// that drives the steps. Never throws, never blocks. Without a progress page
// (no agent, or an agent that does not watch progress) every call is a no-op.
#pragma once

#include <memory>

namespace ddp {

namespace detail {
class StepProgress;
}

class StepRecorder {
 public:
  StepRecorder();
  ~StepRecorder();
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;

  // The backward pass of a synchronized step computed its gradients: the
  // step now only waits for their all-reduce.
  void gradients_ready();
  // The step ended: a synchronized one once its gradients were all-reduced,
  // a no_sync one (synchronized = false: its compute counts towards the next
  // synchronized step) once its backward pass returned.
  void step_end(bool synchronized);

 private:
  std::unique_ptr<detail::StepProgress> progress_;
};

}  // namespace ddp
