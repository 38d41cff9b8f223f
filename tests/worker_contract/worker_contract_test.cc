// The typed agent-worker contract (ddp/worker_contract/worker_contract.h):
// every message round-trips through its struct and the wire, each decode
// refuses the others' messages and any message with a field missing or out of
// range, and the round a worker learns reads the same in its environment and
// in the `round` message.
#include "ddp/worker_contract/worker_contract.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "ddp/worker_contract/env_names.h"

namespace ddp::contract {
namespace {

WorkerRound a_round() {
  WorkerRound r;
  r.round = 7;
  r.rank = 5;
  r.world_size = 8;
  r.local_rank = 1;
  r.local_world_size = 2;
  r.group_rank = 2;
  r.group_world_size = 4;
  r.restart_count = 3;
  r.job_restart_count = 4;
  r.membership_changes = 2;
  r.master_addr = "10.0.0.2";
  r.master_port = 29500;
  r.store_addr = "node-0.example";
  r.store_port = 29400;
  r.store_prefix = "rdzv/job/round_7/workers";
  r.change_grace = std::chrono::milliseconds(12500);
  return r;
}

// The message as the other end reads it: through the wire's codec.
control::Message over_the_wire(const control::Message& m) {
  auto read = control::decode(control::encode(m));
  EXPECT_TRUE(read.has_value());
  return read.value_or(control::Message());
}

std::set<std::string> keys_of(const control::Message& m) {
  std::set<std::string> keys;
  for (const auto& [key, value] : m.fields) keys.insert(key);
  return keys;
}

TEST(WorkerContract, EveryMessageRoundTrips) {
  const WorkerRound round = a_round();
  EXPECT_EQ(decode_round(over_the_wire(encode(round))), round);
  const Hello hello{true, 4242};
  EXPECT_EQ(decode_hello(over_the_wire(encode(hello))), hello);
  const Abort abort{6, "node 2 (member a\nb) was lost: it missed its keep-alives"};
  EXPECT_EQ(decode_abort(over_the_wire(encode(abort))), abort);
  const Reformed reformed{7, 5, 0.5, 0.125};
  EXPECT_EQ(decode_reformed(over_the_wire(encode(reformed))), reformed);
  const Synced synced{7, 2, true, true, std::int64_t{3} << 40, 1.25};
  EXPECT_EQ(decode_synced(over_the_wire(encode(synced))), synced);
  // A worker that was never told its round says -1.
  const Synced first{-1, 0, false, false, 0, 0};
  EXPECT_EQ(decode_synced(over_the_wire(encode(first))), first);
}

// The fields each message carries on the wire, as the header documents them
// (the table there once listed `seconds` for reformed and no `received` for
// synced, while synced lacked the `round` the agent read).
TEST(WorkerContract, EachMessageCarriesTheFieldsOfItsStruct) {
  EXPECT_EQ(encode(a_round()).type, "round");
  EXPECT_EQ(
      keys_of(encode(a_round())),
      (std::set<std::string>{"round", "rank", "world_size", "local_rank", "local_world_size",
                             "group_rank", "group_world_size", "restart_count", "job_restart_count",
                             "membership_changes", "master_addr", "master_port", "store_addr",
                             "store_port", "store_prefix", "grace_ms"}));
  EXPECT_EQ(encode(Hello{}).type, "hello");
  EXPECT_EQ(keys_of(encode(Hello{})), (std::set<std::string>{"in_place", "pid"}));
  EXPECT_EQ(encode(Abort{}).type, "abort");
  EXPECT_EQ(keys_of(encode(Abort{})), (std::set<std::string>{"round", "why"}));
  EXPECT_EQ(encode(Reformed{}).type, "reformed");
  EXPECT_EQ(keys_of(encode(Reformed{})),
            (std::set<std::string>{"round", "rank", "wait_seconds", "build_seconds"}));
  EXPECT_EQ(encode(Synced{}).type, "synced");
  EXPECT_EQ(keys_of(encode(Synced{})),
            (std::set<std::string>{"round", "root", "received", "from_live", "bytes", "seconds"}));
}

TEST(WorkerContract, EachDecodeRefusesTheOtherMessages) {
  const control::Message messages[] = {encode(a_round()), encode(Hello{}), encode(Abort{}),
                                       encode(Reformed{}), encode(Synced{})};
  int decoded = 0;
  for (const auto& m : messages) {
    const int read = int{decode_round(m).has_value()} + int{decode_hello(m).has_value()} +
                     int{decode_abort(m).has_value()} + int{decode_reformed(m).has_value()} +
                     int{decode_synced(m).has_value()};
    EXPECT_EQ(read, 1) << m.type;
    decoded += read;
  }
  EXPECT_EQ(decoded, 5);
}

// Every field but hello's pid (a worker's, for logs) and abort's why (which
// may be empty) is needed: without it the message is not read.
TEST(WorkerContract, AMessageWithAFieldMissingIsRefused) {
  auto each_without_one = [](const control::Message& m, auto decode,
                             const std::set<std::string>& optional) {
    for (const auto& [key, value] : m.fields) {
      control::Message cut = m;
      cut.fields.erase(key);
      EXPECT_EQ(decode(cut).has_value(), optional.count(key) > 0) << m.type << " without " << key;
    }
  };
  each_without_one(encode(a_round()), decode_round, {});
  each_without_one(encode(Hello{true, 7}), decode_hello, {"pid"});
  each_without_one(encode(Abort{1, "why"}), decode_abort, {"why"});
  each_without_one(encode(Reformed{1, 2, 0.5, 0.5}), decode_reformed, {});
  each_without_one(encode(Synced{1, 2, true, false, 3, 0.5}), decode_synced, {});
}

TEST(WorkerContract, AFieldOutOfRangeIsRefused) {
  auto round_with = [](const std::string& key, const std::string& value) {
    control::Message m = encode(a_round());
    m.set(key, value);
    return decode_round(m);
  };
  EXPECT_TRUE(round_with("rank", "7"));
  EXPECT_FALSE(round_with("rank", "8"));  // world_size 8
  EXPECT_FALSE(round_with("rank", "-1"));
  EXPECT_FALSE(round_with("local_rank", "2"));  // local_world_size 2
  EXPECT_FALSE(round_with("group_rank", "4"));  // group_world_size 4
  EXPECT_FALSE(round_with("world_size", "0"));
  EXPECT_FALSE(round_with("round", "-1"));
  EXPECT_FALSE(round_with("restart_count", "-1"));
  EXPECT_FALSE(round_with("store_port", "0"));
  EXPECT_FALSE(round_with("store_port", "65536"));
  EXPECT_TRUE(round_with("master_port", "0"));
  EXPECT_FALSE(round_with("master_port", "65536"));
  EXPECT_FALSE(round_with("store_addr", ""));
  EXPECT_TRUE(round_with("store_prefix", ""));
  EXPECT_FALSE(round_with("grace_ms", "-1"));
  EXPECT_FALSE(round_with("grace_ms", "1.5"));
  EXPECT_FALSE(round_with("rank", "5x"));

  control::Message hello = encode(Hello{});
  hello.set("in_place", 2);
  EXPECT_FALSE(decode_hello(hello));
  control::Message synced = encode(Synced{});
  synced.set("bytes", -1);
  EXPECT_FALSE(decode_synced(synced));
  synced = encode(Synced{});
  synced.set("round", -2);
  EXPECT_FALSE(decode_synced(synced));
  synced = encode(Synced{});
  synced.set("seconds", "nan");
  EXPECT_FALSE(decode_synced(synced));
  control::Message reformed = encode(Reformed{});
  reformed.set("build_seconds", -0.5);
  EXPECT_FALSE(decode_reformed(reformed));
}

// A field a side does not know is ignored: either side may add one.
TEST(WorkerContract, AFieldADecodeDoesNotKnowIsIgnored) {
  control::Message m = encode(a_round());
  m.set("node_name", "a later field");
  EXPECT_EQ(decode_round(m), a_round());
}

TEST(WorkerContract, AnAbortsReasonIsCutToItsBound) {
  const std::string long_why(kMaxWhyBytes + 100, 'w');
  const control::Message m = encode(Abort{2, long_why});
  EXPECT_EQ(m.text("why").size(), kMaxWhyBytes);
  control::Message longer = m;
  longer.set("why", long_why);  // from an agent that does not cut it
  auto read = decode_abort(longer);
  ASSERT_TRUE(read);
  EXPECT_EQ(read->why, long_why.substr(0, kMaxWhyBytes));
}

// What a new worker finds in its environment and what a kept worker is told
// are one WorkerRound: every variable says what the message says.
TEST(WorkerContract, TheEnvironmentAndTheRoundMessageSayTheSameRound) {
  const WorkerRound round = a_round();
  std::map<std::string, std::string> env;
  for (const auto& [name, value] : environment_of(round)) {
    EXPECT_TRUE(env.emplace(name, value).second) << name << " twice";
  }
  const control::Message m = encode(round);
  namespace names = env_names;
  const std::map<std::string, std::string> field_of = {
      {names::kRank, "rank"},
      {names::kRoleRank, "rank"},
      {names::kWorldSize, "world_size"},
      {names::kRoleWorldSize, "world_size"},
      {names::kLocalRank, "local_rank"},
      {names::kLocalWorldSize, "local_world_size"},
      {names::kGroupRank, "group_rank"},
      {names::kGroupWorldSize, "group_world_size"},
      {names::kRestartCount, "restart_count"},
      {names::kJobRestartCount, "job_restart_count"},
      {names::kMembershipChanges, "membership_changes"},
      {names::kMasterAddr, "master_addr"},
      {names::kMasterPort, "master_port"},
      {names::kStoreAddr, "store_addr"},
      {names::kStorePort, "store_port"},
      {names::kStorePrefix, "store_prefix"},
      {names::kChangeGraceMs, "grace_ms"},
  };
  EXPECT_EQ(env.size(), field_of.size());
  for (const auto& [name, field] : field_of) {
    ASSERT_TRUE(env.count(name)) << name;
    EXPECT_EQ(env.at(name), m.text(field)) << name;
  }
  // Every field of the message but the round's number is in the environment.
  std::set<std::string> in_env;
  for (const auto& [name, field] : field_of) in_env.insert(field);
  std::set<std::string> fields = keys_of(m);
  fields.erase("round");
  EXPECT_EQ(in_env, fields);
  EXPECT_EQ(env.at(names::kRank), "5");
  EXPECT_EQ(env.at(names::kJobRestartCount), "4");
  EXPECT_EQ(env.at(names::kMembershipChanges), "2");
  EXPECT_EQ(env.at(names::kChangeGraceMs), "12500");
  EXPECT_EQ(env.at(names::kStorePrefix), "rdzv/job/round_7/workers");
}

// The environment environment_of writes reads back as the same round (all
// but its number), as a worker ddprun started reads it.
TEST(WorkerContract, TheEnvironmentReadsBackAsTheSameRound) {
  const WorkerRound round = a_round();
  std::map<std::string, std::string> env;
  for (const auto& [name, value] : environment_of(round)) env[name] = value;
  const auto lookup = [&env](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  auto read = decode_environment(lookup);
  ASSERT_TRUE(read);
  WorkerRound expected = round;
  expected.round = 0;
  EXPECT_EQ(*read, expected);
}

TEST(WorkerContract, AnEnvironmentMissingAVariableOrOutOfRangeNamesIt) {
  std::map<std::string, std::string> env;
  for (const auto& [name, value] : environment_of(a_round())) env[name] = value;
  const auto lookup = [&env](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  env.erase(env_names::kStorePort);
  std::string problem;
  EXPECT_FALSE(decode_environment(lookup, &problem));
  EXPECT_EQ(problem, "environment variable DDP_STORE_PORT is not set");

  env[env_names::kStorePort] = "29400";
  env[env_names::kRank] = "8";  // WORLD_SIZE is 8
  EXPECT_FALSE(decode_environment(lookup, &problem));
  EXPECT_NE(problem.find("RANK=8"), std::string::npos) << problem;
  EXPECT_NE(problem.find("do not describe a round"), std::string::npos) << problem;

  env[env_names::kRank] = "five";
  EXPECT_FALSE(decode_environment(lookup));  // no problem asked for: still refused
  env[env_names::kRank] = "5";
  EXPECT_TRUE(decode_environment(lookup));
}

}  // namespace
}  // namespace ddp::contract
