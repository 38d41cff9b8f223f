// The extension module ddp_torch._C: the creator that torch.distributed calls
// for backend "ddp" (registered by ddp_torch/__init__.py).
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "ddp/worker/step_recorder.h"
#include "process_group_ddp.h"

namespace {

c10::intrusive_ptr<c10d::ProcessGroup> create_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
  return c10::make_intrusive<ddp::torch_backend::ProcessGroupDdp>(store, rank, size, timeout);
}

}  // namespace

PYBIND11_MODULE(_C, module) {
  module.doc() = "The torch.distributed backend 'ddp' over ddprun's worker library";
  // Blocks while the group forms (peers meet through the store): without the GIL.
  module.def("create_process_group", &create_process_group, pybind11::arg("store"),
             pybind11::arg("rank"), pybind11::arg("size"), pybind11::arg("timeout"),
             pybind11::call_guard<pybind11::gil_scoped_release>(),
             "Creates a process group of backend 'ddp' (torch.distributed's creator signature)");
  // ddp_torch/steps.py records torch's DistributedDataParallel steps through it.
  pybind11::class_<ddp::StepRecorder>(module, "StepRecorder",
                                      "DDP step boundaries into the worker's progress page")
      .def(pybind11::init<>())
      .def("gradients_ready", &ddp::StepRecorder::gradients_ready)
      .def("step_end", &ddp::StepRecorder::step_end, pybind11::arg("synchronized"));
  ddp::torch_backend::bind_recovery(module);
  ddp::torch_backend::bind_state(module);
}
