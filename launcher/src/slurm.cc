// SLURM host lists and job environment (see slurm.h for the contract).
#include "ddp/launcher/slurm.h"

#include <algorithm>

#include "ddp/common/env.h"
#include "ddp/common/error.h"
#include "ddp/rendezvous/backends.h"
#include "options.h"
#include "values.h"

namespace ddp::launcher {
namespace {

// A problem with a host list, described without the list's origin.
struct ListProblem {
  std::string message;
};

[[noreturn]] void problem(std::string message) { throw ListProblem{std::move(message)}; }

// A value quoted for a message, cut short when long.
std::string shown(std::string_view value) {
  constexpr std::size_t kMax = 200;
  // Appended: "'" + std::string(...) is a false -Wrestrict of GCC 12 at -O3.
  std::string out = "'";
  if (value.size() <= kMax) return out.append(value).append(1, '\'');
  return out.append(value.substr(0, kMax))
      .append("...' (")
      .append(std::to_string(value.size()))
      .append(" characters)");
}

bool is_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(),
                                      [](unsigned char c) { return c >= '0' && c <= '9'; });
}

std::uint64_t to_number(std::string_view digits) {
  std::uint64_t value = 0;
  for (char c : digits) value = value * 10 + static_cast<std::uint64_t>(c - '0');
  return value;
}

// One "N" or "N-M" of a bracket group.
struct Range {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  int width = 0;  // digits of N as written: the zero-padded width of every number
  std::uint64_t size() const { return hi - lo + 1; }
};

struct Group {
  std::vector<Range> ranges;
  std::uint64_t size() const {
    std::uint64_t n = 0;
    for (const auto& r : ranges) n += r.size();
    return n;
  }
  // The value at `index` (0 <= index < size()), formatted.
  std::string at(std::uint64_t index) const {
    for (const auto& r : ranges) {
      if (index < r.size()) {
        std::string digits = std::to_string(r.lo + index);
        if (static_cast<int>(digits.size()) < r.width) {
          digits.insert(0, static_cast<std::size_t>(r.width) - digits.size(), '0');
        }
        return digits;
      }
      index -= r.size();
    }
    return {};
  }
};

// An entry of the list: texts[0] g[0] texts[1] g[1] ... g[k-1] (SLURM allows
// no text after the last group; with no group, texts[0] is the host).
struct Entry {
  std::vector<std::string> texts;
  std::vector<Group> groups;
};

Range parse_range(std::string_view item) {
  if (item.empty()) problem("empty range");
  const auto dash = item.find('-');
  std::string_view lo = item.substr(0, dash);
  std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
  if (!is_digits(lo) || !is_digits(hi)) {
    problem("bad range " + shown(item) + " (expected N or N-M, digits only)");
  }
  if (lo.size() > 18 || hi.size() > 18) {
    problem("number too large in range " + shown(item));
  }
  Range range{to_number(lo), to_number(hi), static_cast<int>(lo.size())};
  if (range.lo > range.hi) problem("reversed range " + shown(item));
  if (range.size() > kMaxHostsPerRange) {
    problem("range " + shown(item) + " has more than " + std::to_string(kMaxHostsPerRange) +
            " hosts");
  }
  return range;
}

Group parse_group(std::string_view inside) {
  if (inside.empty()) problem("empty brackets '[]'");
  Group group;
  std::size_t start = 0;
  for (;;) {
    const auto comma = inside.find(',', start);
    group.ranges.push_back(parse_range(inside.substr(start, comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return group;
}

Entry parse_entry(std::string_view text) {
  Entry entry;
  std::size_t pos = 0;
  for (;;) {
    const auto open = text.find('[', pos);
    if (open == std::string_view::npos) {
      std::string rest(text.substr(pos));
      if (!entry.groups.empty() && !rest.empty()) {
        problem("text " + shown(rest) + " after the last ']' of an entry (SLURM allows none)");
      }
      if (entry.groups.empty()) entry.texts.push_back(rest);
      return entry;
    }
    const auto close = text.find(']', open);  // balanced: checked by the tokenizer
    entry.texts.emplace_back(text.substr(pos, open - pos));
    entry.groups.push_back(parse_group(text.substr(open + 1, close - open - 1)));
    pos = close + 1;
  }
}

// Splits at commas and whitespace outside brackets, checking the brackets.
std::vector<Entry> parse_list(std::string_view list) {
  std::vector<Entry> entries;
  std::size_t start = 0;
  bool inside = false;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') {
      if (inside) problem("nested '['");
      inside = true;
    } else if (c == ']') {
      if (!inside) problem("']' without '['");
      inside = false;
    } else if (i == list.size() && inside) {
      problem("unbalanced '['");
    } else if (inside && (c == ' ' || c == '\t' || c == '\n')) {
      problem("whitespace inside brackets");
    } else if (!inside && (c == ',' || c == ' ' || c == '\t' || c == '\n')) {
      if (i > start) entries.push_back(parse_entry(list.substr(start, i - start)));
      start = i + 1;
    }
  }
  if (entries.empty()) problem("the list names no host");
  return entries;
}

// SLURM's nesting: with groups g1..gk, loops g(k-1) ... g1 outermost first,
// then gk innermost. Returns group indices (0-based) from outermost to innermost.
std::vector<std::size_t> loop_order(std::size_t k) {
  std::vector<std::size_t> order;
  if (k == 0) return order;
  for (std::size_t g = k - 1; g-- > 0;) order.push_back(g);
  order.push_back(k - 1);
  return order;
}

std::string host_at(const Entry& entry, const std::vector<std::uint64_t>& index) {
  std::string host;
  for (std::size_t g = 0; g < entry.groups.size(); ++g) {
    host += entry.texts[g];
    host += entry.groups[g].at(index[g]);
  }
  if (entry.groups.empty()) host = entry.texts[0];
  return host;
}

// The first host of a parsed list: every group at its first value.
std::string host_at_start(const std::vector<Entry>& entries) {
  return host_at(entries[0], std::vector<std::uint64_t>(entries[0].groups.size(), 0));
}

[[noreturn]] void bad_variable(const std::string& name, std::string_view value,
                               const std::string& what) {
  throw InvalidArgument(name, shown(value) + " " + what);
}

// A non-negative integer of at most 9 digits, or nullopt.
std::optional<int> small_number(std::string_view text) {
  if (!is_digits(text) || text.size() > 9) return std::nullopt;
  return static_cast<int>(to_number(text));
}

// One item of SLURM's per-node counts: "N", or "N(xM)" (M nodes of N).
struct CountEntry {
  int count = 0;
  int repeat = 1;
  bool repeated = false;
};

// Parses "2(x3),1"; throws InvalidArgument (origin "count") when malformed.
std::vector<CountEntry> parse_counts(std::string_view value) {
  std::vector<CountEntry> entries;
  std::size_t start = 0;
  for (;;) {
    const auto comma = value.find(',', start);
    const std::string_view item =
        value.substr(start, comma == std::string_view::npos ? comma : comma - start);
    auto bad = [&] { return InvalidArgument("count", "expected N or N(xM), got " + shown(item)); };
    CountEntry entry;
    std::string_view count = item;
    if (const auto paren = item.find("(x"); paren != std::string_view::npos) {
      count = item.substr(0, paren);
      const std::string_view times = item.substr(paren + 2);
      if (times.empty() || times.back() != ')') throw bad();
      auto repeat = small_number(times.substr(0, times.size() - 1));
      if (!repeat || *repeat < 1) throw bad();
      entry.repeat = *repeat;
      entry.repeated = true;
    }
    auto n = small_number(count);
    if (!n) throw bad();
    if (*n < 1) throw InvalidArgument("count", "a count of 0 in " + shown(item));
    entry.count = *n;
    entries.push_back(entry);
    if (comma == std::string_view::npos) return entries;
    start = comma + 1;
  }
}

[[noreturn]] void bad_tasks_per_node(const std::string& value, const InvalidArgument& e) {
  // e.what() is "count: <problem>"; keep the problem.
  std::string why = e.what();
  const std::string prefix = "count: ";
  if (why.rfind(prefix, 0) == 0) why.erase(0, prefix.size());
  bad_variable("SLURM_NTASKS_PER_NODE", value, "is not a task count per node: " + why);
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view list, std::size_t max_hosts) {
  std::vector<Entry> entries;
  try {
    entries = parse_list(list);
  } catch (const ListProblem& p) {
    throw InvalidArgument("host list", shown(list) + ": " + p.message);
  }
  // Counted before anything is expanded, saturating at max_hosts + 1.
  const std::uint64_t limit =
      max_hosts >= std::uint64_t{1} << 62 ? std::uint64_t{1} << 62 : std::uint64_t{max_hosts} + 1;
  auto times = [limit](std::uint64_t a, std::uint64_t b) {
    if (b != 0 && a > limit / b) return limit;
    return std::min(a * b, limit);
  };
  std::uint64_t total = 0;
  for (const auto& entry : entries) {
    std::uint64_t n = 1;
    for (const auto& group : entry.groups) n = times(n, group.size());
    total = std::min(total + n, limit);
    if (total > max_hosts) {
      throw InvalidArgument(
          "host list", shown(list) + " names more than " + std::to_string(max_hosts) + " hosts");
    }
  }
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<std::size_t>(total));
  for (const auto& entry : entries) {
    const std::size_t k = entry.groups.size();
    if (k == 0) {
      hosts.push_back(entry.texts[0]);
      continue;
    }
    const std::vector<std::size_t> order = loop_order(k);
    std::vector<std::uint64_t> index(k, 0);
    for (;;) {
      hosts.push_back(host_at(entry, index));
      // Odometer: the innermost loop turns fastest.
      std::size_t level = k;
      while (level-- > 0) {
        const std::size_t g = order[level];
        if (++index[g] < entry.groups[g].size()) break;
        index[g] = 0;
      }
      if (level == static_cast<std::size_t>(-1)) break;
    }
  }
  return hosts;
}

std::string first_host(std::string_view list) {
  try {
    return host_at_start(parse_list(list));
  } catch (const ListProblem& p) {
    throw InvalidArgument("host list", shown(list) + ": " + p.message);
  }
}

int count_for_node(std::string_view value, int node) {
  const std::vector<CountEntry> counts = parse_counts(value);
  if (node < 0) throw InvalidArgument("count", "negative node index");
  // A plain count alone is every node's.
  if (counts.size() == 1 && !counts[0].repeated) return counts[0].count;
  long long seen = 0;
  for (const auto& entry : counts) {
    if (node < seen + entry.repeat) return entry.count;
    seen += entry.repeat;
  }
  throw InvalidArgument("count", "no entry for node " + std::to_string(node) + " (" +
                                     std::to_string(seen) + (seen == 1 ? " node" : " nodes") +
                                     " listed)");
}

EnvLookup process_environment() {
  return [](const std::string& name) { return env::get(name.c_str()); };
}

SlurmEnvironment::SlurmEnvironment(EnvLookup lookup) : lookup_(std::move(lookup)) {}

std::optional<std::string> SlurmEnvironment::get(const std::string& name) const {
  auto value = lookup_(name);
  if (value && value->empty()) return std::nullopt;
  return value;
}

bool SlurmEnvironment::in_job() const { return get("SLURM_JOB_ID").has_value(); }

bool SlurmEnvironment::in_step() const { return get("SLURM_STEP_ID").has_value(); }

std::string SlurmEnvironment::job_id() const {
  auto id = get("SLURM_JOB_ID");
  if (!id) throw InvalidArgument("SLURM_JOB_ID", "is not set (not in a SLURM job)");
  if (!is_digits(*id) || id->size() > 18 || to_number(*id) == 0) {
    bad_variable("SLURM_JOB_ID", *id, "is not a positive integer (a SLURM job id)");
  }
  return *id;
}

std::uint16_t SlurmEnvironment::store_port() const {
  return static_cast<std::uint16_t>(20000 + to_number(job_id()) % 10000);
}

SlurmEnvironment::Count SlurmEnvironment::num_nodes() const {
  for (const char* name : {"SLURM_NNODES", "SLURM_JOB_NUM_NODES"}) {
    if (auto text = get(name)) {
      auto n = small_number(*text);
      if (!n || *n < 1)
        bad_variable(name, *text, "is not a positive integer (the number of nodes)");
      return {*n, name};
    }
  }
  throw InvalidArgument("SLURM_NNODES",
                        "is not set, nor SLURM_JOB_NUM_NODES (the number of nodes)");
}

SlurmEnvironment::Count SlurmEnvironment::node_id() const {
  if (auto text = get("SLURM_NODEID")) {
    auto n = small_number(*text);
    if (!n)
      bad_variable("SLURM_NODEID", *text, "is not a non-negative integer (this node's index)");
    return {*n, "SLURM_NODEID"};
  }
  const Count nodes = num_nodes();
  if (nodes.value == 1) return {0, nodes.variable};
  throw InvalidArgument("SLURM_NODEID", "is not set in a job of " + std::to_string(nodes.value) +
                                            " nodes (" + nodes.variable +
                                            "): start ddprun with srun");
}

SlurmEnvironment::HostList SlurmEnvironment::node_list() const {
  const bool step = in_step();
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (!step && std::string_view(name) == "SLURM_STEP_NODELIST") continue;
    if (auto value = get(name)) return {*value, name};
  }
  throw InvalidArgument("SLURM_JOB_NODELIST", "is not set, nor SLURM_NODELIST (the job's hosts)");
}

std::string SlurmEnvironment::master_host() const {
  const HostList list = node_list();
  try {
    return host_at_start(parse_list(list.value));
  } catch (const ListProblem& p) {
    bad_variable(list.variable, list.value, "is not a valid host list: " + p.message);
  }
}

std::optional<SlurmEnvironment::Count> SlurmEnvironment::workers_per_node() const {
  if (auto gpus = get("SLURM_GPUS_ON_NODE")) {
    auto n = small_number(*gpus);
    if (!n)
      bad_variable("SLURM_GPUS_ON_NODE", *gpus,
                   "is not a non-negative integer (GPUs on this node)");
    if (*n > 0) return Count{*n, "SLURM_GPUS_ON_NODE"};
  }
  if (auto tasks = get("SLURM_NTASKS_PER_NODE")) {
    std::vector<CountEntry> counts;
    try {
      counts = parse_counts(*tasks);
    } catch (const InvalidArgument& e) {
      bad_tasks_per_node(*tasks, e);
    }
    // One count for every node, or SLURM's per-node form, read for this node.
    const bool per_node = counts.size() > 1 || counts[0].repeated;
    const int node = per_node ? node_id().value : 0;
    try {
      return Count{count_for_node(*tasks, node), "SLURM_NTASKS_PER_NODE"};
    } catch (const InvalidArgument& e) {
      bad_tasks_per_node(*tasks, e);
    }
  }
  return std::nullopt;
}

void fill_from_slurm(const SlurmEnvironment& slurm,
                     const std::function<bool(const std::string& name)>& given, RawOptions& raw,
                     std::map<std::string, std::string>& from_slurm) {
  if (!slurm.in_job() || given("standalone") || given("rdzv_endpoint")) return;
  const RendezvousBackend* backend = find_rendezvous_backend(raw.rdzv_backend);
  // An unknown backend and etcd without an endpoint are refused later.
  if (backend == nullptr || backend->store_at == RendezvousBackend::StoreAt::kEtcd) return;
  // Reads one thing from SLURM; a bad value names the variable and the flag
  // that would override it.
  auto read = [](const std::string& flag, auto reader) {
    try {
      return reader();
    } catch (const InvalidArgument& e) {
      fail(std::string(e.what()) + "; " + flag + " overrides it");
    }
  };
  if (!given("nnodes")) {
    const auto nodes = read("--nnodes", [&] { return slurm.num_nodes(); });
    raw.nnodes = std::to_string(nodes.value);
    from_slurm["nnodes"] = nodes.variable;
    // In the batch script (or a salloc shell) only one node would join:
    // the others never start, and node 0 would wait for them.
    if (nodes.value > 1 && !given("node_rank") && !slurm.in_step()) {
      fail("this SLURM job has " + std::to_string(nodes.value) + " nodes (" + nodes.variable + "=" +
           raw.nnodes +
           ") but ddprun runs outside a job step (SLURM_STEP_ID is not "
           "set, as in the batch script itself): start one ddprun per node with srun "
           "(`srun --ntasks=$SLURM_JOB_NUM_NODES ddprun ...`), or give --nnodes and "
           "--node_rank");
    }
  }
  if (!given("node_rank")) {
    const auto id = read("--node_rank", [&] { return slurm.node_id(); });
    raw.node_rank = std::to_string(id.value);
    from_slurm["node_rank"] = id.variable;
  }
  if (!given("rdzv_id")) {
    raw.rdzv_id = read("--rdzv_id", [&] { return slurm.job_id(); });
    from_slurm["rdzv_id"] = "SLURM_JOB_ID";
  }
  if (!given("master_addr")) {
    raw.master_addr = read("--master_addr", [&] { return slurm.master_host(); });
    from_slurm["master_addr"] = "the first host of " + slurm.node_list().variable;
  }
  if (!given("master_port")) {
    raw.master_port = std::to_string(read("--master_port", [&] { return slurm.store_port(); }));
    from_slurm["master_port"] = "20000 + SLURM_JOB_ID mod 10000";
  }
  if (backend->store_at == RendezvousBackend::StoreAt::kEndpoint) {
    raw.rdzv_endpoint = join_endpoint(raw.master_addr, raw.master_port);
    auto source = [&](const std::string& name) {
      auto it = from_slurm.find(name);
      return it != from_slurm.end() ? it->second : "--" + name;
    };
    from_slurm["rdzv_endpoint"] = source("master_addr") + " and " + source("master_port");
  }
  if (!given("nproc_per_node")) {
    if (auto workers = read("--nproc_per_node", [&] { return slurm.workers_per_node(); })) {
      raw.nproc_per_node = std::to_string(workers->value);
      from_slurm["nproc_per_node"] = workers->variable;
    }
  }
}

}  // namespace ddp::launcher
