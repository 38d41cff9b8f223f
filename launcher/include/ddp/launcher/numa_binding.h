// --numa_binding (torchrun's --numa-binding, torch/numa/binding.py): which CPUs
// each local rank's worker may run on, from the host's topology in sysfs. The
// reading takes sysfs' root as a parameter, so tests give a fake topology in a
// temporary folder; the plan is a pure function of what was read. The agent
// applies a plan with sched_setaffinity in the worker's process before exec
// (no numactl needed).
//
// Errors: read_numa_topology and plan_numa_binding throw NumaBindingError,
// whose message says what is missing or impossible (without the option's
// name: the launcher adds it). Nothing here blocks but on sysfs' files, and
// nothing keeps state: thread-safe.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::launcher {

struct NumaBindingError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// torch's AffinityMode values.
enum class NumaMode {
  kNode,         // "node": every CPU of the NUMA node of the rank's GPU (or slot)
  kSocket,       // "socket": every CPU of every NUMA node of that node's socket
  kExclusive,    // "exclusive": that node's physical cores, split evenly among its ranks
  kCoreComplex,  // "core-complex": one group of cores sharing the last-level cache
};

// "node", "socket", "exclusive", "core-complex"; nullopt for anything else.
std::optional<NumaMode> parse_numa_mode(const std::string& text);
// The names above, as a message lists them ("node, socket, exclusive or core-complex").
std::string numa_mode_names();

// What sysfs says of the CPUs, NUMA nodes and GPUs.
struct NumaTopology {
  // NUMA node -> its CPUs (devices/system/node/node<N>/cpulist).
  std::map<int, std::set<int>> node_cpus;
  // CPU -> its socket (devices/system/cpu/cpu<N>/topology/physical_package_id).
  std::map<int, int> cpu_socket;
  // CPU -> the lowest CPU of its physical core (topology/thread_siblings_list);
  // a CPU without the file is a core of its own.
  std::map<int, int> cpu_core;
  // CPU -> the lowest CPU sharing its highest-level data or unified cache
  // (cache/index<K>/{type,level,shared_cpu_list}).
  std::map<int, int> cpu_cache;
  // The NUMA node of each NVIDIA GPU (bus/pci/devices/*: vendor 0x10de, a
  // display or 3D controller class), in PCI address order (CUDA's
  // CUDA_DEVICE_ORDER=PCI_BUS_ID numbering); a numa_node of -1 is node 0.
  std::vector<int> gpu_nodes;
};

// Reads the topology under `sysfs_root` ("/sys" on a real host). Throws
// NumaBindingError when no NUMA node with a cpulist is found.
NumaTopology read_numa_topology(const std::filesystem::path& sysfs_root);

// "0-3,8,10-11" -> {0,1,2,3,8,10,11} (sysfs' lists); throws NumaBindingError
// on malformed text.
std::set<int> parse_cpu_list(const std::string& text);
// The inverse, as ranges.
std::string cpu_list_text(const std::set<int>& cpus);

// The CPUs each local rank's worker is bound to (index: local rank).
//
// With GPUs (topology.gpu_nodes not empty), as torch does: local rank r uses
// GPU `visible_gpus[r]` (CUDA_VISIBLE_DEVICES' indices; empty: GPU r), and is
// bound by that GPU's NUMA node; "exclusive" and "core-complex" split the node
// among the visible GPUs on it. Without GPUs (CPU slots), the local ranks are
// spread over the NUMA nodes that have CPUs in contiguous blocks (rank r on
// node r * nodes / local_world_size), and the ranks of a node split it.
// Only CPUs in `allowed` (ddprun's own affinity) are used. Throws
// NumaBindingError when a rank would get no CPU or the topology lacks what
// the mode needs.
std::vector<std::set<int>> plan_numa_binding(const NumaTopology& topology, NumaMode mode,
                                             int local_world_size,
                                             const std::vector<int>& visible_gpus,
                                             const std::set<int>& allowed);

}  // namespace ddp::launcher
