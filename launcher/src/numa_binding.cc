#include "ddp/launcher/numa_binding.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

namespace ddp::launcher {
namespace fs = std::filesystem;
namespace {

// The first line of a sysfs file, without surrounding blanks; nullopt when it
// cannot be read.
std::optional<std::string> read_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  const auto first = line.find_first_not_of(" \t\r");
  if (first == std::string::npos) return std::string();
  return line.substr(first, line.find_last_not_of(" \t\r") + 1 - first);
}

// The number after `prefix` in a directory entry's name ("node12" -> 12).
std::optional<int> numbered(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() || name.rfind(prefix, 0) != 0) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() > 6 ||
      !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); })) {
    return std::nullopt;
  }
  return std::stoi(digits);
}

std::optional<int> read_int(const fs::path& path) {
  auto line = read_line(path);
  if (!line || line->empty() || line->size() > 12) return std::nullopt;
  try {
    std::size_t used = 0;
    int value = std::stoi(*line, &used);
    if (used == line->size()) return value;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// The lowest CPU sharing `cpu_dir`'s highest-level data or unified cache.
std::optional<int> last_level_cache_owner(const fs::path& cpu_dir) {
  std::error_code ec;
  int best_level = -1;
  std::optional<int> owner;
  for (fs::directory_iterator it(cpu_dir / "cache", ec), end; !ec && it != end; it.increment(ec)) {
    if (!numbered(it->path().filename().string(), "index")) continue;
    const auto type = read_line(it->path() / "type");
    if (!type || (*type != "Unified" && *type != "Data")) continue;
    const auto level = read_int(it->path() / "level");
    const auto shared = read_line(it->path() / "shared_cpu_list");
    if (!level || !shared || *level <= best_level) continue;
    const std::set<int> cpus = parse_cpu_list(*shared);
    if (cpus.empty()) continue;
    best_level = *level;
    owner = *cpus.begin();
  }
  return owner;
}

void read_cpu_facts(const fs::path& root, int cpu, NumaTopology& t) {
  const fs::path dir = root / "devices/system/cpu" / ("cpu" + std::to_string(cpu));
  if (auto socket = read_int(dir / "topology/physical_package_id")) t.cpu_socket[cpu] = *socket;
  t.cpu_core[cpu] = cpu;
  if (auto siblings = read_line(dir / "topology/thread_siblings_list")) {
    const std::set<int> cpus = parse_cpu_list(*siblings);
    if (!cpus.empty()) t.cpu_core[cpu] = *cpus.begin();
  }
  if (auto owner = last_level_cache_owner(dir)) t.cpu_cache[cpu] = *owner;
}

void read_gpus(const fs::path& root, NumaTopology& t) {
  std::error_code ec;
  std::vector<std::pair<std::string, int>> gpus;  // PCI address, node
  for (fs::directory_iterator it(root / "bus/pci/devices", ec), end; !ec && it != end;
       it.increment(ec)) {
    const auto vendor = read_line(it->path() / "vendor");
    const auto device_class = read_line(it->path() / "class");
    if (!vendor || *vendor != "0x10de" || !device_class) continue;
    // 0x0300xx: VGA controller; 0x0302xx: 3D controller (data-center GPUs).
    if (device_class->rfind("0x0300", 0) != 0 && device_class->rfind("0x0302", 0) != 0) continue;
    const int node = read_int(it->path() / "numa_node").value_or(-1);
    gpus.emplace_back(it->path().filename().string(), std::max(node, 0));
  }
  std::sort(gpus.begin(), gpus.end());
  for (const auto& [address, node] : gpus) t.gpu_nodes.push_back(node);
}

std::set<int> intersect(const std::set<int>& a, const std::set<int>& b) {
  std::set<int> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::inserter(out, out.end()));
  return out;
}

// Where local rank r runs: its NUMA node, and its place among the ranks (or
// GPUs) that share the node.
struct Slot {
  int node = 0;
  int index = 0;  // among `peers`
  int peers = 1;
};

std::vector<Slot> gpu_slots(const NumaTopology& t, int nproc, const std::vector<int>& visible) {
  std::vector<int> gpus = visible;
  if (gpus.empty()) {
    for (int i = 0; i < static_cast<int>(t.gpu_nodes.size()); ++i) gpus.push_back(i);
  }
  for (int gpu : gpus) {
    if (gpu < 0 || gpu >= static_cast<int>(t.gpu_nodes.size())) {
      throw NumaBindingError("GPU " + std::to_string(gpu) + " is not among the " +
                             std::to_string(t.gpu_nodes.size()) + " NVIDIA GPUs in sysfs");
    }
  }
  if (nproc > static_cast<int>(gpus.size())) {
    throw NumaBindingError(std::to_string(nproc) + " local ranks but " +
                           std::to_string(gpus.size()) +
                           " GPUs: the binding follows local rank r's GPU r, as torch's does");
  }
  std::vector<Slot> slots;
  for (int r = 0; r < nproc; ++r) {
    Slot s;
    s.node = t.gpu_nodes[gpus[r]];
    std::vector<int> on_node;  // the visible GPUs on the node, by index
    for (int gpu : gpus) {
      if (t.gpu_nodes[gpu] == s.node) on_node.push_back(gpu);
    }
    std::sort(on_node.begin(), on_node.end());
    s.index =
        static_cast<int>(std::find(on_node.begin(), on_node.end(), gpus[r]) - on_node.begin());
    s.peers = static_cast<int>(on_node.size());
    slots.push_back(s);
  }
  return slots;
}

std::vector<Slot> cpu_slots(const NumaTopology& t, int nproc, const std::set<int>& allowed) {
  std::vector<int> nodes;
  for (const auto& [node, cpus] : t.node_cpus) {
    if (!intersect(cpus, allowed).empty()) nodes.push_back(node);
  }
  if (nodes.empty()) throw NumaBindingError("no NUMA node has a CPU this process may use");
  const int n = static_cast<int>(nodes.size());
  std::vector<Slot> slots(nproc);
  std::map<int, int> count;  // node -> ranks on it
  for (int r = 0; r < nproc; ++r) {
    slots[r].node = nodes[static_cast<std::size_t>(static_cast<long long>(r) * n / nproc)];
    slots[r].index = count[slots[r].node]++;
  }
  for (auto& s : slots) s.peers = count[s.node];
  return slots;
}

std::set<int> node_cpus(const NumaTopology& t, int node, const std::set<int>& allowed) {
  auto it = t.node_cpus.find(node);
  std::set<int> cpus = it == t.node_cpus.end() ? std::set<int>() : intersect(it->second, allowed);
  if (cpus.empty()) {
    throw NumaBindingError("NUMA node " + std::to_string(node) +
                           " has no CPU this process may use");
  }
  return cpus;
}

int socket_of(const NumaTopology& t, int cpu) {
  auto it = t.cpu_socket.find(cpu);
  if (it == t.cpu_socket.end()) {
    throw NumaBindingError("no socket for CPU " + std::to_string(cpu) +
                           " (topology/physical_package_id)");
  }
  return it->second;
}

std::set<int> socket_cpus(const NumaTopology& t, int node, const std::set<int>& allowed) {
  const int socket = socket_of(t, *node_cpus(t, node, allowed).begin());
  std::set<int> cpus;
  for (const auto& [other, all] : t.node_cpus) {
    const std::set<int> mine = intersect(all, allowed);
    if (!mine.empty() && socket_of(t, *mine.begin()) == socket)
      cpus.insert(mine.begin(), mine.end());
  }
  return cpus;
}

// `cpus` grouped by `key_of` (a CPU's core or cache), groups keyed by their key.
std::map<int, std::set<int>> group_by(const std::set<int>& cpus, const std::map<int, int>& key_of,
                                      const char* what) {
  std::map<int, std::set<int>> groups;
  for (int cpu : cpus) {
    auto it = key_of.find(cpu);
    if (it == key_of.end())
      throw NumaBindingError("no " + std::string(what) + " for CPU " + std::to_string(cpu));
    groups[it->second].insert(cpu);
  }
  return groups;
}

std::set<int> exclusive_cpus(const NumaTopology& t, const Slot& s, const std::set<int>& allowed) {
  const auto cores = group_by(node_cpus(t, s.node, allowed), t.cpu_core, "core");
  const int n = static_cast<int>(cores.size());
  const int per = n / s.peers;
  const int extra = n % s.peers;
  if (per < 1) {
    throw NumaBindingError("NUMA node " + std::to_string(s.node) + " has " + std::to_string(n) +
                           " physical cores for " + std::to_string(s.peers) + " ranks");
  }
  // The lowest indices get one core more when they do not divide evenly.
  const int start = s.index * per + std::min(s.index, extra);
  const int end = start + per + (s.index < extra ? 1 : 0);
  std::set<int> cpus;
  int i = 0;
  for (const auto& [core, members] : cores) {
    if (i >= start && i < end) cpus.insert(members.begin(), members.end());
    ++i;
  }
  return cpus;
}

std::set<int> core_complex_cpus(const NumaTopology& t, const Slot& s,
                                const std::set<int>& allowed) {
  const auto caches = group_by(node_cpus(t, s.node, allowed), t.cpu_cache, "last-level cache");
  std::vector<std::pair<int, std::set<int>>> ordered(caches.begin(), caches.end());
  // The largest groups first, then the lowest CPU (torch's order).
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  return ordered[static_cast<std::size_t>(s.index) % ordered.size()].second;
}

}  // namespace

std::optional<NumaMode> parse_numa_mode(const std::string& text) {
  if (text == "node") return NumaMode::kNode;
  if (text == "socket") return NumaMode::kSocket;
  if (text == "exclusive") return NumaMode::kExclusive;
  if (text == "core-complex") return NumaMode::kCoreComplex;
  return std::nullopt;
}

std::string numa_mode_names() { return "node, socket, exclusive or core-complex"; }

std::set<int> parse_cpu_list(const std::string& text) {
  std::set<int> cpus;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    item.erase(0, item.find_first_not_of(" \t\n"));
    item.erase(item.find_last_not_of(" \t\n") + 1);
    if (item.empty()) continue;
    const auto dash = item.find('-');
    auto number = [&](const std::string& digits) {
      if (digits.empty() || digits.size() > 6 ||
          !std::all_of(digits.begin(), digits.end(),
                       [](unsigned char c) { return std::isdigit(c); })) {
        throw NumaBindingError("malformed CPU list '" + text + "'");
      }
      return std::stoi(digits);
    };
    const int first = number(item.substr(0, dash));
    const int last = dash == std::string::npos ? first : number(item.substr(dash + 1));
    if (last < first) throw NumaBindingError("malformed CPU list '" + text + "'");
    for (int cpu = first; cpu <= last; ++cpu) cpus.insert(cpu);
  }
  return cpus;
}

std::string cpu_list_text(const std::set<int>& cpus) {
  std::string out;
  for (auto it = cpus.begin(); it != cpus.end();) {
    const int first = *it;
    int last = first;
    for (++it; it != cpus.end() && *it == last + 1; ++it) last = *it;
    if (!out.empty()) out += ',';
    out += std::to_string(first);
    if (last != first) {
      out += '-';
      out += std::to_string(last);
    }
  }
  return out;
}

NumaTopology read_numa_topology(const fs::path& sysfs_root) {
  NumaTopology t;
  std::error_code ec;
  const fs::path nodes = sysfs_root / "devices/system/node";
  for (fs::directory_iterator it(nodes, ec), end; !ec && it != end; it.increment(ec)) {
    const auto node = numbered(it->path().filename().string(), "node");
    if (!node) continue;
    if (auto list = read_line(it->path() / "cpulist")) t.node_cpus[*node] = parse_cpu_list(*list);
  }
  if (t.node_cpus.empty()) {
    throw NumaBindingError("no NUMA node found in " + nodes.string() + " (node<N>/cpulist)");
  }
  for (const auto& [node, cpus] : t.node_cpus) {
    for (int cpu : cpus) read_cpu_facts(sysfs_root, cpu, t);
  }
  read_gpus(sysfs_root, t);
  return t;
}

std::vector<std::set<int>> plan_numa_binding(const NumaTopology& topology, NumaMode mode,
                                             int local_world_size,
                                             const std::vector<int>& visible_gpus,
                                             const std::set<int>& allowed) {
  const std::vector<Slot> slots = topology.gpu_nodes.empty()
                                      ? cpu_slots(topology, local_world_size, allowed)
                                      : gpu_slots(topology, local_world_size, visible_gpus);
  std::vector<std::set<int>> plan;
  for (const Slot& s : slots) {
    switch (mode) {
      case NumaMode::kNode:
        plan.push_back(node_cpus(topology, s.node, allowed));
        break;
      case NumaMode::kSocket:
        plan.push_back(socket_cpus(topology, s.node, allowed));
        break;
      case NumaMode::kExclusive:
        plan.push_back(exclusive_cpus(topology, s, allowed));
        break;
      case NumaMode::kCoreComplex:
        plan.push_back(core_complex_cpus(topology, s, allowed));
        break;
    }
  }
  return plan;
}

}  // namespace ddp::launcher
