#include "ddp/worker_contract/worker_contract.h"

#include "ddp/worker_contract/env_names.h"

namespace ddp::contract {

namespace {

constexpr std::int64_t kMaxCount = 1 << 30;  // a round, a restart count
constexpr std::int64_t kMaxSize = 1 << 20;   // a world, a node, the nodes

// The field `key` of `m` as an integer in [min, max], or nullopt.
std::optional<int> int_in(const control::Message& m, const char* key, std::int64_t min,
                          std::int64_t max) {
  auto value = m.integer(key);
  if (!value || *value < min || *value > max) return std::nullopt;
  return static_cast<int>(*value);
}

// The field `key` of `m` as 0 or 1, or nullopt.
std::optional<bool> flag(const control::Message& m, const char* key) {
  auto value = int_in(m, key, 0, 1);
  if (!value) return std::nullopt;
  return *value == 1;
}

// The field `key` of `m` as a number of seconds (finite, not negative), or nullopt.
std::optional<double> seconds(const control::Message& m, const char* key) {
  auto value = m.number(key);
  if (!value || *value < 0) return std::nullopt;
  return value;
}

bool has(const control::Message& m, const char* key) { return m.fields.count(key) > 0; }

}  // namespace

namespace {

// What a worker learns of its round, one row per field: its key in the
// `round` message and the environment variable that carries it. The round's
// number has no variable (DDP_STORE_PREFIX holds it).
struct RoundVariable {
  const char* key;
  const char* name;
};
constexpr RoundVariable kRoundVariables[] = {
    {"rank", env_names::kRank},
    {"world_size", env_names::kWorldSize},
    {"local_rank", env_names::kLocalRank},
    {"local_world_size", env_names::kLocalWorldSize},
    {"group_rank", env_names::kGroupRank},
    {"group_world_size", env_names::kGroupWorldSize},
    {"restart_count", env_names::kRestartCount},
    {"job_restart_count", env_names::kJobRestartCount},
    {"membership_changes", env_names::kMembershipChanges},
    {"master_addr", env_names::kMasterAddr},
    {"master_port", env_names::kMasterPort},
    {"store_addr", env_names::kStoreAddr},
    {"store_port", env_names::kStorePort},
    {"store_prefix", env_names::kStorePrefix},
    {"grace_ms", env_names::kChangeGraceMs},
};

}  // namespace

std::vector<std::pair<std::string, std::string>> environment_of(const WorkerRound& r) {
  const control::Message message = encode(r);
  std::vector<std::pair<std::string, std::string>> variables;
  for (const auto& [key, name] : kRoundVariables) variables.emplace_back(name, message.text(key));
  // torchrun's one role: its rank and size are the job's.
  variables.emplace_back(env_names::kRoleRank, std::to_string(r.rank));
  variables.emplace_back(env_names::kRoleWorldSize, std::to_string(r.world_size));
  return variables;
}

std::optional<WorkerRound> decode_environment(const EnvironmentLookup& lookup,
                                              std::string* problem) {
  control::Message message("round");
  message.set("round", 0);
  for (const auto& [key, name] : kRoundVariables) {
    auto value = lookup(name);
    if (!value) {
      if (problem != nullptr)
        *problem = std::string("environment variable ") + name + " is not set";
      return std::nullopt;
    }
    message.set(key, std::move(*value));
  }
  auto round = decode_round(message);
  if (!round && problem != nullptr) {
    *problem = "environment variables";
    for (const auto& [key, name] : kRoundVariables) {
      *problem += std::string(" ") + name + "=" + message.text(key);
    }
    *problem += " do not describe a round (a value out of range or not a number)";
  }
  return round;
}

control::Message encode(const WorkerRound& r) {
  control::Message m("round");
  m.set("round", r.round)
      .set("rank", r.rank)
      .set("world_size", r.world_size)
      .set("local_rank", r.local_rank)
      .set("local_world_size", r.local_world_size)
      .set("group_rank", r.group_rank)
      .set("group_world_size", r.group_world_size)
      .set("restart_count", r.restart_count)
      .set("job_restart_count", r.job_restart_count)
      .set("membership_changes", r.membership_changes)
      .set("master_addr", r.master_addr)
      .set("master_port", r.master_port)
      .set("store_addr", r.store_addr)
      .set("store_port", r.store_port)
      .set("store_prefix", r.store_prefix)
      .set("grace_ms", static_cast<std::int64_t>(r.change_grace.count()));
  return m;
}

std::optional<WorkerRound> decode_round(const control::Message& m) {
  if (m.type != "round") return std::nullopt;
  WorkerRound r;
  const auto round = int_in(m, "round", 0, kMaxCount);
  const auto world_size = int_in(m, "world_size", 1, kMaxSize);
  const auto local_world_size = int_in(m, "local_world_size", 1, kMaxSize);
  const auto group_world_size = int_in(m, "group_world_size", 1, kMaxSize);
  if (!round || !world_size || !local_world_size || !group_world_size) return std::nullopt;
  const auto rank = int_in(m, "rank", 0, *world_size - 1);
  const auto local_rank = int_in(m, "local_rank", 0, *local_world_size - 1);
  const auto group_rank = int_in(m, "group_rank", 0, *group_world_size - 1);
  const auto restart_count = int_in(m, "restart_count", 0, kMaxCount);
  const auto job_restart_count = int_in(m, "job_restart_count", 0, kMaxCount);
  const auto membership_changes = int_in(m, "membership_changes", 0, kMaxCount);
  const auto master_port = int_in(m, "master_port", 0, 65535);
  const auto store_port = int_in(m, "store_port", 1, 65535);
  const auto grace = m.integer("grace_ms");
  if (!rank || !local_rank || !group_rank || !restart_count || !job_restart_count ||
      !membership_changes || !master_port || !store_port || !grace || *grace < 0 ||
      !has(m, "master_addr") || !has(m, "store_prefix") || m.text("store_addr").empty()) {
    return std::nullopt;
  }
  r.round = *round;
  r.rank = *rank;
  r.world_size = *world_size;
  r.local_rank = *local_rank;
  r.local_world_size = *local_world_size;
  r.group_rank = *group_rank;
  r.group_world_size = *group_world_size;
  r.restart_count = *restart_count;
  r.job_restart_count = *job_restart_count;
  r.membership_changes = *membership_changes;
  r.master_addr = m.text("master_addr");
  r.master_port = *master_port;
  r.store_addr = m.text("store_addr");
  r.store_port = *store_port;
  r.store_prefix = m.text("store_prefix");
  r.change_grace = std::chrono::milliseconds(*grace);
  return r;
}

control::Message encode(const Hello& hello) {
  control::Message m("hello");
  m.set("in_place", hello.in_place ? 1 : 0).set("pid", hello.pid);
  return m;
}

std::optional<Hello> decode_hello(const control::Message& m) {
  if (m.type != "hello") return std::nullopt;
  const auto in_place = flag(m, "in_place");
  const auto pid = has(m, "pid") ? m.integer("pid") : std::optional<std::int64_t>(0);
  if (!in_place || !pid || *pid < 0) return std::nullopt;
  return Hello{*in_place, *pid};
}

control::Message encode(const Abort& abort) {
  control::Message m("abort");
  m.set("round", abort.round).set("why", abort.why.substr(0, kMaxWhyBytes));
  return m;
}

std::optional<Abort> decode_abort(const control::Message& m) {
  if (m.type != "abort") return std::nullopt;
  const auto round = int_in(m, "round", 0, kMaxCount);
  if (!round) return std::nullopt;
  return Abort{*round, m.text("why").substr(0, kMaxWhyBytes)};
}

control::Message encode(const Reformed& reformed) {
  control::Message m("reformed");
  m.set("round", reformed.round)
      .set("rank", reformed.rank)
      .set("wait_seconds", reformed.wait_seconds)
      .set("build_seconds", reformed.build_seconds);
  return m;
}

std::optional<Reformed> decode_reformed(const control::Message& m) {
  if (m.type != "reformed") return std::nullopt;
  const auto round = int_in(m, "round", 0, kMaxCount);
  const auto rank = int_in(m, "rank", 0, kMaxSize - 1);
  const auto wait = seconds(m, "wait_seconds");
  const auto build = seconds(m, "build_seconds");
  if (!round || !rank || !wait || !build) return std::nullopt;
  return Reformed{*round, *rank, *wait, *build};
}

control::Message encode(const Synced& synced) {
  control::Message m("synced");
  m.set("round", synced.round)
      .set("root", synced.root)
      .set("received", synced.received ? 1 : 0)
      .set("from_live", synced.from_live ? 1 : 0)
      .set("bytes", synced.bytes)
      .set("seconds", synced.seconds);
  return m;
}

std::optional<Synced> decode_synced(const control::Message& m) {
  if (m.type != "synced") return std::nullopt;
  const auto round = int_in(m, "round", -1, kMaxCount);
  const auto root = int_in(m, "root", 0, kMaxSize - 1);
  const auto received = flag(m, "received");
  const auto from_live = flag(m, "from_live");
  const auto bytes = m.integer("bytes");
  const auto time = seconds(m, "seconds");
  if (!round || !root || !received || !from_live || !bytes || *bytes < 0 || !time) {
    return std::nullopt;
  }
  return Synced{*round, *root, *received, *from_live, *bytes, *time};
}

}  // namespace ddp::contract
