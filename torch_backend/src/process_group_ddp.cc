#include "process_group_ddp.h"

#include <Python.h>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstdlib>
#include <numeric>

#include "ddp/store/prefix_store.h"
#include "ddp/worker/process_group_gloo.h"
#include "ddp/worker/process_group_nccl.h"
#include "ddp/worker/recovery.h"
#include "ddp/worker_contract/env_names.h"
#include "tensors.h"
#include "torch_store.h"
#include "work_ddp.h"

namespace ddp::torch_backend {
namespace {

namespace names = ddp::env_names;

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

bool is_loopback(const std::string& host) {
  return host.empty() || host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// The ddp group's name: torch names its groups "0" (the default group), "1", ...
std::string group_name_of(const c10::intrusive_ptr<c10d::Store>& store) {
  const std::string torch_name = torch_group_name(store);
  return torch_name.empty() || torch_name == "0" ? "default" : torch_name;
}

// Gloo's options as ddp::init_process_group sets them from the environment.
GlooOptions gloo_options(const std::string& name, std::chrono::milliseconds timeout) {
  GlooOptions options;
  options.name = name;
  options.timeout = timeout;
  options.debug_detail = env_or_empty(names::kTorchCheck) != "0";
  options.on_failure = in_place::failure_explainer();  // empty unless recovering in place
  if (auto iface = env_or_empty(names::kGlooSocketIfname); !iface.empty()) {
    options.iface = iface;
  } else if (auto host = env_or_empty(names::kGlooHostname); !host.empty()) {
    options.hostname = host;
  } else {
    auto store_host = env_or_empty(names::kStoreAddr);
    if (store_host.empty()) store_host = env_or_empty(names::kMasterAddr);
    if (is_loopback(store_host)) options.hostname = "127.0.0.1";  // one node: stay on loopback
  }
  return options;
}

ReduceOp ddp_reduce_op(const c10d::ReduceOp& op, const char* what) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ReduceOp::kSum;
    case c10d::ReduceOp::AVG:
      return ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT:
      return ReduceOp::kProduct;
    case c10d::ReduceOp::MIN:
      return ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return ReduceOp::kMax;
    case c10d::ReduceOp::BAND:
      return ReduceOp::kBand;
    case c10d::ReduceOp::BOR:
      return ReduceOp::kBor;
    case c10d::ReduceOp::BXOR:
      return ReduceOp::kBxor;
    default:
      TORCH_CHECK(false, "ddp backend: ", what, " does not support reduce op ",
                  static_cast<int>(op.op_), " (PREMUL_SUM is NCCL's)");
  }
}

const at::Tensor& only_tensor(const std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "ddp backend: ", op, " takes one tensor per rank, got ",
              tensors.size());
  return tensors[0];
}

// One flat contiguous tensor of `tensors` (same dtype and device, checked by the caller).
at::Tensor flat_copy(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& tensor : tensors) flat.push_back(tensor.reshape({-1}));
  return at::cat(flat);
}

// Copies consecutive slices of `flat` into `tensors`.
void unflatten_into(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  std::int64_t offset = 0;
  for (const auto& tensor : tensors) {
    const auto n = tensor.numel();
    tensor.copy_(flat.narrow(0, offset, n).view(tensor.sizes()));
    offset += n;
  }
}

at::Tensor flat_empty(std::int64_t count, const at::Tensor& like) {
  return at::empty({count}, like.options());
}

// CUDA: ddp's NCCL group runs on its own stream, so the work torch queued on
// the tensor's current stream must have finished first.
void sync_current_stream(const at::Tensor& tensor) {
  if (!tensor.is_cuda()) return;
  c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
  guard.getStream(tensor.device()).synchronize();
}

// all_to_all_single's splits (rows of dim 0 per rank) as element counts per
// rank; empty splits: empty counts (even), once dim 0 divides by `size`.
std::vector<std::size_t> split_counts(const std::vector<int64_t>& splits, const at::Tensor& tensor,
                                      int size, const char* which) {
  const char* op = "alltoall_base";
  std::vector<std::size_t> counts;
  if (splits.empty()) {
    TORCH_CHECK(tensor.dim() == 0 || tensor.size(0) % size == 0, "ddp backend: ", op, ": the ",
                which, "'s dim 0 (", tensor.dim() == 0 ? 0 : tensor.size(0),
                ") does not divide equally across the group's ", size, " ranks");
    return counts;
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == size, "ddp backend: ", op, ": ", splits.size(),
              " ", which, " splits for ", size, " ranks");
  const std::int64_t rows = tensor.dim() == 0 ? 1 : tensor.size(0);
  const std::int64_t row_elements = rows == 0 ? 0 : tensor.numel() / rows;
  TORCH_CHECK(std::accumulate(splits.begin(), splits.end(), std::int64_t{0}) == rows,
              "ddp backend: ", op, ": the ", which, " splits do not add up to its dim 0 (", rows,
              ")");
  for (auto split : splits) {
    TORCH_CHECK(split >= 0, "ddp backend: ", op, ": negative ", which, " split ", split);
    counts.push_back(static_cast<std::size_t>(split * row_elements));
  }
  return counts;
}

void check_root(int root, int size, const char* op) {
  TORCH_CHECK(root >= 0 && root < size, "ddp backend: ", op, ": root rank ", root,
              " is not in [0, ", size, ")");
}

}  // namespace

ProcessGroupDdp::ProcessGroupDdp(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), name_(group_name_of(store)), timeout_(timeout),
      generation_(in_place::current_round().generation),
      store_(in_place::round_store(std::make_shared<TorchStore>(store, timeout))),
      completer_(FutureCompleter::start()) {
  cpu_group_ = make_gloo_process_group(std::make_shared<PrefixStore>("ddp/gloo", store_), rank,
                                       size, gloo_options(name_, timeout));
  in_place::track(cpu_group_);
  init();  // torch's usage logging, as its own backends do
}

ProcessGroupDdp::~ProcessGroupDdp() {
  // The last reference may be dropped from Python, with the GIL held, while a
  // completion still needs it (a future's Python callback; a tensor whose
  // Python object is freed with the task that held it): waiting for the
  // completer with the GIL would deadlock. So the wait lets the GIL go.
  PyThreadState* python = Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
  // The groups fail what is still queued; the completer then runs those
  // completions before it ends.
  cpu_group_.reset();
  {
    std::lock_guard lock(cuda_mutex_);
    cuda_group_.reset();
  }
  completer_->stop();
  if (python != nullptr) PyEval_RestoreThread(python);
}

void ProcessGroupDdp::check_current_round(const char* op) const {
  if (!in_place::is_open()) return;
  const in_place::RoundNow now = in_place::current_round();
  if (now.generation == generation_) return;
  const int number = in_place::round_number(generation_);
  TORCH_CHECK(false, "ddp backend: ", op, " on group '", name_, "', which belonged to ",
              number < 0 ? std::string("the round this worker started in")
                         : "round " + std::to_string(number),
              ": that round ended and this worker re-formed into round ", now.number,
              " (ddp_torch.reform()); make the group again (new_group, DistributedDataParallel) "
              "after reform()");
}

ddp::ProcessGroup& ProcessGroupDdp::group_for(const at::Tensor& tensor, const char* op) {
  check_current_round(op);
  const Device device = ddp_device(tensor, op);
  if (!device.is_cuda()) return *cpu_group_;
  TORCH_CHECK(nccl_available(), "ddp backend: ", op,
              " got a CUDA tensor, but this ddp_torch was built without NCCL "
              "(use CPU tensors, or build ddprun with DDP_WITH_NCCL)");
  std::lock_guard lock(cuda_mutex_);
  if (!cuda_group_) {
    NcclOptions options;
    options.device = device.index;
    options.timeout = timeout_;
    options.name = name_ + "/cuda";
    cuda_group_ = make_nccl_process_group(std::make_shared<PrefixStore>("ddp/nccl", store_),
                                          getRank(), getSize(), options);
    in_place::track(cuda_group_);
  }
  return *cuda_group_;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::follow(c10d::OpType type, const char* op,
                                                       ddp::WorkPtr work,
                                                       std::function<void()> finish,
                                                       std::vector<at::Tensor> outputs) {
  return WorkDdp::follow(getRank(), type, op, std::move(work), std::move(finish),
                         std::move(outputs), completer_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::in_place(
    c10d::OpType type, const char* op, std::vector<at::Tensor>& tensors,
    const std::function<ddp::WorkPtr(ddp::ProcessGroup&, Buffer)>& issue) {
  StagedTensor staged(only_tensor(tensors, op), op);
  auto& group = group_for(staged.tensor(), op);
  sync_current_stream(staged.tensor());
  auto work = issue(group, staged.buffer());
  return follow(
      type, op, std::move(work), [staged] { staged.write_back(); }, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::out_of_place(
    c10d::OpType type, const char* op, at::Tensor& output, at::Tensor& input,
    const std::function<ddp::WorkPtr(ddp::ProcessGroup&, Buffer, Buffer)>& issue) {
  StagedTensor in(input, op);
  StagedTensor out(output, op);
  check_same_dtype_and_device({output}, input, op);
  auto& group = group_for(input, op);
  sync_current_stream(input);
  auto work = issue(group, out.buffer(), in.buffer());
  return follow(type, op, std::move(work), [in, out] { out.write_back(); }, {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(opts.rootTensor == 0, "ddp backend: broadcast takes one tensor, rootTensor 0");
  check_root(root, getSize(), "broadcast");
  return in_place(
      c10d::OpType::BROADCAST, "broadcast", tensors,
      [&](ddp::ProcessGroup& group, Buffer buffer) { return group.broadcast(buffer, root); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  if (tensors.size() != 1) {
    return allreduce_flat(c10d::OpType::ALLREDUCE, "allreduce", tensors, opts.reduceOp);
  }
  const ReduceOp reduce_op = ddp_reduce_op(opts.reduceOp, "allreduce");
  return in_place(
      c10d::OpType::ALLREDUCE, "allreduce", tensors,
      [&](ddp::ProcessGroup& group, Buffer buffer) { return group.allreduce(buffer, reduce_op); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return allreduce_flat(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors,
                        opts.reduceOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::allreduce_flat(c10d::OpType type, const char* op,
                                                               std::vector<at::Tensor>& tensors,
                                                               const c10d::ReduceOp& reduce_op) {
  TORCH_CHECK(!tensors.empty(), "ddp backend: ", op, " got no tensors");
  check_same_dtype_and_device(tensors, tensors[0], op);
  StagedTensor flat(flat_copy(tensors), op);
  auto& group = group_for(flat.tensor(), op);
  sync_current_stream(flat.tensor());
  auto work = group.allreduce(flat.buffer(), ddp_reduce_op(reduce_op, op));
  return follow(
      type, op, std::move(work), [flat, tensors] { unflatten_into(flat.contiguous(), tensors); },
      tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(opts.rootTensor == 0, "ddp backend: reduce takes one tensor, rootTensor 0");
  check_root(root, getSize(), "reduce");
  const ReduceOp reduce_op = ddp_reduce_op(opts.reduceOp, "reduce");
  return in_place(c10d::OpType::REDUCE, "reduce", tensors,
                  [&](ddp::ProcessGroup& group, Buffer buffer) {
                    return group.reduce(buffer, root, reduce_op);
                  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  const char* op = "allgather";
  StagedTensor input(only_tensor(inputs, op), op);
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
              "ddp backend: allgather needs one list of ", getSize(), " output tensors");
  check_same_shape(outputs[0], input.tensor(), op);
  StagedTensor flat(flat_empty(input.tensor().numel() * getSize(), input.tensor()), op);
  auto& group = group_for(input.tensor(), op);
  sync_current_stream(input.tensor());
  auto work = group.allgather(flat.buffer(), input.buffer());
  auto targets = outputs[0];
  return follow(
      c10d::OpType::ALLGATHER, op, std::move(work),
      [input, flat, targets] { unflatten_into(flat.contiguous(), targets); }, targets);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  const char* op = "allgather_coalesced";
  TORCH_CHECK(!inputs.empty(), "ddp backend: ", op, " got no tensors");
  check_same_dtype_and_device(inputs, inputs[0], op);
  TORCH_CHECK(static_cast<int>(outputs.size()) == getSize(), "ddp backend: ", op, " needs ",
              getSize(), " output lists, one per rank");
  // One allgather of every input flattened: rank r's share lands at r * n,
  // in the order of the inputs, which is the order of its output list.
  std::vector<at::Tensor> targets;
  for (auto& list : outputs) {
    TORCH_CHECK(list.size() == inputs.size(), "ddp backend: ", op, ": an output list has ",
                list.size(), " tensors for ", inputs.size(), " inputs");
    for (std::size_t i = 0; i < list.size(); ++i) {
      TORCH_CHECK(list[i].numel() == inputs[i].numel(), "ddp backend: ", op, ": output ", i,
                  " has ", list[i].numel(), " elements, its input ", inputs[i].numel());
      targets.push_back(list[i]);
    }
  }
  check_same_dtype_and_device(targets, inputs[0], op);
  StagedTensor input(flat_copy(inputs), op);
  StagedTensor flat(flat_empty(input.tensor().numel() * getSize(), input.tensor()), op);
  auto& group = group_for(input.tensor(), op);
  sync_current_stream(input.tensor());
  auto work = group.allgather(flat.buffer(), input.buffer());
  return follow(
      c10d::OpType::ALLGATHER_COALESCED, op, std::move(work),
      [input, flat, targets] { unflatten_into(flat.contiguous(), targets); }, targets);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& /*opts*/) {
  const char* op = "_allgather_base";
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "ddp backend: ", op, ": the output has ",
              output.numel(), " elements, expected ", getSize(), " x ", input.numel());
  return out_of_place(
      c10d::OpType::_ALLGATHER_BASE, op, output, input,
      [](ddp::ProcessGroup& group, Buffer out, Buffer in) { return group.allgather(out, in); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const char* op = "gather";
  const int root = static_cast<int>(opts.rootRank);
  check_root(root, getSize(), op);
  StagedTensor input(only_tensor(inputs, op), op);
  std::vector<at::Tensor> targets;
  if (getRank() == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                "ddp backend: gather needs one list of ", getSize(), " output tensors on root");
    check_same_shape(outputs[0], input.tensor(), op);
    targets = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty(), "ddp backend: gather takes no output tensors on non-root ranks");
  }
  const std::int64_t count = targets.empty() ? 0 : input.tensor().numel() * getSize();
  StagedTensor flat(flat_empty(count, input.tensor()), op);
  auto& group = group_for(input.tensor(), op);
  sync_current_stream(input.tensor());
  auto work = group.gather(flat.buffer(), input.buffer(), root);
  return follow(
      c10d::OpType::GATHER, op, std::move(work),
      [input, flat, targets] { unflatten_into(flat.contiguous(), targets); }, targets);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const char* op = "scatter";
  const int root = static_cast<int>(opts.rootRank);
  check_root(root, getSize(), op);
  StagedTensor output(only_tensor(outputs, op), op);
  at::Tensor flat_input = flat_empty(0, output.tensor());
  if (getRank() == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "ddp backend: scatter needs one list of ", getSize(), " input tensors on root");
    check_same_shape(inputs[0], output.tensor(), op);
    flat_input = flat_copy(inputs[0]);
  } else {
    TORCH_CHECK(inputs.empty(), "ddp backend: scatter takes no input tensors on non-root ranks");
  }
  StagedTensor flat(flat_input, op);
  auto& group = group_for(output.tensor(), op);
  sync_current_stream(output.tensor());
  auto work = group.scatter(output.buffer(), flat.buffer(), root);
  return follow(
      c10d::OpType::SCATTER, op, std::move(work), [output, flat] { output.write_back(); }, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  StagedTensor output(only_tensor(outputs, op), op);
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "ddp backend: reduce_scatter needs one list of ", getSize(), " input tensors");
  check_same_shape(inputs[0], output.tensor(), op);
  StagedTensor flat(flat_copy(inputs[0]), op);
  auto& group = group_for(output.tensor(), op);
  sync_current_stream(output.tensor());
  auto work =
      group.reduce_scatter(output.buffer(), flat.buffer(), ddp_reduce_op(opts.reduceOp, op));
  return follow(
      c10d::OpType::REDUCE_SCATTER, op, std::move(work), [output, flat] { output.write_back(); },
      outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const char* op = "_reduce_scatter_base";
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "ddp backend: ", op, ": the input has ",
              input.numel(), " elements, expected ", getSize(), " x ", output.numel());
  const ReduceOp reduce_op = ddp_reduce_op(opts.reduceOp, op);
  return out_of_place(c10d::OpType::_REDUCE_SCATTER_BASE, op, output, input,
                      [&](ddp::ProcessGroup& group, Buffer out, Buffer in) {
                        return group.reduce_scatter(out, in, reduce_op);
                      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& /*opts*/) {
  const char* op = "alltoall_base";
  check_same_dtype_and_device({output}, input, op);
  auto output_counts = split_counts(output_splits, output, getSize(), "output");
  auto input_counts = split_counts(input_splits, input, getSize(), "input");
  return out_of_place(c10d::OpType::ALLTOALL_BASE, op, output, input,
                      [&](ddp::ProcessGroup& group, Buffer out, Buffer in) {
                        return group.alltoall(out, in, std::move(output_counts),
                                              std::move(input_counts));
                      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& /*opts*/) {
  const char* op = "alltoall";
  TORCH_CHECK(
      static_cast<int>(outputs.size()) == getSize() && static_cast<int>(inputs.size()) == getSize(),
      "ddp backend: alltoall needs ", getSize(), " input and ", getSize(), " output tensors, got ",
      inputs.size(), " and ", outputs.size());
  check_same_dtype_and_device(inputs, inputs[0], op);
  check_same_dtype_and_device(outputs, inputs[0], op);
  std::vector<std::size_t> input_counts;
  std::vector<std::size_t> output_counts;
  std::int64_t output_total = 0;
  for (int r = 0; r < getSize(); ++r) {
    input_counts.push_back(static_cast<std::size_t>(inputs[r].numel()));
    output_counts.push_back(static_cast<std::size_t>(outputs[r].numel()));
    output_total += outputs[r].numel();
  }
  StagedTensor in(flat_copy(inputs), op);
  StagedTensor out(flat_empty(output_total, inputs[0]), op);
  auto& group = group_for(inputs[0], op);
  sync_current_stream(inputs[0]);
  auto work =
      group.alltoall(out.buffer(), in.buffer(), std::move(output_counts), std::move(input_counts));
  auto targets = outputs;
  return follow(
      c10d::OpType::ALLTOALL, op, std::move(work),
      [in, out, targets] { unflatten_into(out.contiguous(), targets); }, targets);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int tag) {
  check_root(dst, getSize(), "send");
  return in_place(
      c10d::OpType::SEND, "send", tensors,
      [&](ddp::ProcessGroup& group, Buffer buffer) { return group.send(buffer, dst, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag) {
  check_root(src, getSize(), "recv");
  return in_place(
      c10d::OpType::RECV, "recv", tensors,
      [&](ddp::ProcessGroup& group, Buffer buffer) { return group.recv(buffer, src, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  return in_place(
      c10d::OpType::RECVANYSOURCE, "recv from any source", tensors,
      [&](ddp::ProcessGroup& group, Buffer buffer) { return group.recv_any(buffer, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDdp::barrier(const c10d::BarrierOptions& /*opts*/) {
  check_current_round("barrier");
  auto work = cpu_group_->barrier();
  return follow(c10d::OpType::BARRIER, "barrier", std::move(work), {}, {});
}

}  // namespace ddp::torch_backend
