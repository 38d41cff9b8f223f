#include "resolve.h"

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <random>
#include <regex>
#include <sstream>
#include <tuple>

#include "command.h"
#include "ddp/rendezvous/backends.h"
#include "ddp/status_http/server.h"
#include "rdzv_conf.h"
#include "torch_flags.h"
#include "values.h"

namespace ddp::launcher {
namespace {

using StoreAt = RendezvousBackend::StoreAt;

class Resolver {
 public:
  Resolver(const RawOptions& raw, const OptionOrigins& origins, const HostFacts& host)
      : raw_(raw), origins_(origins), host_(host) {}

  LaunchConfig resolve(const std::vector<std::string>& program) {
    LaunchConfig c;
    c.program = program[0];
    c.program_args.assign(program.begin() + 1, program.end());
    c.from_slurm = origins_.from_slurm;
    resolve_sizes(c);
    resolve_rendezvous(c);
    resolve_agent(c);
    resolve_command(c, host_);
    return c;
  }

 private:
  int gpus() const {
    // CUDA_VISIBLE_DEVICES, when set, is what the CUDA runtime would see.
    if (auto visible = host_.env("CUDA_VISIBLE_DEVICES")) {
      if (visible->empty()) return 0;
      return static_cast<int>(std::count(visible->begin(), visible->end(), ',')) + 1;
    }
    return host_.gpu_device_nodes();
  }

  // --nnodes, --nproc_per_node.
  void resolve_sizes(LaunchConfig& c) {
    RendezvousParams& params = c.rendezvous.params;
    static const std::regex kNodes("^([0-9]+)(:([0-9]+))?$");
    std::smatch m;
    if (!std::regex_match(raw_.nnodes, m, kNodes) || raw_.nnodes.size() > 12) {
      fail(what("nnodes") + ": expected N or MIN:MAX, got '" + raw_.nnodes + "'");
    }
    params.min_nodes = std::stoi(m[1]);
    params.max_nodes = m[3].matched ? std::stoi(m[3]) : params.min_nodes;
    if (params.min_nodes < 1 || params.max_nodes < params.min_nodes) {
      fail(what("nnodes") + ": expected 0 < MIN <= MAX, got '" + raw_.nnodes + "'");
    }
    int& nproc = params.local_world_size;
    if (raw_.nproc_per_node == "cpu") {
      nproc = host_.online_cpus();
    } else if (raw_.nproc_per_node == "gpu") {
      nproc = gpus();
      if (nproc == 0) fail(what("nproc_per_node") + "=gpu: no CUDA device found");
    } else if (raw_.nproc_per_node == "auto") {
      nproc = gpus();
      if (nproc == 0) nproc = host_.online_cpus();
    } else {
      nproc = static_cast<int>(parse_int_in(raw_.nproc_per_node, 1, 4096, what("nproc_per_node"),
                                            "a positive integer (at most 4096), cpu, gpu or auto"));
    }
    c.agent.spec.local_world_size = nproc;
  }

  // The backend, the agents' store, --rdzv_conf, --node_rank, --local_addr.
  void resolve_rendezvous(LaunchConfig& c) {
    RendezvousConfig& r = c.rendezvous;
    RendezvousParams& params = r.params;
    c.standalone = raw_.standalone;
    params.run_id = raw_.rdzv_id;
    // The id names a directory under --log_dir: "." or ".." would leave it.
    if (params.run_id.empty() || params.run_id == "." || params.run_id == ".." ||
        params.run_id.find_first_of("/ \t\n") != std::string::npos) {
      fail(what("rdzv_id") +
           ": expected a non-empty id without '/' or spaces (and not '.' or '..'), got '" +
           params.run_id + "'");
    }
    c.master_addr = raw_.master_addr;
    if (c.master_addr.empty()) fail(what("master_addr") + ": must not be empty");
    c.master_port = static_cast<std::uint16_t>(
        parse_int_in(raw_.master_port, 1, 65535, what("master_port"), "a port in 1..65535"));
    r.backend = raw_.rdzv_backend;
    if (r.backend == "etcd-v2") {
      fail(what("rdzv_backend") +
           "=etcd-v2: etcd's v2 API is not supported (etcd 3.4 disables it, "
           "3.6 removed it); --rdzv_backend=etcd speaks etcd's v3 API");
    }
    const RendezvousBackend* backend = find_rendezvous_backend(r.backend);
    if (backend == nullptr) {
      fail(what("rdzv_backend") + ": expected " + rendezvous_backend_names() + ", got '" +
           r.backend + "'");
    }
    apply_rdzv_conf(raw_.rdzv_conf, what("rdzv_conf"), r.backend, host_, c);
    const std::string& endpoint = raw_.rdzv_endpoint;
    if (c.standalone) {
      if (params.max_nodes != 1) {
        fail("--standalone runs a single node, but --nnodes is '" + raw_.nnodes + "'");
      }
      r.backend = "c10d";
      backend = find_rendezvous_backend(r.backend);
      r.host = "127.0.0.1";
      r.port = 0;
      // torchrun's --standalone replaces any --rdzv_id with a random one; a
      // given id names the run here (TORCHELASTIC_RUN_ID, the log directory),
      // as users expect. The store is this node's own either way.
      if (!given("rdzv_id")) params.run_id = random_id();
    } else if (backend->store_at == StoreAt::kEtcd) {
      if (endpoint.empty()) {
        fail(
            "--rdzv_backend=etcd needs --rdzv_endpoint host[:port][,host[:port]...] (etcd's "
            "client URLs; default port 2379)");
      }
      std::istringstream in(endpoint);
      for (std::string item; std::getline(in, item, ',');) {
        auto [host, port] = parse_endpoint(item, backend->default_port, what("rdzv_endpoint"));
        if (r.etcd.endpoints.empty()) {
          r.host = host;
          r.port = port;
        } else {
          r.etcd.endpoints += ",";
        }
        r.etcd.endpoints += join_endpoint(host, std::to_string(port));
      }
      if (endpoint.back() == ',') {
        fail(what("rdzv_endpoint") + ": trailing ',' in '" + endpoint + "'");
      }
    } else if (!endpoint.empty()) {
      const bool at_endpoint = backend->store_at == StoreAt::kEndpoint;
      std::tie(r.host, r.port) = parse_endpoint(
          endpoint, at_endpoint ? backend->default_port : c.master_port, what("rdzv_endpoint"));
    } else if (backend->store_at == StoreAt::kEndpoint) {
      fail("--rdzv_backend=" + r.backend + " needs --rdzv_endpoint host[:port]");
    } else {
      r.host = c.master_addr;
      r.port = c.master_port;
    }
    if (backend->fixed_node_count && params.min_nodes != params.max_nodes) {
      fail(what("nnodes") + "=" + raw_.nnodes + ": the " + r.backend +
           " backend needs a fixed number of nodes (use --rdzv_backend=c10d for a range)");
    }
    params.node_rank = static_cast<int>(parse_int_in(
        raw_.node_rank, 0, params.max_nodes - 1, what("node_rank"),
        "an integer in [0, " + std::to_string(params.max_nodes) + ") (0 <= node_rank < nnodes)"));
    params.local_addr = raw_.local_addr;
    if (params.local_addr.empty()) {
      const bool loopback = r.host == "127.0.0.1" || r.host == "localhost" || r.host == "::1";
      // All agents on this machine (a loopback store): loopback is how they
      // reach each other. Static node 0 is reached where the store is.
      params.local_addr = (c.standalone || loopback) ? "127.0.0.1"
                          : (backend->store_at == StoreAt::kNodeRankZero && params.node_rank == 0)
                              ? c.master_addr
                              : host_.hostname();
    }
    // Static: node rank 0 hosts the store. c10d: the factory decides, unless
    // --rdzv_conf is_host says.
    if (backend->store_at != StoreAt::kEndpoint || c.rdzv_conf.count("is_host") == 0) {
      r.is_host = backend->store_at == StoreAt::kNodeRankZero && params.node_rank == 0;
      r.host_auto = backend->store_at == StoreAt::kEndpoint;
    } else {
      r.host_auto = false;
    }
    // c10d sorts group ranks by --node_rank only when it was given (SLURM's
    // node ids order them too).
    const bool node_rank_given = given("node_rank") || origins_.from_slurm.count("node_rank") > 0;
    if (!backend->fixed_node_count && !node_rank_given) params.node_rank = -1;
    // What tells this job from another that uses its run id on a shared store:
    // its node range and the program's file name. Not its arguments, which may
    // differ per node (SLURM scripts pass per-node ones, as torchrun allows) and
    // may hold secrets; not the program's path, which nodes may spell
    // differently. The signature is stored where other jobs can read it.
    params.job_signature = "nnodes=" + std::to_string(params.min_nodes) + ":" +
                           std::to_string(params.max_nodes) +
                           " program=" + std::filesystem::path(c.program).filename().string();
  }

  // Restarts, the role, Python or not, logs, signals, timeouts.
  void resolve_agent(LaunchConfig& c) {
    agent::WorkerSpec& spec = c.agent.spec;
    spec.name = c.program;  // the report's title, as torchrun does
    spec.max_restarts = static_cast<int>(parse_int_in(
        raw_.max_restarts, 0, 1000000, what("max_restarts"), "a non-negative integer"));
    spec.max_no_progress_restarts =
        static_cast<int>(parse_int_in(raw_.max_no_progress_restarts, 0, 1000000,
                                      what("max_no_progress_restarts"), "a non-negative integer"));
    char* end = nullptr;
    c.monitor_interval = std::strtod(raw_.monitor_interval.c_str(), &end);
    if (raw_.monitor_interval.empty() || *end != '\0' || !(c.monitor_interval > 0) ||
        c.monitor_interval > 1e6) {
      fail(what("monitor_interval") + ": expected a positive number of seconds, got '" +
           raw_.monitor_interval + "'");
    }
    if (raw_.start_method != "spawn" && raw_.start_method != "fork" &&
        raw_.start_method != "forkserver") {
      fail(what("start_method") + ": expected spawn, fork or forkserver, got '" +
           raw_.start_method + "'");
    }
    spec.role = raw_.role;
    if (spec.role.empty()) fail(what("role") + ": must not be empty");
    c.no_python = raw_.no_python;
    c.module = raw_.module;
    if (c.no_python && c.module) fail("--no_python and -m/--module cannot be used together");
    c.log_dir = raw_.log_dir;
    spec.redirects = parse_std(raw_.redirects, "-r/--redirects");
    spec.tee = parse_std(raw_.tee, "-t/--tee");
    const int nproc = spec.local_world_size;
    for (const auto* setting : {&spec.redirects, &spec.tee}) {
      for (const auto& [rank, value] : setting->per_rank) {
        if (rank >= nproc) {
          fail(std::string(setting == &spec.redirects ? "-r/--redirects" : "-t/--tee") +
               ": local rank " + std::to_string(rank) +
               " does not exist (--nproc_per_node=" + std::to_string(nproc) + ")");
        }
      }
    }
    const std::string& filter = raw_.local_ranks_filter;
    std::istringstream ranks(filter);
    for (std::string item; !filter.empty() && std::getline(ranks, item, ',');) {
      spec.console_ranks.insert(static_cast<int>(
          parse_int_in(item, 0, nproc - 1, what("local_ranks_filter"),
                       "comma-separated local ranks in [0, " + std::to_string(nproc) + ")")));
    }
    if (!filter.empty() && filter.back() == ',') {
      fail(what("local_ranks_filter") + ": trailing ',' in '" + filter + "'");
    }
    c.signals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    std::istringstream signals(raw_.signals_to_handle);
    for (std::string item; std::getline(signals, item, ',');) {
      item.erase(0, item.find_first_not_of(' '));
      item.erase(item.find_last_not_of(' ') + 1);
      int signo = parse_signal(item);
      if (std::find(c.signals.begin(), c.signals.end(), signo) == c.signals.end()) {
        c.signals.push_back(signo);
      }
    }
    c.agent.exit_barrier_timeout =
        parse_secs(raw_.exit_barrier_timeout, what("exit_barrier_timeout"));
    resolve_watch(c.agent.watch);
    resolve_status(c.agent.status);
    c.agent.health_check.command = raw_.health_check;
    c.agent.health_check.timeout =
        positive_secs(raw_.health_check_timeout, what("health_check_timeout"));
    if (auto tmpl = host_.env("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")) {
      spec.line_prefix_template = *tmpl;
    }
    c.agent.set_omp_num_threads = nproc > 1;
    // --stop_grace with --shutdown_timeout, and torch 2.x's other flags.
    resolve_torch_flags(raw_, origins_, host_, c);
    if (host_.python_module_dir) c.agent.python_module_dir = host_.python_module_dir();
    c.agent.hostname = host_.hostname();
  }

  // --status_port, --status_host and --status_allow_no_token. The live view
  // tells whoever reaches it the job's hosts, addresses, pids and incidents:
  // beyond loopback it asks for the store's token, and without one it is
  // served only when the user says so.
  void resolve_status(agent::StatusOptions& status) const {
    if (!raw_.status_port.empty()) {
      status.port = static_cast<std::uint16_t>(parse_int_in(
          raw_.status_port, 0, 65535, what("status_port"), "a port in 0..65535 (0 picks one)"));
    }
    if (raw_.status_host.empty()) fail(what("status_host") + ": empty address");
    status.host = raw_.status_host;
    const bool has_token = !host_.env("DDP_STORE_TOKEN").value_or("").empty();
    if (status.port && !has_token && !raw_.status_allow_no_token &&
        !status_http::is_loopback(status.host)) {
      fail(what("status_host") + ": '" + status.host +
           "' is beyond loopback and the store has no token (DDP_STORE_TOKEN), so the live "
           "view would show the job's hosts, addresses, pids and incidents to anyone who can "
           "reach the port; set DDP_STORE_TOKEN (clients must then carry it), listen on "
           "127.0.0.1, or pass --status_allow_no_token to serve it anyway");
    }
  }

  // --hang_timeout, --on_hang and torch's file timer.
  void resolve_watch(agent::WatchOptions& watch) const {
    watch.progress_pages = true;
    if (raw_.hang_timeout == "auto") {
      watch.hang_timeout = std::nullopt;
    } else {
      watch.hang_timeout = parse_secs(raw_.hang_timeout, what("hang_timeout"));
    }
    if (raw_.on_hang == "restart") {
      watch.on_hang = agent::WatchOptions::OnHang::kRestart;
    } else if (raw_.on_hang == "fail") {
      watch.on_hang = agent::WatchOptions::OnHang::kFail;
    } else {
      fail(what("on_hang") + ": expected restart or fail, got '" + raw_.on_hang + "'");
    }
    // torchrun's rule: the variable set to exactly "1".
    if (host_.env("TORCHELASTIC_ENABLE_FILE_TIMER").value_or("") == "1") {
      watch.timer_file = host_.env("TORCHELASTIC_TIMER_FILE").value_or("");
      if (watch.timer_file.empty()) watch.timer_file = "/tmp/watchdog_timer_" + random_uuid();
    }
  }

  static std::string random_uuid() {
    std::random_device device;
    char text[40];
    std::snprintf(text, sizeof(text), "%08x-%04x-4%03x-%04x-%08x%04x", device(), device() & 0xffff,
                  device() & 0xfff, (device() & 0x3fff) | 0x8000, device(), device() & 0xffff);
    return text;
  }

  std::string what(const std::string& name) const { return origins_.what(name); }
  bool given(const std::string& name) const { return origins_.given(name); }

  static std::string random_id() {
    std::random_device device;
    std::ostringstream out;
    out << std::hex << device() << device();
    return out.str();
  }

  const RawOptions& raw_;
  const OptionOrigins& origins_;
  const HostFacts& host_;
};

}  // namespace

LaunchConfig resolve_options(const RawOptions& raw, const std::vector<std::string>& program,
                             const OptionOrigins& origins, const HostFacts& host) {
  return Resolver(raw, origins, host).resolve(program);
}

}  // namespace ddp::launcher
