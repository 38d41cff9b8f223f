// What ddprun's command line reads from the machine it runs on: the
// environment (PET_<NAME> fallbacks, SLURM, PATH, PYTHON_EXEC,
// CUDA_VISIBLE_DEVICES), the CPUs and GPUs (--nproc_per_node cpu/gpu/auto),
// the host name (--local_addr's default, failure reports), files (the
// program, the Python, --rdzv_conf's etcd files) and the CPU topology
// (--numa_binding). parse_command_line reads
// them only through a HostFacts: real_host_facts() in ddprun, a fake in tests.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>

namespace ddp::launcher {

struct HostFacts {
  // An environment variable; nullopt when unset (an empty value counts as set).
  std::function<std::optional<std::string>(const std::string& name)> env;
  // Online CPUs, at least 1.
  std::function<int()> online_cpus;
  // CUDA device nodes present (/dev/nvidia0 .. /dev/nvidia63);
  // CUDA_VISIBLE_DEVICES, when set, is read through `env` instead.
  std::function<int()> gpu_device_nodes;
  // This host's name ("localhost" when it cannot be read).
  std::function<std::string()> hostname;
  // Whether `path` is a regular file (following symbolic links).
  std::function<bool(const std::string& path)> is_regular_file;
  // Whether this process may read `path`.
  std::function<bool(const std::string& path)> is_readable;
  // `program` resolved like execvp against `path` (a PATH value): the path to
  // execute, or "" when not found or not executable (agent::resolve_program).
  std::function<std::string(const std::string& program, const std::string& path)> resolve_program;
  // The first line of the file at `path`, without its "\n"; "" for an empty
  // or unreadable file.
  std::function<std::string(const std::string& path)> first_line;
  // ddprun's own Python modules (ddp_torch): <folder of the ddprun
  // executable>/../lib/ddprun/python when that folder exists, else "". May be
  // left empty (a host without it).
  std::function<std::string()> python_module_dir;
  // The CPUs this process may run on (sched_getaffinity), for --numa_binding.
  // May be left empty: every CPU sysfs lists.
  std::function<std::set<int>()> allowed_cpus;
  // Where sysfs is mounted ("/sys"), for --numa_binding's topology (a fake
  // topology's folder in tests).
  std::string sysfs_root = "/sys";
};

// This process's environment and this machine.
const HostFacts& real_host_facts();

}  // namespace ddp::launcher
