// ddp_torch._C's part for ddp_torch.sync_state (ddp_torch/state.py): the
// transfer of the replica's tensors and counters through ddp::ReplicaState on
// the CPU ddp group of a torch group of backend "ddp".
//
//   _C.sync_replica_state(group, root, root_live, names, tensors, counter_names,
//                         counter_values) -> dict
//     Collective over `group`: every rank calls it with the same root and
//     names, in the same order, shapes and dtypes alike (state.py agrees on
//     them and on the root first). Registers the tensors (CPU or CUDA; a
//     non-contiguous one through a contiguous copy written back on a receiving
//     rank) and the int64 counters, and runs ReplicaState::sync_agreed without
//     the GIL. Returns {root, received, from_live, bytes, seconds, round,
//     counters}: counters the list of values after the sync, in
//     counter_names' order.
//   _C.exchange_layouts(group, payload) -> list of bytes
//     Collective: every rank's payload, by rank (state.py's layouts).
//   _C.replica_state_live() -> bool
//     Whether this process holds live state: its last sync_replica_state
//     succeeded, or failed on a root (ReplicaState::live() after it).
//
// The group checks every collective (the torch backend's DETAIL check, unless
// DDP_TORCH_CHECK=0): one more exchange per all-reduce, so only buffers of at
// least kCheckedInPlaceBytes move in place, the rest staged together.
// Liveness is kept per process, here, across calls: each call registers anew
// (a torch optimizer's state appears lazily), and hands the ReplicaState the
// liveness the previous one ended with (ReplicaState::set_live).
// Errors: a group of another backend, lists of different lengths, a dtype
// the ddp backend lacks: RuntimeError naming it. Whatever sync() throws
// propagates (ddp::GroupChanged as the type recovery_bindings.cc registers).
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bindings.h"
#include "ddp/worker/replica_state.h"
#include "ddp/worker_contract/env_names.h"
#include "process_group_ddp.h"
#include "tensors.h"

namespace ddp::torch_backend {
namespace {

constexpr const char* kOp = "sync_state";
constexpr std::size_t kCheckedInPlaceBytes = std::size_t{16} << 20;
constexpr std::size_t kLayoutRowBytes = 64 * 1024;

// Liveness of this process's replica state (see the top of the file). Written
// without the GIL, so atomic; sync_state calls themselves are serialized by
// being collectives of one training loop.
std::atomic<bool> process_live{false};

ddp::ProcessGroup& cpu_group_of(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  TORCH_CHECK(group, "ddp_torch.sync_state: no process group (call init_process_group first)");
  auto* ddp_group = dynamic_cast<ProcessGroupDdp*>(group.get());
  TORCH_CHECK(ddp_group != nullptr,
              "ddp_torch.sync_state needs a group of backend 'ddp', got one "
              "of backend '",
              group->getBackendName(),
              "' (init_process_group(\"ddp\") or new_group(backend=\"ddp\"))");
  return ddp_group->cpu_group();
}

// One all-gather of `payload`s made of an all-reduce (SUM) of a table with
// a row per rank, each rank filling its own: a row holds a length and `row`
// bytes. Returns each rank's bytes when they all fit, else the largest length
// (every rank sees the same table, so every rank decides alike).
struct Rows {
  std::vector<std::string> payloads;
  std::size_t largest = 0;
};
Rows exchange_rows(ddp::ProcessGroup& group, const std::string& payload, std::size_t row) {
  const std::size_t words = 1 + row / 8;
  std::vector<std::int64_t> table(words * static_cast<std::size_t>(group.size()), 0);
  std::int64_t* mine = &table[words * static_cast<std::size_t>(group.rank())];
  mine[0] = static_cast<std::int64_t>(payload.size());
  if (payload.size() <= row) std::memcpy(mine + 1, payload.data(), payload.size());
  group.allreduce(Buffer::of(table), ReduceOp::kSum)->wait();
  Rows out;
  for (int r = 0; r < group.size(); ++r) {
    const auto size = static_cast<std::size_t>(table[words * static_cast<std::size_t>(r)]);
    out.largest = std::max(out.largest, size);
  }
  if (out.largest > row) return out;
  for (int r = 0; r < group.size(); ++r) {
    const std::int64_t* at = &table[words * static_cast<std::size_t>(r)];
    out.payloads.emplace_back(reinterpret_cast<const char*>(at + 1),
                              static_cast<std::size_t>(at[0]));
  }
  return out;
}

// _C.exchange_layouts: every rank's `payload` (state.py's pickled layout), by
// rank of `group`. One all-reduce on the group's shared-memory path when every
// payload fits kLayoutRowBytes, a second one sized to the largest otherwise:
// torch's all_gather_object takes two all-gathers (and the backend's check of
// each) through torch's Work and future.
std::vector<pybind11::bytes> exchange_layouts(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                              const std::string& payload) {
  ddp::ProcessGroup& cpu_group = cpu_group_of(group);
  Rows rows;
  {
    pybind11::gil_scoped_release no_gil;
    rows = exchange_rows(cpu_group, payload, kLayoutRowBytes);
    if (rows.payloads.empty()) rows = exchange_rows(cpu_group, payload, (rows.largest + 7) / 8 * 8);
  }
  return {rows.payloads.begin(), rows.payloads.end()};
}

pybind11::dict sync_replica_state(const c10::intrusive_ptr<c10d::ProcessGroup>& group, int root,
                                  bool root_live, const std::vector<std::string>& names,
                                  const std::vector<at::Tensor>& tensors,
                                  const std::vector<std::string>& counter_names,
                                  std::vector<std::int64_t> counter_values) {
  ddp::ProcessGroup& cpu_group = cpu_group_of(group);
  TORCH_CHECK(names.size() == tensors.size(), "ddp_torch.sync_state: ", names.size(), " names for ",
              tensors.size(), " tensors");
  TORCH_CHECK(counter_names.size() == counter_values.size(),
              "ddp_torch.sync_state: ", counter_names.size(), " counter names for ",
              counter_values.size(), " values");
  std::vector<StagedTensor> staged;
  staged.reserve(tensors.size());
  ReplicaState state;
  state.set_live(process_live.load());
  const char* check = std::getenv(env_names::kTorchCheck);
  if (check == nullptr || std::string(check) != "0") state.set_in_place_bytes(kCheckedInPlaceBytes);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    staged.emplace_back(tensors[i], kOp);
    state.add(names[i], staged.back().buffer());
  }
  for (std::size_t k = 0; k < counter_names.size(); ++k) {
    state.add(counter_names[k], &counter_values[k]);
  }
  SyncResult result;
  {
    pybind11::gil_scoped_release no_gil;
    try {
      result = state.sync_agreed(cpu_group, root, root_live);
    } catch (...) {
      process_live.store(state.live());
      throw;
    }
    process_live.store(state.live());
    if (result.received) {
      for (const StagedTensor& s : staged) s.write_back();
    }
  }
  using pybind11::literals::operator""_a;
  return pybind11::dict("root"_a = result.root, "received"_a = result.received,
                        "from_live"_a = result.from_live, "bytes"_a = result.bytes,
                        "seconds"_a = result.seconds, "round"_a = result.round,
                        "counters"_a = counter_values);
}

}  // namespace

void bind_state(pybind11::module_& module) {
  module.def("sync_replica_state", &sync_replica_state, pybind11::arg("group"),
             pybind11::arg("root"), pybind11::arg("root_live"), pybind11::arg("names"),
             pybind11::arg("tensors"), pybind11::arg("counter_names"),
             pybind11::arg("counter_values"),
             "The transfer of ddp_torch.sync_state (collective; see state_bindings.cc)");
  module.def("exchange_layouts", &exchange_layouts, pybind11::arg("group"),
             pybind11::arg("payload"),
             "Every rank's payload (bytes), by rank (collective; see state_bindings.cc)");
  module.def(
      "replica_state_live", [] { return process_live.load(); },
      "Whether this process holds live replica state (a sync_state succeeded here)");
}

}  // namespace ddp::torch_backend
