// torchrun's flags newer than 1.13, below the command line: --numa_binding's
// plan on fake sysfs topologies (several NUMA nodes, sockets, hyper-threads,
// last-level caches, GPUs) written into a temporary folder, and the variables
// torch 2.x's agent adds to a worker's environment (add_torch_variables).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ddp/agent/worker_spec.h"
#include "ddp/common/error.h"
#include "ddp/launcher/numa_binding.h"
#include "temp_dir.h"

namespace ddp::launcher {
namespace {

namespace fs = std::filesystem;
using Cpus = std::set<int>;

// A sysfs tree in a temporary folder, written file by file.
class FakeSysfs {
 public:
  const fs::path& root() const { return dir_.path(); }

  void write(const std::string& relative, const std::string& text) {
    const fs::path path = root() / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text << "\n";
  }

  void node(int node, const std::string& cpulist) {
    write("devices/system/node/node" + std::to_string(node) + "/cpulist", cpulist);
  }

  // CPU `cpu` on socket `socket`, its core's CPUs `siblings`, its L3 shared
  // with `l3` (an L1 data cache of its own too: the highest level must win).
  void cpu(int cpu, int socket, const std::string& siblings, const std::string& l3) {
    const std::string dir = "devices/system/cpu/cpu" + std::to_string(cpu);
    write(dir + "/topology/physical_package_id", std::to_string(socket));
    write(dir + "/topology/thread_siblings_list", siblings);
    write(dir + "/cache/index0/type", "Data");
    write(dir + "/cache/index0/level", "1");
    write(dir + "/cache/index0/shared_cpu_list", std::to_string(cpu));
    write(dir + "/cache/index1/type", "Instruction");
    write(dir + "/cache/index1/level", "4");
    write(dir + "/cache/index1/shared_cpu_list", "0-63");
    write(dir + "/cache/index3/type", "Unified");
    write(dir + "/cache/index3/level", "3");
    write(dir + "/cache/index3/shared_cpu_list", l3);
  }

  void gpu(const std::string& pci_address, int numa_node) {
    const std::string dir = "bus/pci/devices/" + pci_address;
    write(dir + "/vendor", "0x10de");
    write(dir + "/class", "0x030200");
    write(dir + "/numa_node", std::to_string(numa_node));
  }

 private:
  test::TempDir dir_{"ddp-numa"};
};

// Two sockets, one NUMA node each, 4 cores of 2 hyper-threads per node (CPU c
// and c + 8 share a core), two L3 caches per node (cores 0-1 and 2-3 of each).
void two_sockets(FakeSysfs& sys) {
  sys.node(0, "0-3,8-11");
  sys.node(1, "4-7,12-15");
  for (int c = 0; c < 8; ++c) {
    const int socket = c / 4;
    const int first = socket * 4 + (c % 4 < 2 ? 0 : 2);
    const std::string l3 = std::to_string(first) + "-" + std::to_string(first + 1) + "," +
                           std::to_string(first + 8) + "-" + std::to_string(first + 9);
    const std::string siblings = std::to_string(c) + "," + std::to_string(c + 8);
    sys.cpu(c, socket, siblings, l3);
    sys.cpu(c + 8, socket, siblings, l3);
  }
}

Cpus all_cpus(int n) {
  Cpus cpus;
  for (int c = 0; c < n; ++c) cpus.insert(c);
  return cpus;
}

std::vector<Cpus> plan(const FakeSysfs& sys, NumaMode mode, int nproc,
                       const std::vector<int>& visible = {}, const Cpus& allowed = all_cpus(16)) {
  return plan_numa_binding(read_numa_topology(sys.root()), mode, nproc, visible, allowed);
}

TEST(NumaBinding, ModesAreTorchsNames) {
  EXPECT_EQ(parse_numa_mode("node"), NumaMode::kNode);
  EXPECT_EQ(parse_numa_mode("socket"), NumaMode::kSocket);
  EXPECT_EQ(parse_numa_mode("exclusive"), NumaMode::kExclusive);
  EXPECT_EQ(parse_numa_mode("core-complex"), NumaMode::kCoreComplex);
  EXPECT_FALSE(parse_numa_mode("core_complex"));
  EXPECT_FALSE(parse_numa_mode(""));
}

TEST(NumaBinding, CpuListsReadAndWrittenAsSysfsWritesThem) {
  EXPECT_EQ(parse_cpu_list("0-2,4,6-7\n"), (Cpus{0, 1, 2, 4, 6, 7}));
  EXPECT_EQ(parse_cpu_list(""), Cpus{});
  EXPECT_EQ(cpu_list_text({0, 1, 2, 4, 6, 7}), "0-2,4,6-7");
  EXPECT_THROW(parse_cpu_list("3-1"), NumaBindingError);
  EXPECT_THROW(parse_cpu_list("a"), NumaBindingError);
}

TEST(NumaBinding, TopologyIsReadFromSysfs) {
  FakeSysfs sys;
  two_sockets(sys);
  sys.gpu("0000:81:00.0", 1);
  sys.gpu("0000:01:00.0", -1);                                 // one node's host: -1 is node 0
  sys.write("bus/pci/devices/0000:02:00.0/vendor", "0x8086");  // not a GPU
  const NumaTopology t = read_numa_topology(sys.root());
  EXPECT_EQ(t.node_cpus.at(0), (Cpus{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(t.node_cpus.at(1), (Cpus{4, 5, 6, 7, 12, 13, 14, 15}));
  EXPECT_EQ(t.cpu_socket.at(12), 1);
  EXPECT_EQ(t.cpu_core.at(9), 1);    // CPU 9 is core 1's second thread
  EXPECT_EQ(t.cpu_cache.at(10), 2);  // the L3 of cores 2-3, not the L1 nor the instruction cache
  EXPECT_EQ(t.gpu_nodes, (std::vector<int>{0, 1}));  // in PCI address order
  FakeSysfs empty;
  EXPECT_THROW(read_numa_topology(empty.root()), NumaBindingError);
}

TEST(NumaBinding, GpuRanksFollowTheirGpusNode) {
  FakeSysfs sys;
  two_sockets(sys);
  sys.gpu("0000:01:00.0", 0);
  sys.gpu("0000:02:00.0", 0);
  sys.gpu("0000:81:00.0", 1);
  sys.gpu("0000:82:00.0", 1);
  const Cpus node0{0, 1, 2, 3, 8, 9, 10, 11};
  const Cpus node1{4, 5, 6, 7, 12, 13, 14, 15};
  EXPECT_EQ(plan(sys, NumaMode::kNode, 4), (std::vector<Cpus>{node0, node0, node1, node1}));
  // exclusive: the node's 4 cores split between its 2 GPUs, hyper-threads kept together.
  EXPECT_EQ(plan(sys, NumaMode::kExclusive, 4),
            (std::vector<Cpus>{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  // core-complex: one L3 each.
  EXPECT_EQ(plan(sys, NumaMode::kCoreComplex, 4),
            (std::vector<Cpus>{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  // CUDA_VISIBLE_DEVICES=3,0: local rank 0 uses GPU 3 (node 1).
  EXPECT_EQ(plan(sys, NumaMode::kNode, 2, {3, 0}), (std::vector<Cpus>{node1, node0}));
  // Only the CPUs ddprun may use.
  EXPECT_EQ(plan(sys, NumaMode::kNode, 1, {}, {1, 2, 5}), (std::vector<Cpus>{{1, 2}}));
  EXPECT_THROW(plan(sys, NumaMode::kNode, 5), NumaBindingError);           // more ranks than GPUs
  EXPECT_THROW(plan(sys, NumaMode::kNode, 1, {7}), NumaBindingError);      // no GPU 7
  EXPECT_THROW(plan(sys, NumaMode::kNode, 1, {}, {5}), NumaBindingError);  // none of node 0's
}

TEST(NumaBinding, SocketTakesEveryNodeOfTheSocket) {
  FakeSysfs sys;
  // Four NUMA nodes (sub-NUMA clustering), two per socket, one core each.
  for (int n = 0; n < 4; ++n) {
    sys.node(n, std::to_string(n));
    sys.cpu(n, n / 2, std::to_string(n), std::to_string(n));
  }
  sys.gpu("0000:01:00.0", 1);
  sys.gpu("0000:81:00.0", 2);
  EXPECT_EQ(plan(sys, NumaMode::kSocket, 2, {}, all_cpus(4)), (std::vector<Cpus>{{0, 1}, {2, 3}}));
  EXPECT_EQ(plan(sys, NumaMode::kNode, 2, {}, all_cpus(4)), (std::vector<Cpus>{{1}, {2}}));
}

TEST(NumaBinding, CpuSlotsAreSpreadOverTheNodesInBlocks) {
  FakeSysfs sys;
  two_sockets(sys);
  const Cpus node0{0, 1, 2, 3, 8, 9, 10, 11};
  const Cpus node1{4, 5, 6, 7, 12, 13, 14, 15};
  EXPECT_EQ(plan(sys, NumaMode::kNode, 4), (std::vector<Cpus>{node0, node0, node1, node1}));
  EXPECT_EQ(plan(sys, NumaMode::kNode, 3), (std::vector<Cpus>{node0, node0, node1}));
  // 3 ranks on node 0's 4 cores: the first gets the extra core (torch's rule).
  EXPECT_EQ(plan(sys, NumaMode::kExclusive, 6),
            (std::vector<Cpus>{{0, 1, 8, 9}, {2, 10}, {3, 11}, {4, 5, 12, 13}, {6, 14}, {7, 15}}));
  // More ranks than a node's cores: refused, not overlapped.
  EXPECT_THROW(plan(sys, NumaMode::kExclusive, 10), NumaBindingError);
  // A node without a usable CPU takes no rank.
  EXPECT_EQ(plan(sys, NumaMode::kNode, 2, {}, {4, 5}), (std::vector<Cpus>{{4, 5}, {4, 5}}));
}

TEST(NumaBinding, CoreComplexPrefersTheLargestCaches) {
  FakeSysfs sys;
  sys.node(0, "0-5");
  for (int c = 0; c < 6; ++c) sys.cpu(c, 0, std::to_string(c), c < 2 ? "0-1" : "2-5");
  EXPECT_EQ(plan(sys, NumaMode::kCoreComplex, 3, {}, all_cpus(6)),
            (std::vector<Cpus>{{2, 3, 4, 5}, {0, 1}, {2, 3, 4, 5}}));
  FakeSysfs no_caches;
  no_caches.node(0, "0-1");
  EXPECT_THROW(plan(no_caches, NumaMode::kCoreComplex, 1, {}, all_cpus(2)), NumaBindingError);
}

// ------------------------------------------------------- the worker's variables

std::map<std::string, std::string> torch_variables(std::map<std::string, std::string> env,
                                                   const agent::TorchWorkerFacts& facts) {
  agent::add_torch_variables(env, facts);
  return env;
}

TEST(TorchWorkerVariables, AsyncErrorHandlingInBothSpellings) {
  auto env = torch_variables({}, {});
  EXPECT_EQ(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
  EXPECT_EQ(env.at("NCCL_ASYNC_ERROR_HANDLING"), "1");
  EXPECT_EQ(env.at("TORCHELASTIC_USE_AGENT_STORE"), "False");
  EXPECT_EQ(env.count("OMP_NUM_THREADS"), 0u);
  EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u);
  // The user's word, in either spelling, is kept and carried to the other.
  env = torch_variables({{"NCCL_ASYNC_ERROR_HANDLING", "0"}}, {});
  EXPECT_EQ(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "0");
  EXPECT_EQ(env.at("NCCL_ASYNC_ERROR_HANDLING"), "0");
  env = torch_variables({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}}, {});
  EXPECT_EQ(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "3");
  EXPECT_EQ(env.at("NCCL_ASYNC_ERROR_HANDLING"), "3");
  env = torch_variables(
      {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "2"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"}}, {});
  EXPECT_EQ(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "2");
  EXPECT_EQ(env.at("NCCL_ASYNC_ERROR_HANDLING"), "0");
}

TEST(TorchWorkerVariables, AgentStoreAndOmpThreads) {
  agent::TorchWorkerFacts facts;
  facts.uses_agent_store = true;
  facts.set_omp_num_threads = true;
  auto env = torch_variables({}, facts);
  EXPECT_EQ(env.at("TORCHELASTIC_USE_AGENT_STORE"), "True");
  EXPECT_EQ(env.at("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(torch_variables({{"OMP_NUM_THREADS", "8"}}, facts).at("OMP_NUM_THREADS"), "8");
}

TEST(TorchWorkerVariables, VirtualLocalRankShowsEachWorkerItsOwnDevice) {
  agent::TorchWorkerFacts facts;
  facts.virtual_local_rank = true;
  facts.local_rank = 2;
  auto env = torch_variables({{"LOCAL_RANK", "2"}}, facts);
  EXPECT_EQ(env.at("LOCAL_RANK"), "0");
  EXPECT_EQ(env.at("CUDA_VISIBLE_DEVICES"), "2");
  // Through the inherited list, blanks trimmed, as torch does.
  env = torch_variables({{"LOCAL_RANK", "2"}, {"CUDA_VISIBLE_DEVICES", "4,5, 7"}}, facts);
  EXPECT_EQ(env.at("CUDA_VISIBLE_DEVICES"), "7");
  EXPECT_EQ(env.at("LOCAL_RANK"), "0");
  EXPECT_THROW(torch_variables({{"CUDA_VISIBLE_DEVICES", "4,5"}}, facts), InvalidArgument);
  // Without it, LOCAL_RANK and CUDA_VISIBLE_DEVICES are left as they are.
  facts.virtual_local_rank = false;
  env = torch_variables({{"LOCAL_RANK", "2"}, {"CUDA_VISIBLE_DEVICES", "4,5"}}, facts);
  EXPECT_EQ(env.at("LOCAL_RANK"), "2");
  EXPECT_EQ(env.at("CUDA_VISIBLE_DEVICES"), "4,5");
}

}  // namespace
}  // namespace ddp::launcher
