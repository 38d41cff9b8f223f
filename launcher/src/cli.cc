// ddprun's command line: torchrun's options with both spellings and PET_<NAME>
// fallbacks. CLI11 does the tokenizing; every value is read as text and
// validated here so that each mistake gets one line naming the option.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include <CLI/CLI.hpp>

#include "ddp/agent/process_launcher.h"
#include "ddp/common/env.h"
#include "ddp/common/error.h"
#include "ddp/launcher/launch_config.h"
#include "ddp/launcher/slurm.h"
#include "ddp/rendezvous/backends.h"

namespace ddp::launcher {
namespace {

constexpr const char* kVersion = "ddprun 0.1.0 (torchrun-compatible launcher)";

// A bad value: the message is printed as "ddprun: error: <message>".
struct UsageError {
  std::string message;
};

[[noreturn]] void fail(const std::string& message) { throw UsageError{message}; }

bool is_int(const std::string& text) {
  if (text.empty()) return false;
  std::size_t start = text[0] == '-' || text[0] == '+' ? 1 : 0;
  return start < text.size() && std::all_of(text.begin() + static_cast<long>(start), text.end(),
                                            [](unsigned char c) { return std::isdigit(c); });
}

long long parse_int_in(const std::string& text, long long lo, long long hi, const std::string& what,
                       const std::string& expected) {
  if (!is_int(text) || text.size() > 18)
    fail(what + ": expected " + expected + ", got '" + text + "'");
  long long value = std::stoll(text);
  if (value < lo || value > hi) fail(what + ": expected " + expected + ", got '" + text + "'");
  return value;
}

std::chrono::milliseconds parse_secs(const std::string& text, const std::string& what) {
  try {
    return env::parse_seconds(text, what);
  } catch (const Error&) {
    fail(what + ": expected a non-negative number of seconds, got '" + text + "'");
  }
}

int count_gpus() {
  // No CUDA runtime in the launcher: count the device nodes (respecting
  // CUDA_VISIBLE_DEVICES like the runtime would).
  if (auto visible = env::get("CUDA_VISIBLE_DEVICES")) {
    if (visible->empty()) return 0;
    return static_cast<int>(std::count(visible->begin(), visible->end(), ',')) + 1;
  }
  int n = 0;
  for (int i = 0; i < 64; ++i) {
    if (::access(("/dev/nvidia" + std::to_string(i)).c_str(), F_OK) == 0) ++n;
  }
  return n;
}

int count_cpus() {
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

agent::StdSetting parse_std(const std::string& text, const std::string& what) {
  static const std::regex kValue("^[0-3]$");
  static const std::regex kMapping("^[0-9]+:[0-3](,[0-9]+:[0-3])*$");
  agent::StdSetting setting;
  if (std::regex_match(text, kValue)) {
    setting.all = static_cast<agent::Std>(text[0] - '0');
    return setting;
  }
  if (!std::regex_match(text, kMapping) || text.size() > 4096) {
    fail(what +
         ": expected 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a mapping like "
         "0:1,1:3, got '" +
         text + "'");
  }
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    auto colon = item.find(':');
    int rank = static_cast<int>(parse_int_in(item.substr(0, colon), 0, 1 << 20, what,
                                             "local ranks in a mapping like 0:1,1:3"));
    setting.per_rank[rank] = static_cast<agent::Std>(item[colon + 1] - '0');
  }
  return setting;
}

int parse_signal(std::string name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (upper.rfind("SIG", 0) != 0) upper = "SIG" + upper;
  static const std::pair<const char*, int> kSignals[] = {
      {"SIGINT", SIGINT},   {"SIGTERM", SIGTERM}, {"SIGHUP", SIGHUP},
      {"SIGQUIT", SIGQUIT}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}};
  for (const auto& [n, signo] : kSignals) {
    if (upper == n) return signo;
  }
  fail("--signals_to_handle: unknown or unsupported signal '" + name +
       "' (supported: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2)");
}

// "host", "host:port", "[v6]:port"; port 0 only where `allow_zero`.
std::pair<std::string, std::uint16_t> parse_endpoint(const std::string& text,
                                                     std::uint16_t default_port,
                                                     const std::string& what) {
  std::string host = text;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    auto close = text.find(']');
    if (close == std::string::npos) fail(what + ": expected host[:port], got '" + text + "'");
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') fail(what + ": expected host[:port], got '" + text + "'");
      port = text.substr(close + 2);
    }
  } else if (auto colon = text.rfind(':'); colon != std::string::npos && text.find(':') == colon) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty() || host.find_first_of(" \t/") != std::string::npos) {
    fail(what + ": expected host[:port], got '" + text + "'");
  }
  std::uint16_t number = default_port;
  if (!port.empty() || text.back() == ':') {
    number = static_cast<std::uint16_t>(
        parse_int_in(port, 0, 65535, what, "host[:port] with a port in 0..65535"));
  }
  return {host, number};
}

std::string hostname() {
  char buffer[256] = {};
  if (::gethostname(buffer, sizeof(buffer) - 1) != 0) return "localhost";
  return buffer;
}

struct Raw {
  std::string nnodes = "1:1";
  std::string nproc_per_node = "1";
  bool standalone = false;
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string rdzv_id = "none";
  std::string rdzv_conf;
  std::string node_rank = "0";
  std::string master_addr = "127.0.0.1";
  std::string master_port = "29500";
  std::string local_addr;
  std::string max_restarts = "0";
  std::string monitor_interval = "5";
  std::string start_method = "spawn";
  std::string role = "default";
  bool no_python = false;
  bool module = false;
  bool run_path = false;
  std::string log_dir;
  std::string redirects = "0";
  std::string tee = "0";
  std::string local_ranks_filter;
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::string exit_barrier_timeout = "300";
  std::string stop_grace = "30";
};

const char* kDescription =
    "Torch Distributed Elastic Training Launcher, in C++ (torchrun-compatible).\n\n"
    "Runs `program` on this node as --nproc_per_node worker processes with the environment\n"
    "torchrun gives (LOCAL_RANK, RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), restarts\n"
    "the whole job up to --max_restarts times when a worker fails, and reports failures in\n"
    "torchrun's format. A program ending in .py (or -m module) runs as `python3 -u` (the\n"
    "python3 first on PATH, or $PYTHON_EXEC); any other program is executed directly.\n"
    "Every --under_score option also has a --dash-spelling and falls back to the environment\n"
    "variable PET_<NAME> (e.g. PET_NPROC_PER_NODE).\n\n"
    "In a SLURM job (SLURM_JOB_ID set), without --standalone and --rdzv_endpoint, options that\n"
    "are neither given nor in PET_<NAME> come from the job: --nnodes from SLURM_NNODES,\n"
    "--node_rank from SLURM_NODEID, --rdzv_id from SLURM_JOB_ID, --master_addr from the first\n"
    "host of SLURM_STEP_NODELIST (srun's; else SLURM_JOB_NODELIST), --master_port =\n"
    "20000 + SLURM_JOB_ID mod 10000 (with --rdzv_backend=c10d the endpoint is that address\n"
    "and port), --nproc_per_node from SLURM_GPUS_ON_NODE or else SLURM_NTASKS_PER_NODE.\n"
    "Start one ddprun per node: srun --ntasks=$SLURM_JOB_NUM_NODES ddprun ...";

// torchrun's (argparse's) layout: usage line first, then the description.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_description(const CLI::App*) const override { return ""; }
  std::string make_usage(const CLI::App*, std::string) const override {
    return std::string("usage: ddprun [options] program [args...]\n\n") + kDescription + "\n";
  }
};

class Parser {
 public:
  Parser() : app_(kDescription, "ddprun") {
    app_.formatter(std::make_shared<HelpFormatter>());
    app_.prefix_command();
    app_.set_version_flag("--version", kVersion);
    app_.footer(
        "positional arguments:\n"
        "  program                     The program (a .py script, a module with -m, or any "
        "executable\n"
        "                              with --no_python) followed by its arguments; ${local_rank} "
        "in an\n"
        "                              argument becomes each worker's local rank.\n"
        "  args...                     Arguments of the program.\n\n"
        "examples:\n"
        "  ddprun --standalone --nproc_per_node=4 train.py --epochs 3\n"
        "  ddprun --nnodes=2 --node_rank=0 --master_addr=10.0.0.1 --nproc_per_node=8 train.py\n"
        "  ddprun --nnodes=1:4 --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29400 "
        "--rdzv_id=job42 train.py\n"
        "  ddprun --standalone --nproc_per_node=2 --no_python ./my_binary --rank-file "
        "out_${local_rank}.txt");
    add("nnodes", raw_.nnodes,
        "Number of nodes, or the range of nodes in form <minimum_nodes>:<maximum_nodes>.");
    add("nproc_per_node", raw_.nproc_per_node,
        "Number of workers per node; supported values: [auto, cpu, gpu, int].");
    flag("standalone", raw_.standalone,
         "Start a local standalone rendezvous backend (an embedded store on a free port); "
         "useful for single-node, multi-worker jobs. Sets --rdzv_backend, --rdzv_endpoint and "
         "--rdzv_id automatically.");
    add("rdzv_backend", raw_.rdzv_backend,
        "Rendezvous backend: static (default; fixed nodes, given ranks) or c10d (elastic: --nnodes "
        "MIN:MAX).");
    add("rdzv_endpoint", raw_.rdzv_endpoint,
        "Rendezvous backend endpoint; usually in form <host>:<port> (c10d default port 29400).");
    add("rdzv_id", raw_.rdzv_id, "User-defined group id (the job's run id).");
    add("rdzv_conf", raw_.rdzv_conf,
        "Additional rendezvous configuration (<key1>=<value1>,<key2>=<value2>,...): join_timeout, "
        "last_call_timeout, close_timeout, heartbeat_timeout, keep_alive_interval, read_timeout "
        "(seconds), keep_alive_max_attempt, is_host.");
    add("node_rank", raw_.node_rank,
        "Rank of the node for multi-node distributed training (static backend; orders the group "
        "ranks with c10d when given).");
    add("master_addr", raw_.master_addr,
        "Address of the master node (rank 0) for the static backend: the agents' store lives "
        "there.");
    add("master_port", raw_.master_port, "Port on the master node for the static backend's store.");
    add("local_addr", raw_.local_addr,
        "Address of the local node, as other nodes reach it. Default: this host's name.");
    add("max_restarts", raw_.max_restarts,
        "Maximum number of worker group restarts before failing.");
    add("monitor_interval", raw_.monitor_interval,
        "Accepted for torchrun compatibility; ddprun notices worker exits at once (no polling).");
    add("start_method", raw_.start_method,
        "Accepted for torchrun compatibility (spawn, fork, forkserver); workers are always "
        "exec'd.");
    add("role", raw_.role, "User-defined role for the workers (ROLE_NAME).");
    flag("no_python", raw_.no_python, "Execute the program directly instead of through python3.");
    app_.add_flag("-m,--module", raw_.module,
                  "Change each process to interpret the launch script as a Python module "
                  "(python3 -u -m program).")
        ->envname("PET_MODULE");
    flag("run_path", raw_.run_path,
         "Accepted for torchrun compatibility (the program runs as a script either way).");
    add("log_dir", raw_.log_dir,
        "Base directory for log files: "
        "<log_dir>/<run_id>/attempt_<n>/<local_rank>/{stdout,stderr}.log and error.json.");
    app_.add_option("-r,--redirects", raw_.redirects,
                    "Redirect std streams into a log file in the log directory (0 none, 1 stdout, "
                    "2 stderr, 3 both; or per local rank, e.g. 0:1,1:2).")
        ->envname("PET_REDIRECTS")
        ->default_str("0")
        ->type_name("REDIRECTS");
    app_.add_option("-t,--tee", raw_.tee,
                    "Tee std streams into a log file and also to the console (same values as -r).")
        ->envname("PET_TEE")
        ->default_str("0")
        ->type_name("TEE");
    add("local_ranks_filter", raw_.local_ranks_filter,
        "Only show logs from these local ranks on the console (e.g. 0,1,2).");
    add("signals_to_handle", raw_.signals_to_handle,
        "Signals forwarded to the workers (SIGINT, SIGTERM, SIGHUP, SIGQUIT always; "
        "SIGUSR1/SIGUSR2 when named).");
    add("exit_barrier_timeout", raw_.exit_barrier_timeout,
        "Seconds an agent whose workers succeeded waits for the other agents.");
    add("stop_grace", raw_.stop_grace,
        "Seconds between SIGTERM and SIGKILL when stopping workers.");
  }

  ParseResult parse(int argc, const char* const* argv) {
    ParseResult result;
    for (int i = 1; i < argc; ++i) args_.emplace_back(argv[i]);
    try {
      try {
        app_.parse(argc, argv);
      } catch (const CLI::CallForHelp&) {
        result.output = app_.help();
        return result;
      } catch (const CLI::CallForAllHelp&) {
        result.output = app_.help();
        return result;
      } catch (const CLI::CallForVersion&) {
        result.output = std::string(kVersion) + "\n";
        return result;
      } catch (const CLI::ParseError& e) {
        fail(one_line(e));
      }
      result.config = validate();
    } catch (const UsageError& e) {
      result.output = "ddprun: error: " + e.message + " (see ddprun --help)\n";
      result.exit_code = 2;
    }
    return result;
  }

 private:
  void add(const std::string& name, std::string& value, const std::string& help) {
    std::string metavar = env_name(name).substr(4);  // argparse's NPROC_PER_NODE style
    app_.add_option(names(name), value, help)
        ->envname(env_name(name))
        ->default_str(value)
        ->type_name(metavar);
  }
  void flag(const std::string& name, bool& value, const std::string& help) {
    app_.add_flag(names(name), value, help)->envname(env_name(name));
  }
  static std::string names(const std::string& name) {
    std::string dashed = name;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    return dashed == name ? "--" + name : "--" + name + ",--" + dashed;
  }
  static std::string env_name(const std::string& name) {
    std::string upper = name;
    std::transform(upper.begin(), upper.end(), upper.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    return "PET_" + upper;
  }

  // "--nproc_per_node" or "--nproc_per_node (from PET_NPROC_PER_NODE)" when the
  // value came from the environment.
  std::string what(const std::string& name) const {
    std::string dashed = name;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    for (const auto& arg : args_) {
      if (arg == "--") break;
      for (const std::string& spelled : {"--" + name, "--" + dashed}) {
        if (arg == spelled || arg.rfind(spelled + "=", 0) == 0) return "--" + name;
      }
    }
    if (auto it = from_slurm_.find(name); it != from_slurm_.end()) {
      return "--" + name + " (from " + it->second + ")";
    }
    return env::get(env_name(name).c_str()) ? "--" + name + " (from " + env_name(name) + ")"
                                            : "--" + name;
  }

  // Whether the option was given, on the command line or as PET_<NAME>.
  bool given(const std::string& name) const { return app_.get_option("--" + name)->count() > 0; }

  // Under SLURM (SLURM_JOB_ID set), without --standalone and --rdzv_endpoint:
  // every option of the job's shape that was not given comes from the job's
  // environment (see slurm.h for the variables). Only the variables that are
  // used are read, so a flag always wins, even over a malformed variable.
  void apply_slurm() {
    SlurmEnvironment slurm;
    if (!slurm.in_job() || given("standalone") || given("rdzv_endpoint")) return;
    const RendezvousBackend* backend = find_rendezvous_backend(raw_.rdzv_backend);
    // An unknown backend and etcd without an endpoint are refused below.
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
      raw_.nnodes = std::to_string(nodes.value);
      from_slurm_["nnodes"] = nodes.variable;
      // In the batch script (or a salloc shell) only one node would join:
      // the others never start, and node 0 would wait for them.
      if (nodes.value > 1 && !given("node_rank") && !slurm.in_step()) {
        fail("this SLURM job has " + std::to_string(nodes.value) + " nodes (" + nodes.variable +
             "=" + raw_.nnodes +
             ") but ddprun runs outside a job step (SLURM_STEP_ID is not "
             "set, as in the batch script itself): start one ddprun per node with srun "
             "(`srun --ntasks=$SLURM_JOB_NUM_NODES ddprun ...`), or give --nnodes and "
             "--node_rank");
      }
    }
    if (!given("node_rank")) {
      const auto id = read("--node_rank", [&] { return slurm.node_id(); });
      raw_.node_rank = std::to_string(id.value);
      from_slurm_["node_rank"] = id.variable;
    }
    if (!given("rdzv_id")) {
      raw_.rdzv_id = read("--rdzv_id", [&] { return slurm.job_id(); });
      from_slurm_["rdzv_id"] = "SLURM_JOB_ID";
    }
    if (!given("master_addr")) {
      raw_.master_addr = read("--master_addr", [&] { return slurm.master_host(); });
      from_slurm_["master_addr"] = "the first host of " + slurm.node_list().variable;
    }
    if (!given("master_port")) {
      raw_.master_port = std::to_string(read("--master_port", [&] { return slurm.store_port(); }));
      from_slurm_["master_port"] = "20000 + SLURM_JOB_ID mod 10000";
    }
    if (backend->store_at == RendezvousBackend::StoreAt::kEndpoint) {
      const std::string& host = raw_.master_addr;
      raw_.rdzv_endpoint =
          (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + raw_.master_port;
      auto source = [&](const std::string& name) {
        auto it = from_slurm_.find(name);
        return it != from_slurm_.end() ? it->second : "--" + name;
      };
      from_slurm_["rdzv_endpoint"] = source("master_addr") + " and " + source("master_port");
    }
    if (!given("nproc_per_node")) {
      if (auto workers = read("--nproc_per_node", [&] { return slurm.workers_per_node(); })) {
        raw_.nproc_per_node = std::to_string(workers->value);
        from_slurm_["nproc_per_node"] = workers->variable;
      }
    }
  }

  static std::string one_line(const CLI::ParseError& e) {
    std::string text = e.what();
    std::replace(text.begin(), text.end(), '\n', ' ');
    const std::string name = e.get_name();
    if (name == "ArgumentMismatch") {
      auto colon = text.find(':');
      return "option " + text.substr(0, colon) + " needs a value";
    }
    return text;
  }

  LaunchConfig validate() {
    LaunchConfig c;
    // The program: what CLI11 left over, after an optional "--".
    std::vector<std::string> rest = app_.remaining();
    if (!rest.empty() && rest[0] == "--") rest.erase(rest.begin());
    if (rest.empty())
      fail("missing the program to run (usage: ddprun [options] program [args...])");
    if (rest[0].size() > 1 && rest[0][0] == '-') {
      fail("unrecognized option '" + rest[0] + "'");
    }
    c.program = rest[0];
    c.program_args.assign(rest.begin() + 1, rest.end());
    apply_slurm();
    c.from_slurm = from_slurm_;

    // --nnodes
    {
      static const std::regex kNodes("^([0-9]+)(:([0-9]+))?$");
      std::smatch m;
      if (!std::regex_match(raw_.nnodes, m, kNodes) || raw_.nnodes.size() > 12) {
        fail(what("nnodes") + ": expected N or MIN:MAX, got '" + raw_.nnodes + "'");
      }
      c.min_nodes = std::stoi(m[1]);
      c.max_nodes = m[3].matched ? std::stoi(m[3]) : c.min_nodes;
      if (c.min_nodes < 1 || c.max_nodes < c.min_nodes) {
        fail(what("nnodes") + ": expected 0 < MIN <= MAX, got '" + raw_.nnodes + "'");
      }
    }
    // --nproc_per_node
    if (raw_.nproc_per_node == "cpu") {
      c.nproc_per_node = count_cpus();
    } else if (raw_.nproc_per_node == "gpu") {
      c.nproc_per_node = count_gpus();
      if (c.nproc_per_node == 0) fail(what("nproc_per_node") + "=gpu: no CUDA device found");
    } else if (raw_.nproc_per_node == "auto") {
      c.nproc_per_node = count_gpus();
      if (c.nproc_per_node == 0) c.nproc_per_node = count_cpus();
    } else {
      c.nproc_per_node =
          static_cast<int>(parse_int_in(raw_.nproc_per_node, 1, 4096, what("nproc_per_node"),
                                        "a positive integer (at most 4096), cpu, gpu or auto"));
    }
    // Rendezvous.
    c.standalone = raw_.standalone;
    c.rdzv_id = raw_.rdzv_id;
    // The id names a directory under --log_dir: "." or ".." would leave it.
    if (c.rdzv_id.empty() || c.rdzv_id == "." || c.rdzv_id == ".." ||
        c.rdzv_id.find_first_of("/ \t\n") != std::string::npos) {
      fail(what("rdzv_id") +
           ": expected a non-empty id without '/' or spaces (and not '.' or '..'), got '" +
           c.rdzv_id + "'");
    }
    c.master_addr = raw_.master_addr;
    if (c.master_addr.empty()) fail(what("master_addr") + ": must not be empty");
    c.master_port = static_cast<std::uint16_t>(
        parse_int_in(raw_.master_port, 1, 65535, what("master_port"), "a port in 1..65535"));
    c.rdzv_backend = raw_.rdzv_backend;
    if (c.rdzv_backend == "etcd-v2") {
      fail(what("rdzv_backend") +
           "=etcd-v2: etcd's v2 API is not supported (etcd 3.4 disables it, "
           "3.6 removed it); --rdzv_backend=etcd speaks etcd's v3 API");
    }
    const RendezvousBackend* backend = find_rendezvous_backend(c.rdzv_backend);
    if (backend == nullptr) {
      fail(what("rdzv_backend") + ": expected " + rendezvous_backend_names() + ", got '" +
           c.rdzv_backend + "'");
    }
    parse_rdzv_conf(c);
    if (c.standalone) {
      if (c.max_nodes != 1) {
        fail("--standalone runs a single node, but --nnodes is '" + raw_.nnodes + "'");
      }
      c.rdzv_backend = "c10d";
      backend = find_rendezvous_backend(c.rdzv_backend);
      c.rdzv_host = "127.0.0.1";
      c.rdzv_port = 0;
      c.rdzv_id = random_id();
    } else if (backend->store_at == RendezvousBackend::StoreAt::kEtcd) {
      if (raw_.rdzv_endpoint.empty()) {
        fail(
            "--rdzv_backend=etcd needs --rdzv_endpoint host[:port][,host[:port]...] (etcd's "
            "client URLs; default port 2379)");
      }
      std::istringstream in(raw_.rdzv_endpoint);
      for (std::string item; std::getline(in, item, ',');) {
        auto [host, port] = parse_endpoint(item, backend->default_port, what("rdzv_endpoint"));
        if (c.rdzv_endpoints.empty()) {
          c.rdzv_host = host;
          c.rdzv_port = port;
        } else {
          c.rdzv_endpoints += ",";
        }
        c.rdzv_endpoints += (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                            std::to_string(port);
      }
      if (raw_.rdzv_endpoint.back() == ',') {
        fail(what("rdzv_endpoint") + ": trailing ',' in '" + raw_.rdzv_endpoint + "'");
      }
    } else if (!raw_.rdzv_endpoint.empty()) {
      const bool at_endpoint = backend->store_at == RendezvousBackend::StoreAt::kEndpoint;
      auto [host, port] =
          parse_endpoint(raw_.rdzv_endpoint, at_endpoint ? backend->default_port : c.master_port,
                         what("rdzv_endpoint"));
      c.rdzv_host = host;
      c.rdzv_port = port;
    } else if (backend->store_at == RendezvousBackend::StoreAt::kEndpoint) {
      fail("--rdzv_backend=" + c.rdzv_backend + " needs --rdzv_endpoint host[:port]");
    } else {
      c.rdzv_host = c.master_addr;
      c.rdzv_port = c.master_port;
    }
    if (backend->fixed_node_count && c.min_nodes != c.max_nodes) {
      fail(what("nnodes") + "=" + raw_.nnodes + ": the " + c.rdzv_backend +
           " backend needs a fixed number of nodes (use --rdzv_backend=c10d for a range)");
    }
    // SLURM's node ids order c10d's group ranks too.
    c.node_rank_given = given("node_rank") || from_slurm_.count("node_rank") > 0;
    c.node_rank = static_cast<int>(parse_int_in(
        raw_.node_rank, 0, c.max_nodes - 1, what("node_rank"),
        "an integer in [0, " + std::to_string(c.max_nodes) + ") (0 <= node_rank < nnodes)"));
    c.local_addr = raw_.local_addr;
    if (c.local_addr.empty()) {
      const bool loopback =
          c.rdzv_host == "127.0.0.1" || c.rdzv_host == "localhost" || c.rdzv_host == "::1";
      // All agents on this machine (a loopback store): loopback is how they
      // reach each other. Static node 0 is reached where the store is.
      c.local_addr =
          (c.standalone || loopback) ? "127.0.0.1"
          : (backend->store_at == RendezvousBackend::StoreAt::kNodeRankZero && c.node_rank == 0)
              ? c.master_addr
              : hostname();
    }
    c.max_restarts = static_cast<int>(parse_int_in(raw_.max_restarts, 0, 1000000,
                                                   what("max_restarts"), "a non-negative integer"));
    {
      char* end = nullptr;
      c.monitor_interval = std::strtod(raw_.monitor_interval.c_str(), &end);
      if (raw_.monitor_interval.empty() || *end != '\0' || !(c.monitor_interval > 0) ||
          c.monitor_interval > 1e6) {
        fail(what("monitor_interval") + ": expected a positive number of seconds, got '" +
             raw_.monitor_interval + "'");
      }
    }
    if (raw_.start_method != "spawn" && raw_.start_method != "fork" &&
        raw_.start_method != "forkserver") {
      fail(what("start_method") + ": expected spawn, fork or forkserver, got '" +
           raw_.start_method + "'");
    }
    c.role = raw_.role;
    if (c.role.empty()) fail(what("role") + ": must not be empty");
    c.no_python = raw_.no_python;
    c.module = raw_.module;
    if (c.no_python && c.module) fail("--no_python and -m/--module cannot be used together");
    c.log_dir = raw_.log_dir;
    c.redirects = parse_std(raw_.redirects, "-r/--redirects");
    c.tee = parse_std(raw_.tee, "-t/--tee");
    for (const auto* setting : {&c.redirects, &c.tee}) {
      for (const auto& [rank, value] : setting->per_rank) {
        if (rank >= c.nproc_per_node) {
          fail(std::string(setting == &c.redirects ? "-r/--redirects" : "-t/--tee") +
               ": local rank " + std::to_string(rank) +
               " does not exist (--nproc_per_node=" + std::to_string(c.nproc_per_node) + ")");
        }
      }
    }
    if (!raw_.local_ranks_filter.empty()) {
      std::istringstream in(raw_.local_ranks_filter);
      for (std::string item; std::getline(in, item, ',');) {
        c.local_ranks_filter.insert(static_cast<int>(parse_int_in(
            item, 0, c.nproc_per_node - 1, what("local_ranks_filter"),
            "comma-separated local ranks in [0, " + std::to_string(c.nproc_per_node) + ")")));
      }
      if (raw_.local_ranks_filter.back() == ',') {
        fail(what("local_ranks_filter") + ": trailing ',' in '" + raw_.local_ranks_filter + "'");
      }
    }
    c.signals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    {
      std::istringstream in(raw_.signals_to_handle);
      for (std::string item; std::getline(in, item, ',');) {
        item.erase(0, item.find_first_not_of(' '));
        item.erase(item.find_last_not_of(' ') + 1);
        int signo = parse_signal(item);
        if (std::find(c.signals.begin(), c.signals.end(), signo) == c.signals.end()) {
          c.signals.push_back(signo);
        }
      }
    }
    c.exit_barrier_timeout = parse_secs(raw_.exit_barrier_timeout, what("exit_barrier_timeout"));
    c.stop_grace = parse_secs(raw_.stop_grace, what("stop_grace"));
    resolve_command(c);
    return c;
  }

  void parse_rdzv_conf(LaunchConfig& c) {
    if (raw_.rdzv_conf.empty()) return;
    std::istringstream in(raw_.rdzv_conf);
    for (std::string item; std::getline(in, item, ',');) {
      auto eq = item.find('=');
      if (eq == std::string::npos || eq == 0) {
        fail(what("rdzv_conf") + ": expected key=value[,key=value...], got '" + raw_.rdzv_conf +
             "'");
      }
      c.rdzv_conf[item.substr(0, eq)] = item.substr(eq + 1);
    }
    if (auto it = c.rdzv_conf.find("join_timeout"); it != c.rdzv_conf.end()) {
      c.join_timeout = parse_secs(it->second, what("rdzv_conf") + " join_timeout");
    }
    for (const auto& [key, value] : c.rdzv_conf) {
      const std::string name = what("rdzv_conf") + " " + key;
      if (key == "join_timeout") {
        c.join_timeout = parse_secs(value, name);
      } else if (key == "last_call_timeout") {
        c.last_call_timeout = parse_secs(value, name);
      } else if (key == "close_timeout") {
        c.close_timeout = parse_secs(value, name);
      } else if (key == "heartbeat_timeout") {
        c.keep_alive_write_timeout = positive_secs(value, name);
      } else if (key == "keep_alive_interval") {
        c.keep_alive_interval = positive_secs(value, name);
      } else if (key == "keep_alive_max_attempt") {
        c.keep_alive_max_attempt =
            static_cast<int>(parse_int_in(value, 1, 1000000, name, "a positive integer"));
      } else if (key == "read_timeout") {
        c.read_timeout = positive_secs(value, name);
      } else if (key == "is_host") {
        if (value == "1" || value == "true" || value == "True") {
          c.is_host = true;
        } else if (value == "0" || value == "false" || value == "False") {
          c.is_host = false;
        } else {
          fail(name + ": expected true or false, got '" + value + "'");
        }
      } else if (parse_etcd_conf(c, key, value, name)) {
      } else {
        fail(what("rdzv_conf") + ": unknown key '" + key +
             "' (known: join_timeout, last_call_timeout, close_timeout, heartbeat_timeout, "
             "keep_alive_interval, keep_alive_max_attempt, read_timeout, is_host; for etcd: "
             "protocol, cacert, cert, key, username, password_file)");
      }
    }
  }

  // --rdzv_conf's keys for etcd; false when `key` is none of them.
  bool parse_etcd_conf(LaunchConfig& c, const std::string& key, const std::string& value,
                       const std::string& name) {
    static const std::set<std::string> keys = {"protocol", "cacert",   "cert",
                                               "key",      "username", "password_file"};
    if (keys.count(key) == 0) return false;
    if (c.rdzv_backend != "etcd") fail(name + ": only for --rdzv_backend=etcd");
    auto readable = [&](const std::string& path) {
      if (::access(path.c_str(), R_OK) != 0) fail(name + ": cannot read '" + path + "'");
      return path;
    };
    if (key == "protocol") {
      if (value != "http" && value != "https")
        fail(name + ": expected http or https, got '" + value + "'");
      c.etcd_tls = value == "https";
    } else if (key == "cacert") {
      c.etcd_ca_file = readable(value);
    } else if (key == "cert") {
      c.etcd_cert_file = readable(value);
    } else if (key == "key") {
      c.etcd_key_file = readable(value);
    } else if (key == "username") {
      if (value.empty()) fail(name + ": must not be empty");
      c.etcd_username = value;
    } else {  // password_file: the password is never on the command line
      std::ifstream in(readable(value));
      std::getline(in, c.etcd_password);
      // A file written on Windows (or by `echo` into a CRLF editor) ends its
      // line with "\r\n": the "\r" is not part of the password.
      if (!c.etcd_password.empty() && c.etcd_password.back() == '\r') c.etcd_password.pop_back();
      if (c.etcd_password.empty())
        fail(name + ": '" + value + "' holds no password on its first line");
    }
    return true;
  }

  // Seconds, whole or fractional, that must be more than zero.
  std::chrono::milliseconds positive_secs(const std::string& text, const std::string& name) {
    auto value = parse_secs(text, name);
    if (value.count() <= 0)
      fail(name + ": expected a positive number of seconds, got '" + text + "'");
    return value;
  }

  static std::string random_id() {
    std::random_device device;
    std::ostringstream out;
    out << std::hex << device() << device();
    return out.str();
  }

  // Sets c.command, and c.python for a Python program.
  static void resolve_command(LaunchConfig& c) {
    const std::string path = env::get_or("PATH", "/usr/local/bin:/usr/bin:/bin");
    std::vector<std::string> command;
    auto python = [&] {
      std::string exec = env::get_or("PYTHON_EXEC", "python3");
      std::string resolved = agent::resolve_program(exec, path);
      if (resolved.empty()) {
        fail("cannot run the Python program '" + c.program + "': '" + exec +
             "' not found on PATH (set PYTHON_EXEC or use --no_python)");
      }
      c.python = resolved;
      return resolved;
    };
    const bool is_python_file =
        c.program.size() > 3 && c.program.compare(c.program.size() - 3, 3, ".py") == 0;
    if (c.module) {
      command = {python(), "-u", "-m", c.program};
    } else if (!c.no_python && is_python_file) {
      if (!std::filesystem::is_regular_file(c.program)) {
        fail("program '" + c.program + "' not found");
      }
      command = {python(), "-u", c.program};
    } else {
      std::string resolved = agent::resolve_program(c.program, path);
      if (resolved.empty()) {
        if (!c.no_python && std::filesystem::is_regular_file(c.program)) {
          // Not executable: a Python script without the .py suffix, like torchrun runs it.
          command = {python(), "-u", c.program};
        } else {
          fail("program '" + c.program + "' not found or not executable" +
               (c.program.find('/') == std::string::npos ? " (searched PATH)" : ""));
        }
      } else {
        command = {resolved};
      }
    }
    command.insert(command.end(), c.program_args.begin(), c.program_args.end());
    c.command = std::move(command);
  }

  CLI::App app_;
  Raw raw_;
  std::vector<std::string> args_;
  // Option name -> where its value came from, for options SLURM filled in.
  std::map<std::string, std::string> from_slurm_;
};

}  // namespace

ParseResult parse_command_line(int argc, const char* const* argv) {
  Parser parser;
  return parser.parse(argc, argv);
}

}  // namespace ddp::launcher
