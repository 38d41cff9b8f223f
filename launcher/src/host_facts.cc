#include "ddp/launcher/host_facts.h"

#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ddp/agent/worker_event_loop.h"
#include "ddp/common/env.h"

namespace ddp::launcher {

const HostFacts& real_host_facts() {
  static const HostFacts facts{
      .env = [](const std::string& name) { return env::get(name.c_str()); },
      .online_cpus =
          [] {
            long n = ::sysconf(_SC_NPROCESSORS_ONLN);
            return n > 0 ? static_cast<int>(n) : 1;
          },
      // No CUDA runtime in the launcher: count the device nodes.
      .gpu_device_nodes =
          [] {
            int n = 0;
            for (int i = 0; i < 64; ++i) {
              if (::access(("/dev/nvidia" + std::to_string(i)).c_str(), F_OK) == 0) ++n;
            }
            return n;
          },
      .hostname =
          [] {
            char buffer[256] = {};
            if (::gethostname(buffer, sizeof(buffer) - 1) != 0) return std::string("localhost");
            return std::string(buffer);
          },
      .is_regular_file =
          [](const std::string& path) { return std::filesystem::is_regular_file(path); },
      .is_readable = [](const std::string& path) { return ::access(path.c_str(), R_OK) == 0; },
      .resolve_program = &agent::resolve_program,
      .first_line =
          [](const std::string& path) {
            std::ifstream in(path);
            std::string line;
            std::getline(in, line);
            return line;
          },
      .python_module_dir =
          [] {
            std::error_code error;
            const auto exe = std::filesystem::read_symlink("/proc/self/exe", error);
            if (error) return std::string();
            const auto dir = exe.parent_path().parent_path() / "lib" / "ddprun" / "python";
            return std::filesystem::is_directory(dir, error) ? dir.lexically_normal().string()
                                                             : std::string();
          },
      .allowed_cpus =
          [] {
            std::set<int> cpus;
            cpu_set_t set;
            CPU_ZERO(&set);
            if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
            for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
              if (CPU_ISSET(cpu, &set)) cpus.insert(cpu);
            }
            return cpus;
          },
  };
  return facts;
}

}  // namespace ddp::launcher
