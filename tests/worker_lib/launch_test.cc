// The worker library in real processes: joined by hand through env://
// (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, rank 0 hosting the store), through
// ddprun's DDP_STORE_* variables, and under the real launcher `ddprun`.
// The worker program is ddp_worker_smoke (tests/worker_lib/worker_smoke_main.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ddp/common/error.h"
#include "ddp/store/prefix_store.h"
#include "ddp/store/tcp_store.h"
#include "ddp/store_server/store_server.h"
#include "ddp/worker_contract/worker_contract.h"
#include "net_util.h"
#include "process_util.h"

namespace ddp::test {
namespace {

using ::testing::HasSubstr;

std::string smoke() { return bin_dir() + "/ddp_worker_smoke"; }

// Ranks (or launchers) started together, each in a process group of its own
// with `env` set over this process's environment, waited for together (and
// killed, groups and all, at the timeout or when the test ends first).
class Procs {
 public:
  ~Procs() { kill_children(children_); }
  void start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
    SpawnOptions options;
    options.own_group = true;
    const std::string tag = "proc" + std::to_string(children_.size());
    children_.push_back(spawn(argv, environment_with(env), dir_.path(), tag, options));
  }
  std::vector<RunResult> wait_all(std::chrono::seconds timeout) {
    return test::wait_all(children_, timeout);
  }

 private:
  TempDir dir_{"ddp-worker-test"};
  std::vector<Child> children_;
};

std::vector<RunResult> run_env(int world, const std::string& mode,
                               std::map<std::string, std::string> extra = {},
                               std::chrono::seconds timeout = std::chrono::seconds(60)) {
  const int port = free_port();
  Procs procs;
  for (int r = 0; r < world; ++r) {
    auto env = extra;
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = std::to_string(port);
    env["RANK"] = std::to_string(r);
    env["WORLD_SIZE"] = std::to_string(world);
    env["LOCAL_RANK"] = std::to_string(r);
    env.erase("DDP_STORE_ADDR");
    procs.start({smoke(), mode}, env);
  }
  return procs.wait_all(timeout);
}

TEST(EnvInit, EveryCollectiveAcrossThreeProcesses) {
  auto results = run_env(3, "all", {{"DDP_TIMEOUT", "30"}});
  for (std::size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].code, 0) << results[r].output();
    EXPECT_THAT(results[r].output(), HasSubstr("SMOKE OK rank " + std::to_string(r) + "/3"));
  }
}

TEST(EnvInit, EveryCollectiveOverTcpWithSharedMemoryDisabled) {
  auto results = run_env(3, "all", {{"DDP_TIMEOUT", "30"}, {"DDP_SHM_DISABLE", "1"}});
  for (std::size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].code, 0) << results[r].output();
    EXPECT_THAT(results[r].output(), HasSubstr("SMOKE OK rank " + std::to_string(r) + "/3"));
  }
}

// A rank that cannot see rank 0's /dev/shm (a private tmpfs in its own mount
// namespace, as on another host) makes every rank fall back to TCP together;
// every collective still gives the right answer. Needs root for unshare.
TEST(EnvInit, RankOnAnotherHostsSharedMemoryMakesEveryRankFallBackToTcp) {
  if (::geteuid() != 0 || ::access("/usr/bin/unshare", X_OK) != 0)
    GTEST_SKIP() << "needs root and unshare";
  const int port = free_port();
  Procs procs;
  for (int r = 0; r < 3; ++r) {
    std::map<std::string, std::string> env = {
        {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)},
        {"RANK", std::to_string(r)},  {"WORLD_SIZE", "3"},
        {"LOCAL_RANK", "0"},          {"DDP_TIMEOUT", "30"}};
    if (r == 2) {
      procs.start({"/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                   "mount -t tmpfs tmpfs /dev/shm && exec \"$0\" all", smoke()},
                  env);
    } else {
      procs.start({smoke(), "all"}, env);
    }
  }
  auto results = procs.wait_all(std::chrono::seconds(60));
  for (std::size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].code, 0) << results[r].output();
    EXPECT_THAT(results[r].output(), HasSubstr("SMOKE OK rank " + std::to_string(r) + "/3"));
  }
  EXPECT_THAT(results[0].output(),
              HasSubstr("no shared-memory all-reduce, all-reduce uses TCP (rank 2: shm_open"));
}

// The shared-memory all-reduce watches its peers' processes: a SIGKILLed rank
// is reported within a second or so, not after the 120 s timeout.
TEST(EnvInit, KilledPeerFailsTheSharedMemoryAllreduceQuickly) {
  auto results = run_env(3, "peer-dies", {{"DDP_TIMEOUT", "120"}}, std::chrono::seconds(60));
  EXPECT_EQ(results[2].code, 128 + SIGKILL) << results[2].output();  // killed by its own signal
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code, 0) << results[r].output();
    EXPECT_THAT(results[r].output(), HasSubstr("PEER DIED rank " + std::to_string(r)));
    EXPECT_THAT(results[r].output(), HasSubstr("rank 2 (pid "));
    EXPECT_THAT(results[r].output(), HasSubstr("exited during the shared-memory all-reduce"));
    EXPECT_THAT(results[r].output(), HasSubstr("SMOKE OK"));  // noticed within 10 s
  }
}

TEST(EnvInit, RankThatNeverArrivesIsNamedInTheTimeout) {
  auto results = run_env(3, "missing", {{"DDP_TIMEOUT", "2"}});
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code, 0) << results[r].output();
    EXPECT_THAT(results[r].output(), HasSubstr("ranks that did not arrive: [2]"));
    EXPECT_THAT(results[r].output(), HasSubstr("seq 0"));
  }
}

TEST(EnvInit, SizeMismatchUnderDebugDetailIsAClearError) {
  auto results = run_env(3, "mismatch", {{"DDP_TIMEOUT", "20"}, {"DDP_DEBUG", "DETAIL"}});
  for (const auto& result : results) {
    EXPECT_EQ(result.code, 0) << result.output();
    EXPECT_THAT(result.output(), HasSubstr("ranks [1] called allreduce(seq=0, count=20"));
  }
}

TEST(EnvInit, MissingVariablesAreNamed) {
  Procs procs;
  procs.start({smoke(), "all"}, {{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  auto results = procs.wait_all(std::chrono::seconds(20));
  EXPECT_EQ(results[0].code, 2);
  EXPECT_THAT(results[0].output(), HasSubstr("MASTER_ADDR"));
}

// A worker that finds ddprun's store in its environment reads the whole round
// there (worker_contract's decode_environment), and names what is missing.
TEST(EnvInit, AnIncompleteAgentEnvironmentIsNamed) {
  Procs procs;
  procs.start({smoke(), "all"},
              {{"DDP_STORE_ADDR", "127.0.0.1"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}});
  auto results = procs.wait_all(std::chrono::seconds(20));
  EXPECT_EQ(results[0].code, 2) << results[0].output();
  EXPECT_THAT(results[0].output(),
              HasSubstr("environment variable LOCAL_RANK is not set (ddprun sets them)"));
}

// Store-prefix isolation across restarts: the agent's store serves round k and
// round k+1 under different DDP_STORE_PREFIX values. Round k+1's workers form
// their group; a straggler of round k using the same rank numbers cannot join
// it or read its keys, and fails with a timeout instead.
TEST(DdpStoreInit, StaleRoundCannotSeeTheNextRoundsKeys) {
  StoreServer server(StoreServerOptions{});
  server.start();
  // As ddprun's agent writes it (one node, two workers).
  const auto env_of = [&server](int rank, const std::string& prefix) {
    contract::WorkerRound round;
    round.rank = rank;
    round.world_size = 2;
    round.local_rank = rank;
    round.local_world_size = 2;
    round.master_addr = "127.0.0.1";
    round.master_port = 1;  // must not be used
    round.store_addr = "127.0.0.1";
    round.store_port = server.port();
    round.store_prefix = prefix;
    std::map<std::string, std::string> env;
    for (const auto& [name, value] : contract::environment_of(round)) env[name] = value;
    return env;
  };
  Procs procs;
  for (int r = 0; r < 2; ++r) {
    auto env = env_of(r, "job/round_1");
    env["DDP_TIMEOUT"] = "30";
    procs.start({smoke(), "all"}, env);
  }
  auto stale_env = env_of(1, "job/round_0");
  stale_env["DDP_TIMEOUT"] = "3";
  procs.start({smoke(), "all"}, stale_env);
  auto results = procs.wait_all(std::chrono::seconds(60));
  EXPECT_EQ(results[0].code, 0) << results[0].output();
  EXPECT_EQ(results[1].code, 0) << results[1].output();
  EXPECT_EQ(results[2].code, 2) << results[2].output();
  EXPECT_THAT(results[2].output(), HasSubstr("SMOKE ERROR"));

  TcpStoreOptions options;
  options.port = server.port();
  auto base = std::make_shared<TcpStore>(options);
  PrefixStore round0("job/round_0", base), round1("job/round_1", base);
  // Both round-1 workers counted themselves out under their prefix; the same key
  // is invisible from round 0 (whose straggler never got that far).
  EXPECT_EQ(round1.get("destroyed", std::chrono::milliseconds(1000)), "2");
  EXPECT_FALSE(round0.check({"destroyed"}));
  EXPECT_THROW(round0.get("destroyed", std::chrono::milliseconds(200)), TimeoutError);
  server.stop();
}

// Under the real launcher (built by the agent helper): 2 and 4 workers.
class UnderDdprun : public ::testing::TestWithParam<int> {};

TEST_P(UnderDdprun, EveryCollective) {
  auto ddprun = fs::path(bin_dir()) / "ddprun";
  if (!std::filesystem::exists(ddprun)) GTEST_SKIP() << ddprun << " is not built";
  const int n = GetParam();
  Procs procs;
  procs.start(
      {ddprun.string(), "--standalone", "--nproc_per_node=" + std::to_string(n), smoke(), "all"},
      {{"DDP_TIMEOUT", "60"}});
  auto results = procs.wait_all(std::chrono::seconds(120));
  EXPECT_EQ(results[0].code, 0) << results[0].output();
  for (int r = 0; r < n; ++r) {
    EXPECT_THAT(results[0].output(),
                HasSubstr("SMOKE OK rank " + std::to_string(r) + "/" + std::to_string(n)));
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, UnderDdprun, ::testing::Values(2, 4));

TEST(UnderDdprunFailures, MissingRankIsNamed) {
  auto ddprun = fs::path(bin_dir()) / "ddprun";
  if (!std::filesystem::exists(ddprun)) GTEST_SKIP() << ddprun << " is not built";
  Procs procs;
  procs.start({ddprun.string(), "--standalone", "--nproc_per_node=3", smoke(), "missing"},
              {{"DDP_TIMEOUT", "2"}});
  auto results = procs.wait_all(std::chrono::seconds(60));
  EXPECT_EQ(results[0].code, 0) << results[0].output();
  EXPECT_THAT(results[0].output(), HasSubstr("ranks that did not arrive: [2]"));
}

}  // namespace
}  // namespace ddp::test
