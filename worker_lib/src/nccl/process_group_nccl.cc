#include "nccl/process_group_nccl.h"

#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ddp/common/error.h"
#include "ddp/store/store.h"

namespace ddp {

bool nccl_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<Store> store, int rank,
                                                      int size, NcclOptions options) {
  return std::make_shared<detail::ProcessGroupNccl>(std::move(store), rank, size,
                                                    std::move(options));
}

namespace detail {

namespace {

void check_cuda(cudaError_t status, const std::string& origin, const char* call) {
  if (status != cudaSuccess) {
    throw BackendError(origin, fmt::format("{} failed: {} ({})", call, cudaGetErrorString(status),
                                           static_cast<int>(status)));
  }
}

void check_nccl(ncclResult_t status, const std::string& origin, const char* call) {
  if (status != ncclSuccess && status != ncclInProgress) {
    throw BackendError(origin, fmt::format("{} failed: {} ({})", call, ncclGetErrorString(status),
                                           static_cast<int>(status)));
  }
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kUInt8:
      return ncclUint8;
    case DType::kInt8:
      return ncclInt8;
    case DType::kBool:
      return ncclUint8;
  }
  throw InvalidArgument("ProcessGroupNccl",
                        fmt::format("unknown dtype {}", static_cast<int>(dtype)));
}

// `op` on every other rank than `rank`, in one NCCL group (ncclGroupStart/End).
ncclResult_t with_every_peer(int rank, int size, const std::function<ncclResult_t(int)>& op) {
  if (auto started = ncclGroupStart(); started != ncclSuccess) return started;
  ncclResult_t status = ncclSuccess;
  for (int peer = 0; peer < size && status == ncclSuccess; ++peer) {
    if (peer != rank) status = op(peer);
  }
  const auto ended = ncclGroupEnd();
  return status != ncclSuccess ? status : ended;
}

// torch's semantics for bool: sum is logical or (max on 0/1), product logical
// and (min); no average.
ncclRedOp_t nccl_op(ReduceOp op, DType dtype) {
  if (dtype == DType::kBool) {
    if (op == ReduceOp::kSum) return ncclMax;
    if (op == ReduceOp::kProduct) return ncclMin;
    if (op == ReduceOp::kAvg) {
      throw InvalidArgument("ProcessGroupNccl", "reduce op avg is not defined for bool");
    }
  }
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kProduct:
      return ncclProd;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      throw InvalidArgument("ProcessGroupNccl",
                            fmt::format("reduce op {} is not supported by NCCL", to_string(op)));
  }
  throw InvalidArgument("ProcessGroupNccl",
                        fmt::format("unknown reduce op {}", static_cast<int>(op)));
}

}  // namespace

// A Work whose completion is a CUDA event: wait() polls the event itself (so it
// does not depend on the watchdog's interval) and the watchdog polls it too.
// Once the group is aborted it fails with GroupChanged instead of trusting its
// event (the event of an aborted kernel fires too).
class NcclWork final : public WorkImpl {
 public:
  NcclWork(std::uint64_t seq, std::string op, std::chrono::milliseconds timeout, cudaEvent_t event,
           std::shared_ptr<const GroupAbort> abort)
      : WorkImpl(seq, std::move(op), timeout), event_(event), abort_(std::move(abort)) {}
  ~NcclWork() override { cudaEventDestroy(event_); }

  // true once the event fired; throws GroupChanged once the group was aborted
  // and BackendError when CUDA reports a failure.
  bool query() {
    if (abort_->is_set()) std::rethrow_exception(abort_->error(op(), sequence_number()));
    return event_fired();
  }

  // The event alone (ProcessGroupNccl::abort asks it before aborting).
  bool event_fired() {
    auto status = cudaEventQuery(event_);
    if (status == cudaSuccess) return true;
    if (status == cudaErrorNotReady) return false;
    throw BackendError("ProcessGroupNccl",
                       fmt::format("cudaEventQuery: {}", cudaGetErrorString(status)));
  }

  bool wait(std::chrono::milliseconds timeout) override {
    auto limit = std::chrono::steady_clock::now() + (timeout.count() > 0 ? timeout : wait_limit());
    while (!is_completed()) {
      try {
        if (query()) break;  // the watchdog completes it too; either is fine
      } catch (...) {
        fail(std::current_exception());
        break;
      }
      if (std::chrono::steady_clock::now() >= limit) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (!is_completed()) complete();
    return WorkImpl::wait(std::chrono::milliseconds(1));
  }

 private:
  std::chrono::milliseconds wait_limit() const { return std::chrono::hours(24); }
  cudaEvent_t event_;
  std::shared_ptr<const GroupAbort> abort_;
};

ProcessGroupNccl::ProcessGroupNccl(std::shared_ptr<Store> store, int rank, int size,
                                   NcclOptions options)
    : ProcessGroupBase("ProcessGroupNccl", std::move(store), rank, size, std::move(options)) {
  const std::string origin = "ProcessGroupNccl";
  int devices = 0;
  check_cuda(cudaGetDeviceCount(&devices), origin, "cudaGetDeviceCount");
  if (options_.device < 0 || options_.device >= devices) {
    throw InvalidArgument(origin, fmt::format("CUDA device {} does not exist ({} devices)",
                                              options_.device, devices));
  }
  check_cuda(cudaSetDevice(options_.device), origin, "cudaSetDevice");
  auto id_bytes = exchange_unique_id(
      *store_, rank,
      [&] {
        ncclUniqueId id;
        check_nccl(ncclGetUniqueId(&id), origin, "ncclGetUniqueId");
        return std::string(id.internal, sizeof(id.internal));
      },
      options_.timeout);
  ncclUniqueId id;
  if (id_bytes.size() != sizeof(id.internal)) {
    throw ProtocolError(origin, fmt::format("NCCL unique id has {} bytes, expected {}",
                                            id_bytes.size(), sizeof(id.internal)));
  }
  std::memcpy(id.internal, id_bytes.data(), sizeof(id.internal));
  check_nccl(ncclCommInitRank(&comm_, size, id, rank), origin, "ncclCommInitRank");
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), origin,
             "cudaStreamCreate");
  check_cuda(cudaMalloc(&barrier_scratch_, sizeof(float)), origin, "cudaMalloc");
  start_tracking();
  WorkTracker::Hooks hooks;
  hooks.async_error = [this]() -> std::optional<std::string> {
    std::lock_guard lock(comm_mutex_);  // not mutex_: see the lock order in the header
    if (!comm_) return std::nullopt;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess) return std::nullopt;
    if (async == ncclSuccess || async == ncclInProgress) return std::nullopt;
    return fmt::format("{} ({})", ncclGetErrorString(async), static_cast<int>(async));
  };
  hooks.abort = [this] { abort_comm(); };
  // Completion as the work's CUDA event tells it, seen by the watchdog.
  hooks.completed = [this](std::uint64_t seq) { progress_.completed(seq); };
  tracker_ = std::make_unique<WorkTracker>(
      fmt::format("ProcessGroupNccl[{}] rank {}/{}", options_.name, rank, size), options_.timeout,
      arrivals_, std::move(hooks));
  tracker_->start_watchdog(options_.watchdog_interval);
}

ProcessGroupNccl::~ProcessGroupNccl() {
  bool pending = tracker_ && tracker_->outstanding() > 0;
  tracker_.reset();  // stops the watchdog
  {
    std::lock_guard lock(comm_mutex_);
    if (comm_) {
      if (pending) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
      comm_ = nullptr;
    }
  }
  if (barrier_scratch_) cudaFree(barrier_scratch_);
  if (stream_) cudaStreamDestroy(stream_);
}

void ProcessGroupNccl::abort_comm() {
  std::lock_guard lock(comm_mutex_);
  if (comm_) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

void ProcessGroupNccl::abort(const std::string& reason) {
  std::vector<std::shared_ptr<NcclWork>> pending;
  {
    std::lock_guard lock(mutex_);  // no operation is being issued meanwhile
    if (abort_->is_set()) return;
    // Works whose kernels finished before the abort complete as they did; the
    // others fail (after ncclCommAbort an aborted kernel's event fires too).
    for (auto& weak : issued_) {
      auto work = weak.lock();
      if (!work || work->is_completed()) continue;
      bool fired = false;
      try {
        fired = work->event_fired();
      } catch (const std::exception&) {
      }
      if (fired) {
        work->complete();
      } else {
        pending.push_back(std::move(work));
      }
    }
    issued_.clear();
    abort_->set(reason);
    // Safe while kernels are pending: NCCL stops them and frees the
    // communicator, which must not be used or destroyed again.
    abort_comm();
  }
  // Asked for (the round ended, or the program aborted the group): info.
  spdlog::info("ProcessGroupNccl '{}': rank {}/{} aborted: {}", options_.name, rank(), size(),
               reason);
  for (auto& work : pending) {
    work->fail(abort_->error(work->op(), work->sequence_number()));
  }
}

void ProcessGroupNccl::check_device(const Buffer& buffer, const char* what) const {
  if (!buffer.device.is_cuda() || buffer.device.index != options_.device) {
    throw InvalidArgument(fmt::format("ProcessGroupNccl::{}", what),
                          fmt::format("buffer is on {}; this group runs on cuda:{}",
                                      buffer.device.str(), options_.device));
  }
}

WorkPtr ProcessGroupNccl::enqueue(const char* op, progress::Kind kind, std::uint64_t bytes,
                                  const std::function<ncclResult_t()>& launch) {
  const bool collective = kind != progress::Kind::kNone;
  const std::string origin = fmt::format("ProcessGroupNccl::{}", op);
  const auto wait_bound = options_.timeout + std::chrono::seconds(10);
  std::lock_guard lock(mutex_);
  if (abort_->is_set()) return failed_work(collective ? next_seq_++ : next_p2p_seq_++, op);
  tracker_->throw_if_broken();
  std::uint64_t seq = 0;
  cudaEvent_t event;
  {
    std::lock_guard comm_lock(comm_mutex_);
    if (!comm_) throw BackendError(origin, "the communicator was aborted");
    check_cuda(cudaSetDevice(options_.device), origin, "cudaSetDevice");
    seq = collective ? next_seq_++ : next_p2p_seq_++;
    if (collective) {
      arrivals_->entered(seq);
      progress_.issued(seq, kind, bytes);
    }
    check_nccl(launch(), origin, op);
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), origin, "cudaEventCreate");
    auto status = cudaEventRecord(event, stream_);
    if (status != cudaSuccess) cudaEventDestroy(event);
    check_cuda(status, origin, "cudaEventRecord");
  }
  auto work = std::make_shared<NcclWork>(seq, op, wait_bound, event, abort_);
  std::optional<std::uint64_t> collective_seq;
  if (collective) collective_seq = seq;
  tracker_->add(work, collective_seq, [work] { return work->query(); });
  std::erase_if(issued_, [](const std::weak_ptr<NcclWork>& weak) {
    auto issued = weak.lock();
    return !issued || issued->is_completed();
  });
  issued_.push_back(work);
  return work;
}

WorkPtr ProcessGroupNccl::allreduce(Buffer buffer, ReduceOp op) {
  check_device(buffer, "allreduce");
  auto type = nccl_type(buffer.dtype);
  auto red = nccl_op(op, buffer.dtype);
  return enqueue("allreduce", progress::Kind::kAllreduce, buffer.nbytes(), [&] {
    return ncclAllReduce(buffer.data, buffer.data, buffer.count, type, red, comm_, stream_);
  });
}

WorkPtr ProcessGroupNccl::broadcast(Buffer buffer, int root) {
  check_device(buffer, "broadcast");
  check_root("ProcessGroupNccl::broadcast", root, size());
  auto type = nccl_type(buffer.dtype);
  return enqueue("broadcast", progress::Kind::kBroadcast, buffer.nbytes(), [&] {
    return ncclBroadcast(buffer.data, buffer.data, buffer.count, type, root, comm_, stream_);
  });
}

WorkPtr ProcessGroupNccl::allgather(Buffer output, Buffer input) {
  check_device(output, "allgather");
  check_device(input, "allgather");
  if (output.dtype != input.dtype ||
      output.count != input.count * static_cast<std::size_t>(size())) {
    throw InvalidArgument(
        "ProcessGroupNccl::allgather",
        fmt::format("output ({} x {}) must be input ({} x {}) times size {}", output.count,
                    to_string(output.dtype), input.count, to_string(input.dtype), size()));
  }
  auto type = nccl_type(input.dtype);
  return enqueue("allgather", progress::Kind::kAllgather, input.nbytes(), [&] {
    return ncclAllGather(input.data, output.data, input.count, type, comm_, stream_);
  });
}

WorkPtr ProcessGroupNccl::reduce_scatter(Buffer output, Buffer input, ReduceOp op) {
  check_device(output, "reduce_scatter");
  check_device(input, "reduce_scatter");
  if (output.dtype != input.dtype ||
      input.count != output.count * static_cast<std::size_t>(size())) {
    throw InvalidArgument(
        "ProcessGroupNccl::reduce_scatter",
        fmt::format("input ({} x {}) must be output ({} x {}) times size {}", input.count,
                    to_string(input.dtype), output.count, to_string(output.dtype), size()));
  }
  auto type = nccl_type(input.dtype);
  auto red = nccl_op(op, input.dtype);
  return enqueue("reduce_scatter", progress::Kind::kReduceScatter, input.nbytes(), [&] {
    return ncclReduceScatter(input.data, output.data, output.count, type, red, comm_, stream_);
  });
}

WorkPtr ProcessGroupNccl::reduce(Buffer buffer, int root, ReduceOp op) {
  check_device(buffer, "reduce");
  check_root("ProcessGroupNccl::reduce", root, size());
  auto type = nccl_type(buffer.dtype);
  auto red = nccl_op(op, buffer.dtype);
  return enqueue("reduce", progress::Kind::kReduce, buffer.nbytes(), [&] {
    return ncclReduce(buffer.data, buffer.data, buffer.count, type, red, root, comm_, stream_);
  });
}

WorkPtr ProcessGroupNccl::barrier() {
  return enqueue("barrier", progress::Kind::kBarrier, sizeof(float), [&] {
    return ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat32, ncclSum, comm_,
                         stream_);
  });
}

WorkPtr ProcessGroupNccl::send(Buffer buffer, int dst, int /*tag*/) {
  // NCCL has no tags: sends and receives between two ranks match in issue order.
  check_device(buffer, "send");
  if (dst < 0 || dst >= size() || dst == rank()) {
    throw InvalidArgument("ProcessGroupNccl::send",
                          fmt::format("destination {} must be another rank", dst));
  }
  auto type = nccl_type(buffer.dtype);
  return enqueue("send", progress::Kind::kNone, 0,
                 [&] { return ncclSend(buffer.data, buffer.count, type, dst, comm_, stream_); });
}

WorkPtr ProcessGroupNccl::recv(Buffer buffer, int src, int /*tag*/) {
  check_device(buffer, "recv");
  if (src < 0 || src >= size() || src == rank()) {
    throw InvalidArgument("ProcessGroupNccl::recv",
                          fmt::format("source {} must be another rank", src));
  }
  auto type = nccl_type(buffer.dtype);
  return enqueue("recv", progress::Kind::kNone, 0,
                 [&] { return ncclRecv(buffer.data, buffer.count, type, src, comm_, stream_); });
}

WorkPtr ProcessGroupNccl::gather(Buffer output, Buffer input, int root) {
  const char* origin = "ProcessGroupNccl::gather";
  check_root(origin, root, size());
  check_device(input, "gather");
  if (rank() == root) {
    check_device(output, "gather");
    check_chunks(origin, output, input, "output", "input", size());
  }
  auto type = nccl_type(input.dtype);
  const std::size_t chunk_bytes = input.nbytes();
  return enqueue("gather", progress::Kind::kGather, chunk_bytes, [&]() -> ncclResult_t {
    if (input.count == 0) return ncclSuccess;
    if (rank() != root) return ncclSend(input.data, input.count, type, root, comm_, stream_);
    auto* out = static_cast<std::uint8_t*>(output.data);
    if (cudaMemcpyAsync(out + static_cast<std::size_t>(root) * chunk_bytes, input.data, chunk_bytes,
                        cudaMemcpyDeviceToDevice, stream_) != cudaSuccess) {
      return ncclUnhandledCudaError;
    }
    return with_every_peer(rank(), size(), [&](int peer) {
      return ncclRecv(out + static_cast<std::size_t>(peer) * chunk_bytes, input.count, type, peer,
                      comm_, stream_);
    });
  });
}

WorkPtr ProcessGroupNccl::scatter(Buffer output, Buffer input, int root) {
  const char* origin = "ProcessGroupNccl::scatter";
  check_root(origin, root, size());
  check_device(output, "scatter");
  if (rank() == root) {
    check_device(input, "scatter");
    check_chunks(origin, input, output, "input", "output", size());
  }
  auto type = nccl_type(output.dtype);
  const std::size_t chunk_bytes = output.nbytes();
  return enqueue("scatter", progress::Kind::kScatter, chunk_bytes, [&]() -> ncclResult_t {
    if (output.count == 0) return ncclSuccess;
    if (rank() != root) return ncclRecv(output.data, output.count, type, root, comm_, stream_);
    auto* in = static_cast<std::uint8_t*>(input.data);
    if (cudaMemcpyAsync(output.data, in + static_cast<std::size_t>(root) * chunk_bytes, chunk_bytes,
                        cudaMemcpyDeviceToDevice, stream_) != cudaSuccess) {
      return ncclUnhandledCudaError;
    }
    return with_every_peer(rank(), size(), [&](int peer) {
      return ncclSend(in + static_cast<std::size_t>(peer) * chunk_bytes, output.count, type, peer,
                      comm_, stream_);
    });
  });
}

WorkPtr ProcessGroupNccl::alltoall(Buffer output, Buffer input,
                                   std::vector<std::size_t> output_counts,
                                   std::vector<std::size_t> input_counts) {
  const char* origin = "ProcessGroupNccl::alltoall";
  check_device(output, "alltoall");
  check_device(input, "alltoall");
  const auto split =
      split_alltoall(origin, output, input, output_counts, input_counts, rank(), size());
  const auto& sends = split.input;
  const auto& receives = split.output;
  auto type = nccl_type(input.dtype);
  const std::size_t esize = element_size(input.dtype);
  return enqueue("alltoall", progress::Kind::kAlltoall, input.nbytes(), [&]() -> ncclResult_t {
    auto* in = static_cast<std::uint8_t*>(input.data);
    auto* out = static_cast<std::uint8_t*>(output.data);
    std::size_t in_at = 0;
    std::size_t out_at = 0;
    if (auto started = ncclGroupStart(); started != ncclSuccess) return started;
    ncclResult_t status = ncclSuccess;
    for (int peer = 0; peer < size() && status == ncclSuccess; ++peer) {
      const auto p = static_cast<std::size_t>(peer);
      // This rank's own chunk goes through NCCL too: a send/recv pair to itself.
      if (sends[p] > 0) status = ncclSend(in + in_at, sends[p], type, peer, comm_, stream_);
      if (status == ncclSuccess && receives[p] > 0) {
        status = ncclRecv(out + out_at, receives[p], type, peer, comm_, stream_);
      }
      in_at += sends[p] * esize;
      out_at += receives[p] * esize;
    }
    const auto end = ncclGroupEnd();
    return status != ncclSuccess ? status : end;
  });
}

WorkPtr ProcessGroupNccl::recv_any(Buffer, int) {
  throw InvalidArgument("ProcessGroupNccl::recv_any",
                        "recv from any source is not supported by NCCL");
}

}  // namespace detail
}  // namespace ddp
