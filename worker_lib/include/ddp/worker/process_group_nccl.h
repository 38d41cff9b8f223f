// The NCCL backend: CUDA collectives (built when DDP_WITH_NCCL; see nccl_available()).
//
// make_nccl_process_group(): rank 0 of the group calls ncclGetUniqueId and
// publishes it under "nccl/unique_id" in `store` (the group's own namespace);
// the other ranks block on that key (at most options.timeout). Then every rank
// calls ncclCommInitRank on options.device. Blocks until the communicator exists.
//
// Collectives are enqueued on the group's own CUDA stream in issue order and
// return at once; each Work is backed by a CUDA event recorded after the
// operation (wait() synchronizes on it). Buffers must be on options.device.
// float16 and bfloat16 use NCCL's native types; kAvg uses ncclAvg; on bool, kSum
// is ncclMax (logical or) and kProduct ncclMin (logical and). gather, scatter and
// alltoall are grouped ncclSend/ncclRecv (alltoall does not exchange the counts
// first: peers that disagree on them fail by the watchdog's timeout). kBand,
// kBor, kBxor and recv_any throw InvalidArgument ("... is not supported by NCCL").
//
// A watchdog thread polls outstanding Works: one older than options.timeout,
// or an asynchronous NCCL error (ncclCommGetAsyncError), aborts the
// communicator (ncclCommAbort) and fails every outstanding Work with
// TimeoutError / BackendError naming the operation, its sequence number and
// (for timeouts) the ranks that did not arrive; later operations fail at once.
//
// Abort (ProcessGroup::abort, from any thread): a Work whose CUDA event already
// fired completes; every other outstanding Work, and every later operation
// (returned as a Work that failed already), fails with GroupChanged naming the
// group, its rank and the reason. The communicator is aborted with ncclCommAbort, which stops the
// kernels still pending; the peers' kernels waiting on this rank are left to
// their own abort or to their watchdog's timeout.
#pragma once

#include <chrono>
#include <memory>

#include "ddp/worker/process_group.h"

namespace ddp {

class Store;

struct NcclOptions {
  // CUDA device of this rank (usually LOCAL_RANK).
  int device = 0;
  // Bound of the unique-id exchange and of every collective (enforced by the watchdog).
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  // How often the watchdog polls events and asynchronous errors.
  std::chrono::milliseconds watchdog_interval = std::chrono::milliseconds(100);
  std::string name = "default";
};

// true when the library was built with NCCL and a CUDA device is present.
bool nccl_available();

// Throws BackendError when built without NCCL or when CUDA/NCCL fail,
// InvalidArgument for a null store, a bad rank/size/device or a timeout that is
// not positive (checked before any call to CUDA or NCCL), TimeoutError when rank
// 0's unique id does not appear in time.
std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<Store> store, int rank,
                                                      int size, NcclOptions options = {});

}  // namespace ddp
