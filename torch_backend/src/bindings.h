// The parts of the extension module ddp_torch._C, each bound by its own file:
// module.cc calls them in this order when Python imports the module.
#pragma once

#include <pybind11/pybind11.h>

namespace ddp::torch_backend {

// In-place recovery: the agent's control channel, GroupChanged, the next
// round (recovery_bindings.cc).
void bind_recovery(pybind11::module_& module);
// The replica's state: sync_state's transfer (state_bindings.cc).
void bind_state(pybind11::module_& module);

}  // namespace ddp::torch_backend
