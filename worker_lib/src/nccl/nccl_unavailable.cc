// The NCCL entry points when the library is built without NCCL (DDP_WITH_NCCL off).
#ifndef DDP_WITH_NCCL

#include "ddp/common/error.h"
#include "ddp/worker/process_group_nccl.h"

namespace ddp {

bool nccl_available() { return false; }

std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<Store>, int, int,
                                                      NcclOptions) {
  throw BackendError("make_nccl_process_group",
                     "ddp was built without NCCL (configure with CUDA and NCCL under "
                     "/usr/local/cuda, DDP_WITH_NCCL=ON)");
}

}  // namespace ddp

#endif
