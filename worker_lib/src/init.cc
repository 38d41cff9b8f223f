#include "ddp/worker/init.h"

#include <algorithm>
#include <mutex>
#include <thread>

#include "init_state.h"
#include "recovery/control_client.h"
#include "recovery/reform.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/common/env.h"
#include "ddp/common/error.h"
#include "ddp/common/logging.h"
#include "ddp/common/time.h"
#include "ddp/store/prefix_store.h"
#include "ddp/store/tcp_store.h"
#include "ddp/store_server/store_server.h"
#include "ddp/worker/logger.h"
#include "ddp/worker/process_group_nccl.h"
#include "ddp/worker_contract/env_names.h"
#include "ddp/worker_contract/worker_contract.h"

namespace ddp {

namespace {

namespace names = env_names;

int require_int(const char* name, std::int64_t min, std::int64_t max) {
  auto value = env::get_int(name);
  if (!value) {
    throw InvalidArgument("init_process_group",
                          fmt::format("environment variable {} is not set (expected by env:// and "
                                      "ddprun; or pass InitOptions)",
                                      name));
  }
  if (*value < min || *value > max) {
    throw InvalidArgument("init_process_group", fmt::format("environment variable {}={} is outside "
                                                            "[{}, {}]",
                                                            name, *value, min, max));
  }
  return static_cast<int>(*value);
}

std::string require_str(const char* name) {
  auto value = env::get(name);
  if (!value || value->empty()) {
    throw InvalidArgument("init_process_group",
                          fmt::format("environment variable {} is not set", name));
  }
  return *value;
}

// The round ddprun's agent wrote into this worker's environment, or nullopt
// when no agent started it (DDP_STORE_ADDR unset: torchrun's env://).
std::optional<contract::WorkerRound> round_from_agent() {
  auto addr = env::get(names::kStoreAddr);
  if (!addr || addr->empty()) return std::nullopt;
  std::string problem;
  auto round =
      contract::decode_environment([](const char* name) { return env::get(name); }, &problem);
  if (!round) throw InvalidArgument("init_process_group", problem + " (ddprun sets them)");
  return round;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

}  // namespace

namespace detail {

InitState& init_state() {
  static InitState s;
  return s;
}

InitState& initialized_state(const char* what) {
  auto& s = init_state();
  if (!s.initialized) {
    throw InvalidArgument(what, "the process group is not initialized (call init_process_group)");
  }
  return s;
}

std::shared_ptr<ProcessGroup> make_group(const std::string& backend, std::shared_ptr<Store> store,
                                         int rank, int size, const InitOptions& options,
                                         int local_rank, const std::string& name) {
  if (backend == "gloo") {
    GlooOptions gloo = options.gloo;
    gloo.timeout = options.timeout;
    gloo.name = name;
    if (auto* control = detail::ControlClient::get(); control != nullptr && !gloo.on_failure) {
      gloo.on_failure = [control](std::exception_ptr error) { return control->explain(error); };
    }
    return make_gloo_process_group(std::move(store), rank, size, gloo);
  }
  if (backend == "nccl") {
    NcclOptions nccl;
    nccl.device = local_rank;
    nccl.timeout = options.timeout;
    nccl.name = name;
    return make_nccl_process_group(std::move(store), rank, size, nccl);
  }
  throw InvalidArgument("init_process_group",
                        fmt::format("unknown backend '{}' (expected gloo or nccl)", backend));
}

std::shared_ptr<Store> connect_store(const std::string& host, int port, const std::string& token,
                                     std::chrono::milliseconds timeout) {
  TcpStoreOptions tcp;
  tcp.host = host;
  tcp.port = static_cast<std::uint16_t>(port);
  tcp.token = token;
  tcp.connect_timeout = timeout;
  tcp.timeout = timeout;
  return std::make_shared<TcpStore>(tcp);
}

}  // namespace detail

using detail::connect_store;
using detail::init_state;
using detail::initialized_state;
using detail::make_group;
using detail::named_round;
using detail::round_group;
using detail::round_store;

namespace {

// Where this worker is: from `options` where given, else ddprun's round, else
// torchrun's env:// variables.
struct Placement {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int local_world = 1;
};

Placement place(const InitOptions& options, const std::optional<contract::WorkerRound>& round) {
  Placement p;
  p.world = options.world_size ? *options.world_size
            : round            ? round->world_size
                               : require_int(names::kWorldSize, 1, 1 << 20);
  p.rank = options.rank ? *options.rank
           : round      ? round->rank
                        : require_int(names::kRank, 0, p.world - 1);
  if (p.world < 1 || p.rank < 0 || p.rank >= p.world) {
    throw InvalidArgument("init_process_group",
                          fmt::format("rank {} is outside [0, {})", p.rank, p.world));
  }
  p.local_rank =
      round ? round->local_rank : static_cast<int>(env::get_int(names::kLocalRank).value_or(0));
  p.local_world = round ? round->local_world_size
                        : static_cast<int>(env::get_int(names::kLocalWorldSize).value_or(1));
  return p;
}

// The store the groups meet in, and what a re-form needs to reach it again.
struct StoreSetup {
  std::unique_ptr<StoreServer> server;  // env:// rank 0 hosts it
  std::shared_ptr<Store> store;         // where the default group meets
  std::shared_ptr<Store> base_store;    // ddprun's store, not namespaced (else null)
  std::string host;
  int port = 0;
  std::string token;
  std::string prefix;  // the round's area in base_store
};

StoreSetup open_store(const InitOptions& options, const std::optional<contract::WorkerRound>& round,
                      int rank) {
  StoreSetup setup;
  setup.store = options.store;
  if (setup.store) return setup;
  if (round) {
    // ddprun: the agent's store, namespaced per rendezvous round and restart.
    setup.host = round->store_addr;
    setup.port = round->store_port;
    setup.token = env::get_or(names::kStoreToken, "");
    setup.base_store = connect_store(setup.host, setup.port, setup.token, options.timeout);
    setup.prefix = round->store_prefix;
    return setup;
  }
  // env://: rank 0 hosts the store on MASTER_PORT.
  TcpStoreOptions tcp;
  tcp.host = require_str(names::kMasterAddr);
  tcp.port = static_cast<std::uint16_t>(require_int(names::kMasterPort, 1, 65535));
  tcp.connect_timeout = options.timeout;
  tcp.timeout = options.timeout;
  setup.host = tcp.host;
  if (rank == 0) {
    StoreServerOptions server_options;
    server_options.host = is_loopback(tcp.host) ? "127.0.0.1" : "0.0.0.0";
    server_options.port = tcp.port;
    setup.server = std::make_unique<StoreServer>(server_options);
    setup.server->start();
  }
  std::shared_ptr<Store> base = std::make_shared<TcpStore>(tcp);
  // The restart count keeps a restarted job away from a previous attempt's keys
  // when the same MASTER_PORT store outlives it.
  setup.store = std::make_shared<PrefixStore>(
      fmt::format("env/{}", env::get_or(names::kRestartCount, "0")), base);
  return setup;
}

// Gloo's interface when the program named none: GLOO_SOCKET_IFNAME, else
// GLOO_HOSTNAME, else loopback when the store is on this host.
void choose_gloo_address(GlooOptions& gloo, const std::string& store_host) {
  if (!gloo.iface.empty() || !gloo.hostname.empty()) return;
  if (auto iface = env::get(names::kGlooSocketIfname); iface && !iface->empty()) {
    gloo.iface = *iface;
  } else if (auto host = env::get(names::kGlooHostname); host && !host->empty()) {
    gloo.hostname = *host;
  } else if (store_host.empty() || is_loopback(store_host)) {
    gloo.hostname = "127.0.0.1";  // single node: stay on loopback
  }
}

}  // namespace

void init_process_group(InitOptions options) {
  auto& s = init_state();
  std::lock_guard lock(s.mutex);
  const char* origin = "init_process_group";
  if (s.initialized) throw InvalidArgument(origin, "the process group is already initialized");
  if (options.backend != "gloo" && options.backend != "nccl") {
    throw InvalidArgument(
        origin, fmt::format("unknown backend '{}' (expected gloo or nccl)", options.backend));
  }
  if (auto text = env::get(names::kTimeout); text && !text->empty()) {
    options.timeout = env::parse_seconds(*text, "environment variable DDP_TIMEOUT");
  }
  if (options.timeout.count() <= 0) {
    throw InvalidArgument(origin,
                          fmt::format("timeout {} ms must be positive", options.timeout.count()));
  }
  const std::optional<contract::WorkerRound> agents_round = round_from_agent();
  Placement at = place(options, agents_round);
  StoreSetup setup = open_store(options, agents_round, at.rank);
  // In-place recovery needs the agent's channel, and ddprun's store to re-form in.
  if (options.recover_in_place && agents_round) {
    s.control = detail::ControlClient::open(agents_round->change_grace);
  }
  if (setup.base_store) setup.store = round_store(s, setup.base_store, setup.prefix);
  choose_gloo_address(options.gloo, setup.host);
  std::shared_ptr<ProcessGroup> group;
  for (;;) {
    try {
      group = round_group(
          s, make_group(options.backend, std::make_shared<PrefixStore>("pg/default", setup.store),
                        at.rank, at.world, options, at.local_rank, "default"));
      break;
    } catch (const std::exception&) {
      if (s.control == nullptr || !s.control->signal()->is_set()) throw;
    }
    // The round ended while this worker joined it: join the one the agent names next.
    const contract::WorkerRound next =
        named_round(s.control->wait_next_round(options.timeout), at.local_rank);
    if (next.store_addr != setup.host || next.store_port != setup.port) {
      setup.host = next.store_addr;
      setup.port = next.store_port;
      setup.base_store = connect_store(setup.host, setup.port, setup.token, options.timeout);
    }
    setup.store = round_store(s, setup.base_store, next.store_prefix);
    at.rank = next.rank;
    at.world = next.world_size;
  }

  s.options = options;
  s.rank = at.rank;
  s.world_size = at.world;
  s.local_rank = at.local_rank;
  s.local_world_size = at.local_world;
  s.server = std::move(setup.server);
  s.store = std::move(setup.store);
  s.base_store = std::move(setup.base_store);
  s.store_addr = setup.host;
  s.store_port = setup.port;
  s.store_token = setup.token;
  s.group = std::move(group);
  s.next_group = 0;
  s.logger = log::init(fmt::format("rank {}", at.rank), spdlog::level::info);
  s.initialized = true;
  s.logger->debug("joined: rank {}/{} local {}/{} backend {}", at.rank, at.world, at.local_rank,
                  at.local_world, options.backend);
}

void destroy_process_group() {
  auto& s = init_state();
  std::lock_guard lock(s.mutex);
  if (!s.initialized) return;
  s.subgroups.clear();
  s.group.reset();
  if (s.server) {
    // Keep hosting the store until every rank has left, so no rank loses it mid-call.
    try {
      s.store->add("destroyed", 1);
      Deadline deadline(
          std::min<std::chrono::milliseconds>(s.options.timeout, std::chrono::seconds(60)));
      while (!deadline.expired() && s.store->add("destroyed", 0) < s.world_size) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    } catch (const std::exception& e) {
      s.logger->warn("destroy_process_group: {}", e.what());
    }
  } else {
    try {
      s.store->add("destroyed", 1);
    } catch (const std::exception&) {
      // The host may already be gone; nothing else to clean up.
    }
  }
  s.store.reset();
  if (s.server) s.server->stop();
  s.server.reset();
  s.initialized = false;
}

bool is_initialized() {
  auto& s = init_state();
  std::lock_guard lock(s.mutex);
  return s.initialized;
}

int rank() {
  auto& s = init_state();
  std::lock_guard lock(s.mutex);
  return initialized_state("ddp::rank").rank;
}

int world_size() {
  auto& s = init_state();
  std::lock_guard lock(s.mutex);
  return initialized_state("ddp::world_size").world_size;
}

int local_rank() {
  auto& s = init_state();
  std::lock_guard lock(s.mutex);
  return initialized_state("ddp::local_rank").local_rank;
}

int local_world_size() {
  auto& s = init_state();
  std::lock_guard lock(s.mutex);
  return initialized_state("ddp::local_world_size").local_world_size;
}

std::shared_ptr<ProcessGroup> default_group() {
  auto& s = init_state();
  std::lock_guard lock(s.mutex);
  return initialized_state("ddp::default_group").group;
}

std::shared_ptr<Store> job_store() {
  auto& s = init_state();
  std::lock_guard lock(s.mutex);
  return initialized_state("ddp::job_store").store;
}

std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks, const std::string& backend) {
  auto& s = init_state();
  std::lock_guard lock(s.mutex);
  initialized_state("ddp::new_group");
  std::vector<int> members = ranks;
  if (members.empty()) {
    for (int r = 0; r < s.world_size; ++r) members.push_back(r);
  }
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || sorted.front() < 0 ||
      sorted.back() >= s.world_size) {
    throw InvalidArgument("ddp::new_group",
                          fmt::format("ranks [{}] must be distinct ranks in [0, {})",
                                      fmt::join(members, ","), s.world_size));
  }
  const int index = s.next_group++;
  auto it = std::find(members.begin(), members.end(), s.rank);
  if (it == members.end()) return nullptr;
  const int group_rank = static_cast<int>(it - members.begin());
  auto name = fmt::format("{}", index);
  auto group =
      make_group(backend.empty() ? s.options.backend : backend,
                 std::make_shared<PrefixStore>(fmt::format("pg/{}", index), s.store), group_rank,
                 static_cast<int>(members.size()), s.options, s.local_rank, name);
  s.subgroups.push_back(group);
  return group;
}

std::shared_ptr<spdlog::logger> logger() {
  auto& s = init_state();
  std::lock_guard lock(s.mutex);
  if (s.logger) return s.logger;
  return log::get("ddp");
}

}  // namespace ddp
