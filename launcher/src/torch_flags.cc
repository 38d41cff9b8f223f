#include "torch_flags.h"

#include <algorithm>
#include <cctype>
#include <chrono>

#include "ddp/launcher/numa_binding.h"
#include "values.h"

namespace ddp::launcher {
namespace {

constexpr const char* kShutdownTimeoutVariable = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT";

class TorchFlags {
 public:
  TorchFlags(const RawOptions& raw, const OptionOrigins& origins, const HostFacts& host,
             LaunchConfig& c)
      : raw_(raw), origins_(origins), host_(host), c_(c) {}

  void resolve() {
    refuse_logs_specs();
    c_.agent.stop_grace = stop_grace();
    resolve_duplicate_filters();
    resolve_event_log_handler();
    resolve_virtual_local_rank();
    resolve_numa_binding();
    warn_of_omp_num_threads();
  }

 private:
  std::string what(const std::string& name) const { return origins_.what(name); }

  void refuse_logs_specs() const {
    if (raw_.logs_specs.empty()) return;
    fail(what("logs_specs") + "='" + raw_.logs_specs +
         "': torchrun's LogsSpecs plug-ins are Python entry points (torchrun.logs_specs) and "
         "ddprun loads no Python; its log layout is set by --log_dir, -r/--redirects, "
         "-t/--tee, --local_ranks_filter, --duplicate_stdout_filters, "
         "--duplicate_stderr_filters and TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (docs/using.md, "
         "Logs)");
  }

  // --stop_grace and torch 2.x's --shutdown_timeout name one grace; without
  // either, torch's TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else the default.
  std::chrono::milliseconds stop_grace() const {
    const bool grace_given = origins_.given("stop_grace");
    if (origins_.given("shutdown_timeout")) {
      const auto timeout = parse_secs(raw_.shutdown_timeout, what("shutdown_timeout"));
      if (grace_given && parse_secs(raw_.stop_grace, what("stop_grace")) != timeout) {
        fail(what("shutdown_timeout") + "=" + raw_.shutdown_timeout + " and " + what("stop_grace") +
             "=" + raw_.stop_grace +
             " disagree: both are the seconds between SIGTERM and SIGKILL (give one)");
      }
      return timeout;
    }
    if (!grace_given) {
      const auto variable = host_.env(kShutdownTimeoutVariable);
      if (variable && !variable->empty()) return parse_secs(*variable, kShutdownTimeoutVariable);
    }
    return parse_secs(raw_.stop_grace, what("stop_grace"));
  }

  void resolve_duplicate_filters() {
    agent::WorkerSpec& spec = c_.agent.spec;
    spec.duplicate_stdout_filters =
        parse_filters(raw_.duplicate_stdout_filters, what("duplicate_stdout_filters"));
    spec.duplicate_stderr_filters =
        parse_filters(raw_.duplicate_stderr_filters, what("duplicate_stderr_filters"));
    auto tees = [&](agent::Std bit) {
      if (agent::has(spec.tee.all, bit)) return true;
      return std::any_of(spec.tee.per_rank.begin(), spec.tee.per_rank.end(),
                         [&](const auto& entry) { return agent::has(entry.second, bit); });
    };
    if (!spec.duplicate_stdout_filters.empty() && !tees(agent::Std::kOut)) {
      c_.warnings.push_back(
          "--duplicate_stdout_filters copies lines of tee'd streams only (as torchrun does), "
          "and no stdout is tee'd (-t/--tee 1 or 3): nothing will be copied");
    }
    if (!spec.duplicate_stderr_filters.empty() && !tees(agent::Std::kErr)) {
      c_.warnings.push_back(
          "--duplicate_stderr_filters copies lines of tee'd streams only (as torchrun does), "
          "and no stderr is tee'd (-t/--tee 2 or 3): nothing will be copied");
    }
  }

  void resolve_event_log_handler() {
    const std::string& handler = raw_.event_log_handler;
    if (handler != "null" && handler != "console" && handler != "dynamic_rendezvous") {
      fail(what("event_log_handler") +
           ": expected null, console or dynamic_rendezvous (torchrun's registered handlers), "
           "got '" +
           handler + "'");
    }
    c_.event_log_handler = handler;
    if (handler == "console") {
      c_.warnings.push_back(
          "--event_log_handler=console: ddprun writes no torchelastic event records; its "
          "agent's events (rounds, exits, restarts, hangs) are printed on stderr as they "
          "happen, and served by the live view (--status_port, /status)");
    }
  }

  void resolve_virtual_local_rank() {
    c_.agent.spec.virtual_local_rank = raw_.virtual_local_rank;
    if (!raw_.virtual_local_rank) return;
    const auto visible = host_.env("CUDA_VISIBLE_DEVICES");
    if (!visible) return;
    const int nproc = c_.agent.spec.local_world_size;
    const auto items = agent::visible_device_items(*visible);
    if (static_cast<int>(items.size()) < nproc) {
      fail(what("virtual_local_rank") + ": --nproc_per_node=" + std::to_string(nproc) +
           " but CUDA_VISIBLE_DEVICES='" + *visible + "' names " + std::to_string(items.size()) +
           " device(s): local rank " + std::to_string(items.size()) + " would have none");
    }
  }

  // CUDA_VISIBLE_DEVICES' indices (empty when unset).
  std::vector<int> visible_gpus() const {
    std::vector<int> gpus;
    const auto visible = host_.env("CUDA_VISIBLE_DEVICES");
    if (!visible) return gpus;
    for (const auto& item : agent::visible_device_items(*visible)) {
      if (item.empty() || item.size() > 6 ||
          !std::all_of(item.begin(), item.end(),
                       [](unsigned char ch) { return std::isdigit(ch); })) {
        fail(what("numa_binding") + ": CUDA_VISIBLE_DEVICES='" + *visible +
             "' does not name GPUs by index, so their NUMA nodes are unknown");
      }
      gpus.push_back(std::stoi(item));
    }
    return gpus;
  }

  void resolve_numa_binding() {
    const std::string& text = raw_.numa_binding;
    if (text.empty()) return;
    const auto mode = parse_numa_mode(text);
    if (!mode) {
      fail(what("numa_binding") + ": expected " + numa_mode_names() + ", got '" + text + "'");
    }
    c_.numa_binding = text;
    try {
      const NumaTopology topology = read_numa_topology(host_.sysfs_root);
      std::set<int> allowed = host_.allowed_cpus ? host_.allowed_cpus() : std::set<int>();
      if (allowed.empty()) {
        for (const auto& [node, cpus] : topology.node_cpus)
          allowed.insert(cpus.begin(), cpus.end());
      }
      const std::vector<int> gpus =
          topology.gpu_nodes.empty() ? std::vector<int>() : visible_gpus();
      for (const auto& cpus :
           plan_numa_binding(topology, *mode, c_.agent.spec.local_world_size, gpus, allowed)) {
        c_.agent.spec.cpu_affinity.emplace_back(cpus.begin(), cpus.end());
      }
    } catch (const NumaBindingError& e) {
      fail(what("numa_binding") + "=" + text + ": " + e.what());
    }
  }

  // torchrun's warning, when it sets OMP_NUM_THREADS=1 for the workers.
  void warn_of_omp_num_threads() {
    if (!c_.agent.set_omp_num_threads || host_.env("OMP_NUM_THREADS")) return;
    c_.warnings.push_back(
        "setting OMP_NUM_THREADS=1 for each worker (more than one per node and "
        "OMP_NUM_THREADS unset), as torchrun does, to avoid overloading the system; tune it "
        "for your application as needed");
  }

  const RawOptions& raw_;
  const OptionOrigins& origins_;
  const HostFacts& host_;
  LaunchConfig& c_;
};

}  // namespace

std::vector<std::string> parse_filters(const std::string& text, const std::string& what) {
  std::vector<std::string> filters;
  if (text.empty()) return filters;
  std::string filter;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ',') {
      filter += text[i];
    } else if (i + 1 < text.size() && text[i + 1] == ',') {
      filter += ',';
      ++i;
    } else {
      filters.push_back(filter);
      filter.clear();
    }
  }
  filters.push_back(filter);
  if (std::find(filters.begin(), filters.end(), std::string()) != filters.end()) {
    fail(what + ": an empty filter in '" + text +
         "' would copy every line (',,' is a comma in a filter)");
  }
  return filters;
}

void resolve_torch_flags(const RawOptions& raw, const OptionOrigins& origins, const HostFacts& host,
                         LaunchConfig& c) {
  TorchFlags(raw, origins, host, c).resolve();
}

}  // namespace ddp::launcher
