#include "bindings.h"

namespace ddp::torch_backend {

void bind_recovery(pybind11::module_& /*module*/) {}

}  // namespace ddp::torch_backend
