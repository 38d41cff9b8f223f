// End-to-end tests of the ddprun binary: environment, multi-agent rendezvous,
// restarts, reports, signals, logs, the command line, Python programs.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <deque>
#include <fstream>
#include <regex>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "net_util.h"
#include "process_util.h"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;

std::string ddprun() { return bin_dir() + "/ddprun"; }
std::string worker() { return bin_dir() + "/ddprun_test_worker"; }

std::vector<std::string> cmd(std::initializer_list<std::string> ddprun_args,
                             std::initializer_list<std::string> program) {
  std::vector<std::string> argv{ddprun()};
  argv.insert(argv.end(), ddprun_args);
  argv.insert(argv.end(), program);
  return argv;
}

nlohmann::json read_json(const fs::path& path) { return nlohmann::json::parse(read_text(path)); }

class DdprunTest : public ::testing::Test {
 protected:
  TempDir dir_;
};

// ---------------------------------------------------------------- environment

class EnvTest : public DdprunTest, public ::testing::WithParamInterface<int> {};

TEST_P(EnvTest, WorkerEnvironmentIsExactlyTheContract) {
  const int n = GetParam();
  auto env = base_env();
  auto result = run(cmd({"--standalone", "--nproc_per_node=" + std::to_string(n), "--no_python"},
                        {worker(), "env", dir_.str(), "arg_${local_rank}"}),
                    env, dir_.path());
  ASSERT_EQ(result.code, 0) << result.err;

  const std::set<std::string> contract = {"LOCAL_RANK",
                                          "RANK",
                                          "GROUP_RANK",
                                          "ROLE_RANK",
                                          "ROLE_NAME",
                                          "LOCAL_WORLD_SIZE",
                                          "WORLD_SIZE",
                                          "GROUP_WORLD_SIZE",
                                          "ROLE_WORLD_SIZE",
                                          "MASTER_ADDR",
                                          "MASTER_PORT",
                                          "TORCHELASTIC_RESTART_COUNT",
                                          "TORCHELASTIC_MAX_RESTARTS",
                                          "TORCHELASTIC_RUN_ID",
                                          "TORCHELASTIC_USE_AGENT_STORE",
                                          "TORCHELASTIC_ERROR_FILE",
                                          "NCCL_ASYNC_ERROR_HANDLING",
                                          "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                          "DDP_STORE_ADDR",
                                          "DDP_STORE_PORT",
                                          "DDP_STORE_PREFIX",
                                          "DDP_PROGRESS_FD",
                                          "DDP_CONTROL_FD",
                                          "DDP_CHANGE_GRACE_MS",
                                          "DDP_JOB_RESTART_COUNT",
                                          "DDP_MEMBERSHIP_CHANGES"};
  std::string run_id;
  std::string master_port;
  for (int rank = 0; rank < n; ++rank) {
    auto path = dir_.path() / ("env_" + std::to_string(rank) + "_0.json");
    ASSERT_TRUE(fs::exists(path)) << "rank " << rank << " wrote nothing";
    auto data = read_json(path);
    auto wenv = data["env"];
    std::set<std::string> expected_keys = contract;
    for (const auto& [k, v] : env) expected_keys.insert(k);
    if (n > 1) expected_keys.insert("OMP_NUM_THREADS");
    // A build with the torch backend has ddprun's Python module folder beside
    // bin/: ddprun puts it on PYTHONPATH (the environment here has none).
    const fs::path module_dir = fs::path(bin_dir()).parent_path() / "lib" / "ddprun" / "python";
    if (fs::is_directory(module_dir)) expected_keys.insert("PYTHONPATH");
    std::set<std::string> keys;
    for (auto it = wenv.begin(); it != wenv.end(); ++it) keys.insert(it.key());
    EXPECT_EQ(keys, expected_keys) << "rank " << rank;

    for (const auto& [k, v] : env) EXPECT_EQ(wenv[k], v) << k;
    if (fs::is_directory(module_dir)) {
      EXPECT_EQ(fs::weakly_canonical(wenv["PYTHONPATH"].get<std::string>()),
                fs::weakly_canonical(module_dir));
    }
    const std::string r = std::to_string(rank);
    EXPECT_EQ(wenv["LOCAL_RANK"], r);
    EXPECT_EQ(wenv["RANK"], r);
    EXPECT_EQ(wenv["ROLE_RANK"], r);
    EXPECT_EQ(wenv["GROUP_RANK"], "0");
    EXPECT_EQ(wenv["ROLE_NAME"], "default");
    EXPECT_EQ(wenv["LOCAL_WORLD_SIZE"], std::to_string(n));
    EXPECT_EQ(wenv["WORLD_SIZE"], std::to_string(n));
    EXPECT_EQ(wenv["ROLE_WORLD_SIZE"], std::to_string(n));
    EXPECT_EQ(wenv["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(wenv["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(wenv["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(wenv["TORCHELASTIC_MAX_RESTARTS"], "0");
    EXPECT_EQ(wenv["TORCHELASTIC_USE_AGENT_STORE"], "False");
    EXPECT_EQ(wenv["NCCL_ASYNC_ERROR_HANDLING"], "1");
    EXPECT_EQ(wenv["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");  // torch 2.x's name
    EXPECT_EQ(wenv["DDP_STORE_ADDR"], "127.0.0.1");
    if (n > 1) {
      EXPECT_EQ(wenv["OMP_NUM_THREADS"], "1");
    }
    const std::string error_file = wenv["TORCHELASTIC_ERROR_FILE"];
    EXPECT_TRUE(error_file.ends_with("/attempt_0/" + r + "/error.json")) << error_file;
    const std::string prefix = wenv["DDP_STORE_PREFIX"];
    EXPECT_NE(prefix.find("round_0"), std::string::npos) << prefix;
    int port = std::stoi(wenv["MASTER_PORT"].get<std::string>());
    EXPECT_GT(port, 0);
    EXPECT_LT(port, 65536);
    EXPECT_GT(std::stoi(wenv["DDP_STORE_PORT"].get<std::string>()), 0);
    // Same job for everyone.
    if (rank == 0) {
      run_id = wenv["TORCHELASTIC_RUN_ID"];
      master_port = wenv["MASTER_PORT"];
    }
    EXPECT_EQ(wenv["TORCHELASTIC_RUN_ID"], run_id);
    EXPECT_EQ(wenv["MASTER_PORT"], master_port);
    // ${local_rank} substituted in the arguments.
    EXPECT_EQ(data["argv"][3], "arg_" + r);
  }
  EXPECT_FALSE(run_id.empty());
  EXPECT_NE(run_id, "none");  // standalone makes up a fresh id
}

INSTANTIATE_TEST_SUITE_P(Workers, EnvTest, ::testing::Values(1, 3, 4));

TEST_F(DdprunTest, InheritedOmpNumThreadsIsKept) {
  auto env = base_env();
  env["OMP_NUM_THREADS"] = "7";
  auto result =
      run(cmd({"--standalone", "--nproc_per_node=2", "--no_python"}, {worker(), "env", dir_.str()}),
          env, dir_.path());
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_EQ(read_json(dir_.path() / "env_1_0.json")["env"]["OMP_NUM_THREADS"], "7");
}

TEST_F(DdprunTest, PetEnvironmentFallback) {
  auto env = base_env();
  env["PET_NPROC_PER_NODE"] = "3";
  env["PET_STANDALONE"] = "1";
  env["PET_NO_PYTHON"] = "1";
  auto result = run({ddprun(), worker(), "env", dir_.str()}, env, dir_.path());
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_TRUE(fs::exists(dir_.path() / "env_2_0.json"));
  EXPECT_EQ(read_json(dir_.path() / "env_2_0.json")["env"]["WORLD_SIZE"], "3");
}

// Two agents on loopback (static rendezvous), different --nproc_per_node.
TEST_F(DdprunTest, TwoAgentsStaticRendezvous) {
  const std::string port = std::to_string(free_port());
  auto env = base_env();
  auto node = [&](int rank, int nproc) {
    return spawn(cmd({"--nnodes=2", "--node_rank=" + std::to_string(rank),
                      "--nproc-per-node=" + std::to_string(nproc), "--master_addr=127.0.0.1",
                      "--master_port=" + port, "--rdzv_id=two", "--no_python"},
                     {worker(), "env", dir_.str()}),
                 env, dir_.path(), "node" + std::to_string(rank));
  };
  Child n1 = node(1, 2);  // the non-host may start first: it waits for the store
  Child n0 = node(0, 1);
  int c0 = wait_child(n0.pid);
  int c1 = wait_child(n1.pid);
  ASSERT_EQ(c0, 0) << read_text(n0.err);
  ASSERT_EQ(c1, 0) << read_text(n1.err);
  std::set<std::string> master_ports;
  for (int rank = 0; rank < 3; ++rank) {
    auto wenv = read_json(dir_.path() / ("env_" + std::to_string(rank) + "_0.json"))["env"];
    EXPECT_EQ(wenv["WORLD_SIZE"], "3");
    EXPECT_EQ(wenv["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(wenv["GROUP_RANK"], rank == 0 ? "0" : "1");
    EXPECT_EQ(wenv["LOCAL_RANK"], rank == 0 ? "0" : std::to_string(rank - 1));
    EXPECT_EQ(wenv["LOCAL_WORLD_SIZE"], rank == 0 ? "1" : "2");
    EXPECT_EQ(wenv["TORCHELASTIC_RUN_ID"], "two");
    EXPECT_EQ(wenv["DDP_STORE_PORT"], port);
    EXPECT_EQ(wenv["MASTER_ADDR"], "127.0.0.1");
    EXPECT_NE(wenv["MASTER_PORT"], port);  // worker rank 0's own store, not the agents'
    master_ports.insert(wenv["MASTER_PORT"]);
  }
  EXPECT_EQ(master_ports.size(), 1u);
}

// c10d: the node whose endpoint address is local and free hosts the store;
// group ranks follow arrival order.
TEST_F(DdprunTest, TwoAgentsC10dRendezvous) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto env = base_env();
  auto node = [&](int nproc, const std::string& tag) {
    return spawn(cmd({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint,
                      "--rdzv_id=c", "--nproc_per_node=" + std::to_string(nproc), "--no_python"},
                     {worker(), "env", dir_.str()}),
                 env, dir_.path(), tag);
  };
  Child first = node(2, "first");
  Child second = node(1, "second");
  ASSERT_EQ(wait_child(first.pid), 0) << read_text(first.err);
  ASSERT_EQ(wait_child(second.pid), 0) << read_text(second.err);
  // Whoever arrived first is group rank 0 and owns the lowest global ranks.
  auto env0 = read_json(dir_.path() / "env_0_0.json")["env"];
  const int first_size = std::stoi(env0["LOCAL_WORLD_SIZE"].get<std::string>());
  for (int rank = 0; rank < 3; ++rank) {
    auto wenv = read_json(dir_.path() / ("env_" + std::to_string(rank) + "_0.json"))["env"];
    const bool on_first = rank < first_size;
    EXPECT_EQ(wenv["WORLD_SIZE"], "3");
    EXPECT_EQ(wenv["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(wenv["GROUP_RANK"], on_first ? "0" : "1");
    EXPECT_EQ(wenv["LOCAL_RANK"], std::to_string(on_first ? rank : rank - first_size));
    EXPECT_EQ(wenv["LOCAL_WORLD_SIZE"], std::to_string(on_first ? first_size : 3 - first_size));
    EXPECT_EQ(wenv["MASTER_ADDR"], "127.0.0.1");  // a loopback endpoint: all on this host
  }
}

TEST_F(DdprunTest, RendezvousTimeoutNamesTheMissingNode) {
  auto result =
      run(cmd({"--nnodes=2", "--node_rank=0", "--master_port=" + std::to_string(free_port()),
               "--rdzv_conf=join_timeout=0.3", "--no_python"},
              {worker(), "env", dir_.str()}),
          base_env(), dir_.path());
  EXPECT_EQ(result.code, 1);
  EXPECT_NE(result.err.find("rendezvous failed"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("missing: node_1"), std::string::npos) << result.err;
  EXPECT_FALSE(fs::exists(dir_.path() / "env_0_0.json"));
}

TEST_F(DdprunTest, StoreTokenIsUsedAndPassedOn) {
  auto env = base_env();
  env["DDP_STORE_TOKEN"] = "s3cret";
  auto result =
      run(cmd({"--standalone", "--nproc_per_node=1", "--no_python"}, {worker(), "env", dir_.str()}),
          env, dir_.path());
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_EQ(read_json(dir_.path() / "env_0_0.json")["env"]["DDP_STORE_TOKEN"], "s3cret");
}

// A failure on one node restarts both nodes in a new round.
TEST_F(DdprunTest, TwoAgentsRestartTogether) {
  const std::string port = std::to_string(free_port());
  auto env = base_env();
  auto node = [&](int rank, std::vector<std::string> program) {
    std::vector<std::string> argv{ddprun(),
                                  "--nnodes=2",
                                  "--node_rank=" + std::to_string(rank),
                                  "--nproc_per_node=1",
                                  "--master_port=" + port,
                                  "--max_restarts=1",
                                  "--no_python"};
    argv.insert(argv.end(), program.begin(), program.end());
    return spawn(argv, env, dir_.path(), "node" + std::to_string(rank));
  };
  // Node 1's worker fails on attempt 0; node 0's worker would sleep forever
  // in attempt 0 unless its agent restarts it.
  Child n0 = node(0, {"/bin/sh", "-c",
                      "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exec sleep 60; fi; echo "
                      "\"n0 attempt $TORCHELASTIC_RESTART_COUNT $DDP_STORE_PREFIX\""});
  Child n1 = node(1, {"/bin/sh", "-c",
                      "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exit 4; fi; echo "
                      "\"n1 attempt $TORCHELASTIC_RESTART_COUNT\""});
  int c0 = wait_child(n0.pid, std::chrono::seconds(20));
  int c1 = wait_child(n1.pid, std::chrono::seconds(20));
  EXPECT_EQ(c0, 0) << read_text(n0.err);
  EXPECT_EQ(c1, 0) << read_text(n1.err);
  // DDP_STORE_PREFIX is rdzv/<run id>/<job instance>/round_<restart>/workers.
  EXPECT_TRUE(std::regex_search(read_text(n0.out),
                                std::regex("n0 attempt 1 rdzv/none/[0-9a-f]{16}/round_1/workers")))
      << read_text(n0.out);
  EXPECT_NE(read_text(n1.out).find("n1 attempt 1"), std::string::npos);
}

// Two static nodes with --exit_barrier_timeout=1; node 0 hosts the store.
class ExitBarrierTest : public DdprunTest {
 protected:
  ~ExitBarrierTest() override {
    for (const auto& node : nodes_) kill_if_alive(node.pid);
  }

  Child& node(int rank, const std::string& script) {
    nodes_.push_back(
        spawn(cmd({"--nnodes=2", "--node_rank=" + std::to_string(rank), "--nproc_per_node=1",
                   "--master_addr=127.0.0.1", "--master_port=" + port_, "--exit_barrier_timeout=1",
                   "--no_python"},
                  {"/bin/sh", "-c", script}),
              base_env(), dir_.path(), "node" + std::to_string(rank)));
    return nodes_.back();
  }

  std::string all_stderr() const { return stderr_of(nodes_); }

  std::string port_ = std::to_string(free_port());
  std::deque<Child> nodes_;
};

// Node 0's workers finish at once, node 1's run 5 s: node 0's exit barrier
// times out after 1 s, but it keeps serving the store until node 1 is done
// (before: it left, and node 1's healthy workers were killed, exit 1).
TEST_F(ExitBarrierTest, TheStoreHostStaysUntilASlowerNodeFinishes) {
  const fs::path done = dir_.path() / "node1_done";
  Child& n0 = node(0, "exit 0");
  Child& n1 = node(1, "sleep 5; echo finished > " + done.string());
  EXPECT_EQ(wait_child(n0.pid, 60s), 0) << all_stderr();
  EXPECT_TRUE(fs::exists(done)) << "node 0 left before node 1's workers finished\n" << all_stderr();
  EXPECT_EQ(wait_child(n1.pid, 60s), 0) << all_stderr();
  const std::string err0 = read_text(n0.err), err1 = read_text(n1.err);
  EXPECT_NE(err0.find("serves the rendezvous store that the others still use"), std::string::npos)
      << err0;
  EXPECT_EQ(err1.find("lost the rendezvous store"), std::string::npos) << err1;
}

// A node that stays for the others leaves once they show no sign of life
// (node 1 SIGKILLed: its heartbeat stops), with exit code 0: its own
// workers succeeded.
TEST_F(ExitBarrierTest, TheStoreHostLeavesOnceTheNodesItWaitsForAreGone) {
  Child& n0 = node(0, "exit 0");
  Child& n1 = node(1, "exec sleep 120");
  ASSERT_TRUE(eventually(
      [&] { return read_text(n0.err).find("so it stays until") != std::string::npos; }, 60s))
      << all_stderr();
  ::kill(n1.pid, SIGKILL);
  EXPECT_EQ(wait_child(n1.pid), 128 + SIGKILL);
  EXPECT_EQ(wait_child(n0.pid, 60s), 0) << all_stderr();
  EXPECT_NE(read_text(n0.err).find("show no sign of life; leaving"), std::string::npos)
      << all_stderr();
}

// ---------------------------------------------------------------- restarts, reports

TEST_F(DdprunTest, FailsOnAttemptZeroThenSucceeds) {
  auto result = run(cmd({"--standalone", "--nproc_per_node=2", "--max_restarts=1", "--no_python"},
                        {worker(), "fail_on_attempt0", "5"}),
                    base_env(), dir_.path());
  EXPECT_EQ(result.code, 0) << result.err;
  // On attempt 0 the first failure stops the other worker, maybe before it printed.
  EXPECT_NE(result.out.find(":attempt 0 rank "), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("[default0]:attempt 1 rank 0"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("[default1]:attempt 1 rank 1"), std::string::npos) << result.out;
  EXPECT_EQ(result.err.find("FAILED"), std::string::npos) << result.err;
}

TEST_F(DdprunTest, MaxRestartsExhaustedReportsRootCause) {
  auto result = run(cmd({"--standalone", "--nproc_per_node=2", "--max_restarts=1", "--log_dir",
                         dir_.str() + "/logs", "--rdzv_id=ignored", "--no_python"},
                        {worker(), "error_file", "9", "boom at step 3"}),
                    base_env(), dir_.path());
  EXPECT_EQ(result.code, 9) << result.err;
  // Titled with the program as typed, as torchrun does.
  EXPECT_NE(result.err.find("\n" + worker() + " FAILED\n"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("Root Cause (first observed failure):"), std::string::npos);
  EXPECT_NE(result.err.find("exitcode  : 9 (pid: "), std::string::npos);
  EXPECT_NE(result.err.find("traceback : Traceback (most recent call last):"), std::string::npos);
  EXPECT_NE(result.err.find("RuntimeError: boom at step 3"), std::string::npos);
  EXPECT_NE(result.err.find("/attempt_1/"), std::string::npos) << "the last attempt's error file";
  EXPECT_NE(result.err.find("error.json"), std::string::npos);
  EXPECT_NE(result.err.find("host      : "), std::string::npos);
  EXPECT_NE(result.err.find("rank      : "), std::string::npos);

  // The job's record, in the run's folder: the events as lines of JSON, and
  // the final /status document.
  std::vector<fs::path> runs;
  for (const auto& entry : fs::directory_iterator(dir_.path() / "logs")) runs.push_back(entry);
  ASSERT_EQ(runs.size(), 1u);
  std::vector<nlohmann::json> events;
  for (const auto& line : lines_of(read_text(runs[0] / "events.jsonl"))) {
    events.push_back(nlohmann::json::parse(line));
  }
  std::vector<int> attempts;
  int restarts = 0;
  int failed_workers = 0;
  for (const auto& e : events) {
    if (e["kind"] == "round_formed") attempts.push_back(e["attempt"]);
    if (e["kind"] == "restarting") {
      ++restarts;
      EXPECT_EQ(e["cause"], "worker_failure") << e;
      EXPECT_EQ(e["restarts_spent"], 1) << e;
    }
    if (e["kind"] == "worker_failed") ++failed_workers;
  }
  EXPECT_EQ(attempts, (std::vector<int>{0, 1}));
  EXPECT_EQ(restarts, 1);
  EXPECT_GE(failed_workers, 2) << "one failure a round at least";
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["kind"], "job_ended");
  EXPECT_EQ(events.back()["exit_code"], 9);
  const auto status = read_json(runs[0] / "status.json");
  EXPECT_EQ(status["state"], "failed");
  EXPECT_EQ(status["restarts"]["spent"], 1);
  EXPECT_EQ(status["events"].back()["text"], "the job ended with exit code 9");
}

TEST_F(DdprunTest, SignalledWorkerReportsSignalName) {
  auto sig = run(cmd({"--standalone", "--nproc_per_node=1", "--no_python"},
                     {"/bin/sh", "-c", "kill -SEGV $$"}),
                 base_env(), dir_.path());
  EXPECT_EQ(sig.code, 128 + SIGSEGV) << sig.err;
  EXPECT_NE(sig.err.find("exitcode  : -11"), std::string::npos) << sig.err;
  EXPECT_NE(sig.err.find("Signal 11 (SIGSEGV) received by PID"), std::string::npos) << sig.err;
}

TEST_F(DdprunTest, RootCauseIsTheFirstFailure) {
  // Rank 1 exits 7 after 100 ms; rank 0 sleeps and is stopped by the agent:
  // only rank 1 is a failure.
  auto result =
      run(cmd({"--standalone", "--nproc_per_node=3", "--no_python"}, {worker(), "crash_rank", "1"}),
          base_env(), dir_.path());
  EXPECT_EQ(result.code, 7) << result.err;
  EXPECT_NE(result.err.find("<NO_OTHER_FAILURES>"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("rank      : 1 (local_rank: 1)"), std::string::npos) << result.err;
}

// ---------------------------------------------------------------- signals

TEST_F(DdprunTest, SigtermLeavesNoDescendant) {
  Child child = spawn(cmd({"--standalone", "--nproc_per_node=2", "--stop_grace=5", "--no_python"},
                          {worker(), "family", dir_.str()}),
                      base_env(), dir_.path());
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    for (const char* ext : {".pid", ".child"}) {
      auto path = dir_.path() / (std::to_string(r) + ext);
      ASSERT_TRUE(wait_for_file(path)) << path;
      pids.push_back(std::stoi(read_text(path)));
    }
  }
  for (pid_t pid : pids) ASSERT_FALSE(process_dead(pid));
  ::kill(child.pid, SIGTERM);
  EXPECT_EQ(wait_child(child.pid, std::chrono::seconds(10)), 128 + SIGTERM) << read_text(child.err);
  // Workers and their children (all in the workers' process groups) are gone:
  // the workers were reaped before ddprun exited; the grandchildren got
  // SIGKILL and die a moment later (they are not ddprun's children).
  auto gone = [&] {
    for (pid_t pid : pids) {
      if (!process_dead(pid)) return false;
    }
    return live_members_of_group(pids[0]).empty() && live_members_of_group(pids[2]).empty();
  };
  eventually(gone);
  for (pid_t pid : pids) EXPECT_TRUE(process_dead(pid)) << pid;
  EXPECT_TRUE(live_members_of_group(pids[0]).empty());
  EXPECT_TRUE(live_members_of_group(pids[2]).empty());
}

// A worker's children (in its process group) do not outlive it, whichever way
// it ends: reads the worker's and its child's pids, checks both are gone.
void expect_no_orphan(const fs::path& dir, const Child& child) {
  ASSERT_TRUE(wait_for_file(dir / "0.child")) << read_text(child.err);
  const pid_t grandchild = std::stoi(read_text(dir / "0.child"));
  EXPECT_TRUE(eventually([&] { return process_dead(grandchild); }, std::chrono::seconds(5)))
      << "the worker's child " << grandchild << " outlived it";
  kill_if_alive(grandchild);
}

TEST_F(DdprunTest, WorkersChildrenDieWhenItSucceeds) {
  Child child = spawn(cmd({"--standalone", "--nproc_per_node=1", "--no_python"},
                          {worker(), "orphan", dir_.str(), "0"}),
                      base_env(), dir_.path());
  EXPECT_EQ(wait_child(child.pid), 0) << read_text(child.err);
  expect_no_orphan(dir_.path(), child);
}

TEST_F(DdprunTest, WorkersChildrenDieWhenItFails) {
  Child child = spawn(cmd({"--standalone", "--nproc_per_node=1", "--no_python"},
                          {worker(), "orphan", dir_.str(), "3"}),
                      base_env(), dir_.path());
  EXPECT_EQ(wait_child(child.pid), 3) << read_text(child.err);
  expect_no_orphan(dir_.path(), child);
}

TEST_F(DdprunTest, WorkersChildrenDieOnSigtermEvenWhenTheyIgnoreIt) {
  Child child = spawn(cmd({"--standalone", "--nproc_per_node=1", "--stop_grace=5", "--no_python"},
                          {worker(), "stubborn", dir_.str()}),
                      base_env(), dir_.path());
  ASSERT_TRUE(wait_for_file(dir_.path() / "0.pid"));
  ASSERT_TRUE(wait_for_file(dir_.path() / "0.child"));
  ::kill(child.pid, SIGTERM);
  EXPECT_EQ(wait_child(child.pid, std::chrono::seconds(10)), 128 + SIGTERM) << read_text(child.err);
  expect_no_orphan(dir_.path(), child);
}

// ---------------------------------------------------------------- descriptors

// Two agents on this host with c10d: the first hosts the store (a listening
// socket and the agents' connections), both hold client connections. Not one
// of those may reach a worker (which inherits exactly one descriptor beyond
// 0, 1, 2: its progress page), and every descriptor an agent holds beyond
// 0, 1, 2 is close-on-exec (anything it might ever exec gets none of them).
TEST_F(DdprunTest, WorkersInheritNoSocketAndAgentsHoldOnlyCloseOnExecDescriptors) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto node = [&](const std::string& tag) {
    return spawn(cmd({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint,
                      "--rdzv_id=fds", "--nproc_per_node=1", "--no_python"},
                     {worker(), "fds", dir_.str()}),
                 base_env(), dir_.path(), tag);
  };
  Child first = node("first");
  Child second = node("second");
  for (int rank = 0; rank < 2; ++rank) {
    const fs::path listing = dir_.path() / ("fds_" + std::to_string(rank) + ".txt");
    ASSERT_TRUE(wait_for_file(listing, std::chrono::seconds(30)))
        << read_text(first.err) << read_text(second.err);
    std::vector<std::string> inherited;
    int pages = 0;
    int channels = 0;
    for (const auto& line : lines_of(read_text(listing))) {
      if (line.find("/memfd:ddprun-progress") != std::string::npos) {
        ++pages;
        continue;
      }
      // The control channel: the one socket a worker gets, named by DDP_CONTROL_FD.
      if (line.find("socket:") != std::string::npos &&
          line.find(" (DDP_CONTROL_FD)") != std::string::npos) {
        ++channels;
        continue;
      }
      if (std::stoi(line) > 2 || line.find("socket:") != std::string::npos)
        inherited.push_back(line);
    }
    EXPECT_EQ(pages, 1) << read_text(listing);
    EXPECT_EQ(channels, 1) << read_text(listing);
    EXPECT_TRUE(inherited.empty())
        << "rank " << rank << " inherited (fd target): " << ::testing::PrintToString(inherited);
  }
  for (const Child* agent : {&first, &second}) {
    auto leaky = inheritable_fds(agent->pid);
    EXPECT_TRUE(leaky.empty()) << "ddprun " << agent->pid
                               << " holds descriptors without close-on-exec: "
                               << ::testing::PrintToString(leaky);
  }
  ::kill(first.pid, SIGTERM);
  ::kill(second.pid, SIGTERM);
  EXPECT_EQ(wait_child(first.pid, std::chrono::seconds(20)), 128 + SIGTERM) << read_text(first.err);
  EXPECT_EQ(wait_child(second.pid, std::chrono::seconds(20)), 128 + SIGTERM)
      << read_text(second.err);
}

TEST_F(DdprunTest, SigkilledAgentTakesWorkersWithinOneSecond) {
  // --log_dir inside the test's directory: a SIGKILLed ddprun cannot remove
  // its temporary directory.
  Child child = spawn(
      cmd({"--standalone", "--nproc_per_node=2", "--log_dir", dir_.str() + "/logs", "--no_python"},
          {worker(), "sleep", dir_.str()}),
      base_env(), dir_.path());
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    auto path = dir_.path() / (std::to_string(r) + ".pid");
    ASSERT_TRUE(wait_for_file(path));
    pids.push_back(std::stoi(read_text(path)));
  }
  ::kill(child.pid, SIGKILL);
  EXPECT_EQ(wait_child(child.pid), 128 + SIGKILL);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  bool all_dead = false;
  while (!all_dead && std::chrono::steady_clock::now() < deadline) {
    all_dead = process_dead(pids[0]) && process_dead(pids[1]);
    if (!all_dead) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(all_dead);
}

TEST_F(DdprunTest, TempDirOfASigkilledDdprunIsRemovedByTheNextOne) {
  const fs::path tmp = dir_.path() / "tmp";
  fs::create_directories(tmp);
  auto env = base_env();
  env["TMPDIR"] = tmp.string();
  auto temp_dirs = [&] {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(tmp))
      names.push_back(entry.path().filename().string());
    return names;
  };
  // A directory of a live process (this test) must survive the sweep.
  const fs::path live = tmp / ("ddprun-" + std::to_string(::getpid()) + "-live");
  fs::create_directories(live);

  Child child = spawn(
      cmd({"--standalone", "--nproc_per_node=1", "--no_python"}, {worker(), "sleep", dir_.str()}),
      env, dir_.path());
  ASSERT_TRUE(wait_for_file(dir_.path() / "0.pid"));
  const std::string own = "ddprun-" + std::to_string(child.pid) + "-";
  auto names = temp_dirs();
  ASSERT_EQ(std::count_if(names.begin(), names.end(),
                          [&](const auto& n) { return n.rfind(own, 0) == 0; }),
            1);
  ::kill(child.pid, SIGKILL);
  EXPECT_EQ(wait_child(child.pid), 128 + SIGKILL);

  auto result =
      run(cmd({"--standalone", "--nproc_per_node=1", "--no_python"}, {worker(), "env", dir_.str()}),
          env, dir_.path());
  ASSERT_EQ(result.code, 0) << result.err;
  names = temp_dirs();
  EXPECT_EQ(names, std::vector<std::string>{
                       live.filename().string()});  // the killed one's and its own are gone
}

TEST_F(DdprunTest, SigintIsForwardedAndGivesExitCode130) {
  Child child = spawn(cmd({"--standalone", "--nproc_per_node=1", "--no_python"},
                          {"/bin/sh", "-c",
                           "trap 'echo got INT; exit 0' INT; echo ready > " + dir_.str() +
                               "/0.pid; while true; do sleep 0.01; done"}),
                      base_env(), dir_.path());
  ASSERT_TRUE(wait_for_file(dir_.path() / "0.pid"));
  ::kill(child.pid, SIGINT);
  EXPECT_EQ(wait_child(child.pid, std::chrono::seconds(10)), 128 + SIGINT);
  EXPECT_NE(read_text(child.out).find("[default0]:got INT"), std::string::npos)
      << read_text(child.out);
}

TEST_F(DdprunTest, SigusrForwardedOnlyWhenNamed) {
  Child child = spawn(cmd({"--standalone", "--nproc_per_node=1",
                           "--signals_to_handle=SIGTERM,SIGUSR1", "--no_python"},
                          {"/bin/sh", "-c",
                           "trap 'echo got USR1; exit 0' USR1; echo ready > " + dir_.str() +
                               "/0.pid; while true; do sleep 0.01; done"}),
                      base_env(), dir_.path());
  ASSERT_TRUE(wait_for_file(dir_.path() / "0.pid"));
  ::kill(child.pid, SIGUSR1);
  EXPECT_EQ(wait_child(child.pid, std::chrono::seconds(10)), 128 + SIGUSR1);
  EXPECT_NE(read_text(child.out).find("[default0]:got USR1"), std::string::npos);
}

TEST_F(DdprunTest, SigkillAfterGraceForWorkersIgnoringSigterm) {
  Child child = spawn(cmd({"--standalone", "--nproc_per_node=2", "--stop_grace=0.3", "--no_python"},
                          {"/bin/sh", "-c",
                           "trap '' TERM; echo $$ > " + dir_.str() +
                               "/$LOCAL_RANK.pid; while true; do sleep 0.01; done"}),
                      base_env(), dir_.path());
  ASSERT_TRUE(wait_for_file(dir_.path() / "0.pid"));
  ASSERT_TRUE(wait_for_file(dir_.path() / "1.pid"));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const pid_t w0 = std::stoi(read_text(dir_.path() / "0.pid"));
  auto start = std::chrono::steady_clock::now();
  ::kill(child.pid, SIGTERM);
  EXPECT_EQ(wait_child(child.pid, std::chrono::seconds(10)), 128 + SIGTERM);
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(250));
  EXPECT_LT(took, std::chrono::seconds(3));
  EXPECT_TRUE(process_dead(w0)) << "the worker was reaped before ddprun exited";
  // Its children (sleep) got SIGKILL with the group and die a moment later.
  EXPECT_TRUE(eventually([&] { return live_members_of_group(w0).empty(); }));
}

// torch 2.x's name for the grace, from its variable: a worker that ignores
// SIGTERM is killed after 1 s, not the default 30.
TEST_F(DdprunTest, ShutdownTimeoutFromTorchsVariableEndsAWorkerIgnoringSigterm) {
  auto env = base_env();
  env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "1";
  Child child = spawn(
      cmd({"--standalone", "--nproc_per_node=1", "--no_python"},
          {"/bin/sh", "-c",
           "trap '' TERM; echo $$ > " + dir_.str() + "/0.pid; while true; do sleep 0.01; done"}),
      env, dir_.path());
  ASSERT_TRUE(wait_for_file(dir_.path() / "0.pid"));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const pid_t w0 = std::stoi(read_text(dir_.path() / "0.pid"));
  const auto start = std::chrono::steady_clock::now();
  ::kill(child.pid, SIGTERM);
  EXPECT_EQ(wait_child(child.pid, std::chrono::seconds(10)), 128 + SIGTERM);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(950));
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_TRUE(process_dead(w0));
}

// --virtual-local-rank: LOCAL_RANK=0 everywhere, each worker's own device in
// CUDA_VISIBLE_DEVICES (the local_rank-th of ddprun's).
TEST_F(DdprunTest, VirtualLocalRankGivesEachWorkerItsOwnDevice) {
  auto env = base_env();
  env["CUDA_VISIBLE_DEVICES"] = "4,6";
  auto result =
      run(cmd({"--standalone", "--nproc_per_node=2", "--virtual-local-rank", "--no_python"},
              {worker(), "env", dir_.str()}),
          env, dir_.path());
  ASSERT_EQ(result.code, 0) << result.err;
  for (int rank = 0; rank < 2; ++rank) {
    auto wenv = read_json(dir_.path() / ("env_" + std::to_string(rank) + "_0.json"))["env"];
    EXPECT_EQ(wenv["LOCAL_RANK"], "0") << rank;
    EXPECT_EQ(wenv["RANK"], std::to_string(rank));
    EXPECT_EQ(wenv["CUDA_VISIBLE_DEVICES"], rank == 0 ? "4" : "6");
  }
  // The console prefix keeps the real local rank, as torchrun's does.
  EXPECT_NE(result.out.find("[default1]:env written by rank 1"), std::string::npos) << result.out;
}

// --duplicate_stdout_filters: the matching lines of the tee'd ranks, prefixed,
// in attempt_<n>/filtered_stdout.log; a stream nobody tees copies nothing.
TEST_F(DdprunTest, DuplicateFiltersCopyMatchingTeedLines) {
  const fs::path logs = dir_.path() / "logs";
  auto result = run(
      cmd({"--standalone", "--nproc_per_node=2", "-t", "0:1", "--log_dir", logs.string(),
           "--duplicate-stdout-filters=keep,,me", "--duplicate_stderr_filters=oops", "--no_python"},
          {"/bin/sh", "-c",
           "echo \"keep,me $LOCAL_RANK\"; echo keep; echo \"oops $LOCAL_RANK\" >&2"}),
      base_env(), dir_.path());
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.err.find("--duplicate_stderr_filters copies lines of tee'd streams only"),
            std::string::npos)
      << result.err;
  std::vector<fs::path> runs;
  for (const auto& entry : fs::directory_iterator(logs)) runs.push_back(entry.path());
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(read_text(runs[0] / "attempt_0" / "filtered_stdout.log"), "[default0]:keep,me 0\n");
  EXPECT_FALSE(fs::exists(runs[0] / "attempt_0" / "filtered_stderr.log"));
  // The console and the rank's own log are as without the filters.
  EXPECT_NE(result.out.find("[default1]:keep,me 1"), std::string::npos) << result.out;
  EXPECT_EQ(read_text(runs[0] / "attempt_0" / "0" / "stdout.log"), "keep,me 0\nkeep\n");
}

// --numa_binding on this host's sysfs: two workers of an exclusive binding run
// on different CPUs, each on fewer than ddprun may use (skipped on a node
// with fewer than 2 physical cores).
TEST_F(DdprunTest, NumaBindingBindsEachWorkerBeforeExec) {
  auto allowed_list = [](const std::string& status) {
    const auto at = status.find("Cpus_allowed_list:");
    if (at == std::string::npos) return std::string();
    const auto start = status.find_first_not_of(" \t", at + 18);
    return status.substr(start, status.find('\n', start) - start);
  };
  auto result =
      run(cmd({"--standalone", "--nproc_per_node=2", "--numa_binding=exclusive", "--no_python"},
              {"/bin/sh", "-c", "cat /proc/self/status > " + dir_.str() + "/$LOCAL_RANK.status"}),
          base_env(), dir_.path());
  if (result.code == 2 && result.err.find("physical cores for") != std::string::npos) {
    GTEST_SKIP() << result.err;
  }
  ASSERT_EQ(result.code, 0) << result.err;
  const std::string mine = allowed_list(read_text("/proc/self/status"));
  const std::string rank0 = allowed_list(read_text(dir_.path() / "0.status"));
  const std::string rank1 = allowed_list(read_text(dir_.path() / "1.status"));
  EXPECT_FALSE(rank0.empty());
  EXPECT_FALSE(rank1.empty());
  EXPECT_NE(rank0, rank1);
  EXPECT_NE(rank0, mine);
  EXPECT_NE(rank1, mine);
}

TEST_F(DdprunTest, SignalWhileWaitingForOtherNodesExitsAtOnce) {
  const std::uint16_t port = free_port();
  Child child = spawn(
      cmd({"--nnodes=2", "--node_rank=0", "--master_port=" + std::to_string(port), "--no_python"},
          {worker(), "env", dir_.str()}),
      base_env(), dir_.path());
  // Node 0 serves the store once it waits in the rendezvous for node 1 (a fixed
  // sleep was not enough on a loaded machine: the signal came before the wait).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!port_listens(port) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(port_listens(port)) << read_text(child.err);
  auto start = std::chrono::steady_clock::now();
  ::kill(child.pid, SIGINT);
  EXPECT_EQ(wait_child(child.pid, std::chrono::seconds(10)), 128 + SIGINT);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_NE(read_text(child.err).find("received SIGINT while waiting for the other nodes"),
            std::string::npos)
      << read_text(child.err);
}

// ---------------------------------------------------------------- logs

TEST_F(DdprunTest, LinesArePrefixedAndNeverInterleaved) {
  auto result = run(cmd({"--standalone", "--nproc_per_node=4", "--no_python"},
                        {worker(), "lines", "1500", "300"}),
                    base_env(), dir_.path());
  ASSERT_EQ(result.code, 0) << result.err;
  auto lines = lines_of(result.out);
  EXPECT_EQ(lines.size(), 4u * 1500u);
  std::regex line_re(R"(^\[default([0-3])\]:r([0-3]) line ([0-9]+) ([a-d])+$)");
  std::map<int, int> next;
  for (const auto& line : lines) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << "cut line: " << line.substr(0, 120);
    ASSERT_EQ(m[1], m[2]);
    int rank = std::stoi(m[1]);
    EXPECT_EQ(std::stoi(m[3]), next[rank]++) << "lines of a worker stay in order";
    EXPECT_EQ(line.size(), std::string("[default0]:").size() + 300);
  }
  // Every worker line, and ddprun's one line of its own: torchrun's warning
  // that OMP_NUM_THREADS is set to 1 (4 workers, the variable unset).
  const auto err_lines = lines_of(result.err);
  EXPECT_EQ(err_lines.size(), 4u * 1500u + 1);
  EXPECT_EQ(std::count_if(err_lines.begin(), err_lines.end(),
                          [](const std::string& line) {
                            return line.starts_with("ddprun: warning: setting OMP_NUM_THREADS=1");
                          }),
            1);
}

TEST_F(DdprunTest, TeeAndRedirectFiles) {
  const std::string logs = dir_.str() + "/logs";
  // -t 3 for everyone except local rank 1, which redirects stdout (-r 1:1).
  auto result = run(cmd({"--standalone", "--nproc_per_node=2", "--rdzv_id=x", "--log-dir", logs,
                         "-t", "0:3", "-r", "1:1", "--no_python"},
                        {worker(), "lines", "3", "20"}),
                    base_env(), dir_.path());
  ASSERT_EQ(result.code, 0) << result.err;
  // Every run makes a fresh <log_dir>/<run_id>_<random>: find the one directory.
  std::vector<fs::path> runs;
  for (const auto& entry : fs::directory_iterator(logs)) runs.push_back(entry.path());
  ASSERT_EQ(runs.size(), 1u);
  const fs::path a0 = runs[0] / "attempt_0";
  std::string out0 = read_text(a0 / "0" / "stdout.log");
  std::string err0 = read_text(a0 / "0" / "stderr.log");
  std::string out1 = read_text(a0 / "1" / "stdout.log");
  EXPECT_EQ(lines_of(out0).size(), 3u);
  EXPECT_TRUE(out0.starts_with("r0 line 0 ")) << "files hold raw lines, no prefix: " << out0;
  EXPECT_EQ(err0, "err 0 0\nerr 0 1\nerr 0 2\n");
  EXPECT_TRUE(out1.starts_with("r1 line 0 ")) << out1;
  EXPECT_FALSE(fs::exists(a0 / "1" / "stderr.log"));
  // Console: tee'd rank 0 stdout with prefix; redirected rank 1 stdout absent.
  EXPECT_NE(result.out.find("[default0]:r0 line 2"), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("r1 line"), std::string::npos) << result.out;
  EXPECT_NE(result.err.find("[default1]:err 1 0"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("[default0]:err 0 0"), std::string::npos) << result.err;
}

// A c10d endpoint on this host (the agent hosts the store): unlike
// --standalone, it keeps the given --rdzv_id, so the log paths are known.
std::string local_endpoint() { return "127.0.0.1:" + std::to_string(free_port()); }

// A shared --log_dir: somebody planted a symlink where a log file of the
// run would have gone before every run made a fresh folder of its own.
TEST_F(DdprunTest, SymlinkPlantedAsLogFileIsNeverFollowed) {
  const fs::path root = fs::canonical(dir_.path());
  const fs::path victim = root / "victim";
  std::ofstream(victim) << "precious";
  const fs::path attempt = root / "logs" / "job" / "attempt_0" / "0";
  fs::create_directories(attempt);
  fs::create_symlink(victim, attempt / "stdout.log");
  auto result =
      run(cmd({"--rdzv_backend=c10d", "--rdzv_endpoint=" + local_endpoint(), "--rdzv_id=job",
               "--log_dir", (root / "logs").string(), "-r", "3", "--no_python"},
              {worker(), "exit", "0"}),
          base_env(), dir_.path());
  EXPECT_EQ(result.code, 0) << result.err;
  EXPECT_EQ(read_text(victim), "precious");
  EXPECT_EQ(
      result.err.find("ddprun: logs of this run in " + (root / "logs" / "job").string() + "\n"),
      std::string::npos)
      << result.err;
}

TEST_F(DdprunTest, SymlinkPlantedAsRunLogDirectoryIsNeverFollowed) {
  const fs::path root = fs::canonical(dir_.path());
  fs::create_directories(root / "elsewhere");
  fs::create_directories(root / "logs");
  fs::create_directory_symlink(root / "elsewhere", root / "logs" / "job");
  auto result = run(cmd({"--rdzv_backend=c10d", "--rdzv_endpoint=" + local_endpoint(),
                         "--rdzv_id=job", "--log_dir", (root / "logs").string(), "--no_python"},
                        {worker(), "exit", "0"}),
                    base_env(), dir_.path());
  EXPECT_EQ(result.code, 0) << result.err;
  EXPECT_TRUE(fs::is_empty(root / "elsewhere"));
}

TEST_F(DdprunTest, SymlinkPlantedAsAttemptDirectoryIsNeverFollowed) {
  const fs::path root = fs::canonical(dir_.path());
  fs::create_directories(root / "elsewhere");
  fs::create_directories(root / "logs" / "job");
  fs::create_directory_symlink(root / "elsewhere", root / "logs" / "job" / "attempt_0");
  auto result = run(cmd({"--rdzv_backend=c10d", "--rdzv_endpoint=" + local_endpoint(),
                         "--rdzv_id=job", "--log_dir", (root / "logs").string(), "--no_python"},
                        {worker(), "exit", "0"}),
                    base_env(), dir_.path());
  EXPECT_EQ(result.code, 0) << result.err;
  EXPECT_TRUE(fs::is_empty(root / "elsewhere")) << "a directory was created through the link";
}

TEST_F(DdprunTest, FifoAsErrorFileDoesNotHangTheReport) {
  const fs::path root = fs::canonical(dir_.path());
  auto result = run(cmd({"--rdzv_backend=c10d", "--rdzv_endpoint=" + local_endpoint(),
                         "--rdzv_id=job", "--log_dir", (root / "logs").string(), "--no_python"},
                        {worker(), "error_fifo", "3"}),
                    base_env(), dir_.path(), std::chrono::seconds(20));
  ASSERT_EQ(result.code, 3) << "a hang shows as -1: " << result.err;
  std::vector<fs::path> runs;
  for (const auto& entry : fs::directory_iterator(root / "logs")) runs.push_back(entry.path());
  ASSERT_EQ(runs.size(), 1u);
  ASSERT_TRUE(runs[0].filename().string().starts_with("job_")) << runs[0];
  const std::string error_file = (runs[0] / "attempt_0" / "0" / "error.json").string();
  EXPECT_NE(result.err.find("FAILED"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("error_file: " + error_file), std::string::npos) << result.err;
  EXPECT_NE(result.err.find(error_file + " is a FIFO, not a regular file"), std::string::npos)
      << result.err;
}

TEST_F(DdprunTest, LocalRanksFilterAndPrefixTemplate) {
  auto env = base_env();
  env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "<${role_name}|${rank}|${local_rank}> ";
  auto result = run(cmd({"--standalone", "--nproc_per_node=3", "--role=trainer",
                         "--local_ranks_filter=1,2", "--no_python"},
                        {worker(), "lines", "2", "12"}),
                    env, dir_.path());
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_EQ(result.out.find("r0 line"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("<trainer|1|1> r1 line 0"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("<trainer|2|2> r2 line 1"), std::string::npos) << result.out;
  EXPECT_EQ(lines_of(result.out).size(), 4u);
}

// ---------------------------------------------------------------- command line

struct BadLine {
  std::vector<std::string> args;
  std::string message;
};

TEST_F(DdprunTest, BadCommandLinesGetOneLineAndExitCode2) {
  const std::string w = "W";  // expands to: test_worker env <dir>
  const std::vector<BadLine> cases = {
      {{"--nproc_per_node=x", w}, "--nproc_per_node: expected a positive integer"},
      {{"--nproc_per_node=0", w}, "--nproc_per_node: expected a positive integer"},
      {{"--nnodes=3:2", w}, "--nnodes: expected 0 < MIN <= MAX"},
      {{"--nnodes=two", w}, "--nnodes: expected N or MIN:MAX"},
      {{"--nnodes=1:2", w}, "the static backend needs a fixed number of nodes"},
      {{"--rdzv_backend=zookeeper", w}, "--rdzv_backend: expected static, c10d or etcd"},
      {{"--rdzv_backend=etcd", w},
       "--rdzv_backend=etcd needs --rdzv_endpoint host[:port][,host[:port]...]"},
      {{"--rdzv_backend=etcd-v2", w}, "etcd's v2 API is not supported"},
      {{"--rdzv_backend=etcd", "--rdzv_endpoint=h1:2379,h2:99999", w},
       "--rdzv_endpoint: expected host[:port]"},
      {{"--rdzv_backend=etcd", "--rdzv_endpoint=h1:2379,", w}, "--rdzv_endpoint: trailing ','"},
      {{"--rdzv_backend=etcd", "--rdzv_endpoint=h1", "--rdzv_conf=protocol=ftp", w},
       "protocol: expected http or https, got 'ftp'"},
      {{"--rdzv_backend=etcd", "--rdzv_endpoint=h1", "--rdzv_conf=cacert=/nonexistent.pem", w},
       "cacert: cannot read '/nonexistent.pem'"},
      {{"--rdzv_backend=c10d", "--rdzv_endpoint=h1", "--rdzv_conf=username=u", w},
       "username: only for --rdzv_backend=etcd"},
      {{"--rdzv_backend=c10d", w}, "needs --rdzv_endpoint"},
      {{"--rdzv_backend=c10d", "--rdzv_endpoint=host:99999", w},
       "--rdzv_endpoint: expected host[:port]"},
      {{"--rdzv_conf=join_timeout", w}, "--rdzv_conf: expected key=value"},
      {{"--rdzv_conf=join_timeout=soon", w}, "join_timeout: expected a non-negative number"},
      {{"--rdzv_conf=keepalive=3", w}, "--rdzv_conf: unknown key 'keepalive' (known: join_timeout"},
      {{"--rdzv_conf=keep_alive_interval=0", w},
       "keep_alive_interval: expected a positive number of seconds"},
      {{"--rdzv_conf=keep_alive_max_attempt=0", w},
       "keep_alive_max_attempt: expected a positive integer"},
      {{"--rdzv_conf=is_host=maybe", w}, "is_host: expected true or false, got 'maybe'"},
      {{"--nnodes=2", "--node_rank=2", w}, "--node_rank: expected an integer in [0, 2)"},
      {{"--master_port=70000", w}, "--master_port: expected a port in 1..65535"},
      {{"--max_restarts=-1", w}, "--max_restarts: expected a non-negative integer"},
      {{"--monitor_interval=0", w}, "--monitor_interval: expected a positive number"},
      {{"-r", "5", w}, "-r/--redirects: expected 0 (none)"},
      {{"--tee=0:9", w}, "-t/--tee: expected 0 (none)"},
      {{"--nproc_per_node=2", "-r", "3:1", w}, "local rank 3 does not exist"},
      {{"--nproc_per_node=2", "--local_ranks_filter=0,2", w},
       "--local_ranks_filter: expected comma-separated local ranks in [0, 2)"},
      {{"--signals_to_handle=SIGKILL", w}, "unknown or unsupported signal 'SIGKILL'"},
      {{"--exit_barrier_timeout=-3", w}, "--exit_barrier_timeout: expected a non-negative number"},
      {{"--standalone", "--nnodes=2", w}, "--standalone runs a single node"},
      {{"--no_python", "-m", "pkg"}, "--no_python and -m/--module cannot be used together"},
      {{"--role", "", w}, "--role: must not be empty"},
      {{"--start_method=thread", w}, "--start_method: expected spawn, fork or forkserver"},
      {{"--bogus", w}, "unrecognized option '--bogus'"},
      {{"--nproc_per_node"}, "option --nproc_per_node needs a value"},
      {{}, "missing the program to run"},
      {{"--no_python", "/nonexistent/prog"}, "program '/nonexistent/prog' not found"},
      {{"--no_python", "no-such-program-xyz"},
       "not found or not executable (searched the current directory and PATH)"},
      {{"missing_script.py"}, "program 'missing_script.py' not found"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv{ddprun()};
    for (const auto& arg : c.args) {
      if (arg == "W") {
        // If anything started, the worker would write an env file into dir_.
        argv.insert(argv.end(), {worker(), "env", dir_.str()});
      } else {
        argv.push_back(arg);
      }
    }
    std::string shown;
    for (const auto& a : c.args) shown += a + " ";
    auto result = run(argv, base_env(), dir_.path());
    EXPECT_EQ(result.code, 2) << shown << "\n" << result.err;
    EXPECT_TRUE(result.out.empty()) << shown;
    EXPECT_EQ(lines_of(result.err).size(), 1u) << shown << "\n" << result.err;
    EXPECT_TRUE(result.err.starts_with("ddprun: error: ")) << shown << result.err;
    EXPECT_NE(result.err.find(c.message), std::string::npos)
        << shown << "\nexpected: " << c.message << "\ngot: " << result.err;
  }
  EXPECT_TRUE(fs::is_empty(dir_.path())) << "a worker was started";
}

// The live view beyond loopback without a store token: refused (exit 2, one
// line, no worker started) unless --status_allow_no_token, which warns.
TEST_F(DdprunTest, ALiveViewBeyondLoopbackWithoutATokenIsRefusedUnlessAllowedWithAWarning) {
  const auto refused = run(cmd({"--standalone", "--nproc_per_node=1", "--status_port=0",
                                "--status_host=0.0.0.0", "--no_python"},
                               {worker(), "env", dir_.str()}),
                           base_env(), dir_.path());
  EXPECT_EQ(refused.code, 2) << refused.err;
  EXPECT_EQ(lines_of(refused.err).size(), 1u) << refused.err;
  EXPECT_TRUE(
      refused.err.starts_with("ddprun: error: --status_host: '0.0.0.0' is beyond "
                              "loopback and the store has no token"))
      << refused.err;
  EXPECT_NE(refused.err.find("--status_allow_no_token"), std::string::npos) << refused.err;
  EXPECT_TRUE(fs::is_empty(dir_.path())) << "a worker was started";

  const std::string warning = "the live view listens on 0.0.0.0 beyond loopback without a token";
  const auto allowed = run(cmd({"--standalone", "--nproc_per_node=1", "--status_port=0",
                                "--status_host=0.0.0.0", "--status_allow_no_token", "--no_python"},
                               {worker(), "exit", "0"}),
                           base_env(), dir_.path());
  EXPECT_EQ(allowed.code, 0) << allowed.err;
  EXPECT_NE(allowed.err.find(warning), std::string::npos) << allowed.err;
  EXPECT_NE(allowed.err.find("live view at http://0.0.0.0:"), std::string::npos) << allowed.err;

  auto env = base_env();
  env["DDP_STORE_TOKEN"] = "s3cret";
  const auto with_token = run(cmd({"--standalone", "--nproc_per_node=1", "--status_port=0",
                                   "--status_host=0.0.0.0", "--no_python"},
                                  {worker(), "exit", "0"}),
                              env, dir_.path());
  EXPECT_EQ(with_token.code, 0) << with_token.err;
  EXPECT_EQ(with_token.err.find(warning), std::string::npos) << with_token.err;
  EXPECT_NE(with_token.err.find("clients must carry the store's token"), std::string::npos)
      << with_token.err;
}

TEST_F(DdprunTest, BadPetValueNamesTheVariable) {
  auto env = base_env();
  env["PET_MAX_RESTARTS"] = "many";
  auto result = run({ddprun(), "--no_python", worker(), "exit", "0"}, env, dir_.path());
  EXPECT_EQ(result.code, 2);
  EXPECT_NE(result.err.find("--max_restarts (from PET_MAX_RESTARTS)"), std::string::npos)
      << result.err;
}

TEST_F(DdprunTest, MasterPortInUseIsAClearError) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  auto result = run(cmd({"--master_port=" + port, "--no_python"}, {worker(), "env", dir_.str()}),
                    base_env(), dir_.path());
  ::close(fd);
  EXPECT_EQ(result.code, 1);
  EXPECT_NE(result.err.find("port " + port), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("in use"), std::string::npos) << result.err;
  EXPECT_FALSE(fs::exists(dir_.path() / "env_0_0.json"));
}

TEST_F(DdprunTest, HelpAndVersion) {
  auto help = run({ddprun(), "--help"}, base_env(), dir_.path());
  EXPECT_EQ(help.code, 0);
  for (const char* flag : {"--nnodes",
                           "--nproc_per_node,--nproc-per-node",
                           "--standalone",
                           "--rdzv_backend",
                           "--rdzv_endpoint",
                           "--rdzv_id",
                           "--rdzv_conf",
                           "--node_rank",
                           "--master_addr",
                           "--master_port",
                           "--local_addr",
                           "--max_restarts",
                           "--monitor_interval",
                           "--role",
                           "--no_python",
                           "-m,--module",
                           "--log_dir",
                           "-r,--redirects",
                           "-t,--tee",
                           "--local_ranks_filter",
                           "--signals_to_handle",
                           "--exit_barrier_timeout",
                           "--version",
                           "usage: ddprun"}) {
    EXPECT_NE(help.out.find(flag), std::string::npos) << flag;
  }
  auto version = run({ddprun(), "--version"}, base_env(), dir_.path());
  EXPECT_EQ(version.code, 0);
  EXPECT_TRUE(version.out.starts_with("ddprun ")) << version.out;
}

// ---------------------------------------------------------------- Python

TEST_F(DdprunTest, PythonProgramRunsUnbufferedWithPython3) {
  // A fake python3 first on PATH shows what ddprun executes.
  fs::create_directories(dir_.path() / "bin");
  {
    std::ofstream fake(dir_.path() / "bin" / "python3");
    fake << "#!/bin/sh\necho \"python3 $*\"\n";
  }
  fs::permissions(dir_.path() / "bin" / "python3", fs::perms::owner_all);
  std::ofstream(dir_.path() / "train.py") << "print('hi')\n";
  auto env = base_env();
  env["PATH"] = dir_.str() + "/bin:" + env["PATH"];
  auto script =
      run(cmd({"--standalone"}, {(dir_.path() / "train.py").string(), "--lr", "${local_rank}"}),
          env, dir_.path());
  EXPECT_EQ(script.code, 0) << script.err;
  EXPECT_EQ(script.out,
            "[default0]:python3 -u " + (dir_.path() / "train.py").string() + " --lr 0\n");
  auto module = run(cmd({"--standalone", "-m"}, {"pkg.mod", "x"}), env, dir_.path());
  EXPECT_EQ(module.code, 0) << module.err;
  EXPECT_EQ(module.out, "[default0]:python3 -u -m pkg.mod x\n");
}

// A Python program writes no progress pages: an explicit --hang_timeout
// says at start, once, which hangs it can and cannot see; the default says
// nothing (it ends no rank of such a program).
TEST_F(DdprunTest, AnExplicitHangTimeoutSaysWhatItCanSeeOfAPythonProgram) {
  fs::create_directories(dir_.path() / "bin");
  {
    std::ofstream fake(dir_.path() / "bin" / "python3");
    fake << "#!/bin/sh\nexit 0\n";
  }
  fs::permissions(dir_.path() / "bin" / "python3", fs::perms::owner_all);
  std::ofstream(dir_.path() / "train.py") << "pass\n";
  auto env = base_env();
  env["PATH"] = dir_.str() + "/bin:" + env["PATH"];
  const std::string script = (dir_.path() / "train.py").string();
  const std::string note =
      "--hang_timeout=30: Python workers write progress pages only on the backend \"ddp\" "
      "(import ddp_torch); on another backend the only hang ddprun can see is a rank still "
      "running 30 s after every other rank exited 0";
  auto given = run(cmd({"--standalone", "--nproc_per_node=2", "--hang_timeout=30"}, {script}), env,
                   dir_.path());
  EXPECT_EQ(given.code, 0) << given.err;
  const auto at = given.err.find(note);
  EXPECT_NE(at, std::string::npos) << given.err;
  EXPECT_EQ(given.err.rfind(note), at) << "said once\n" << given.err;
  EXPECT_NE(given.err.find("a collective that never completes and a rank stuck in its own code "
                           "are not seen"),
            std::string::npos)
      << given.err;
  auto by_default = run(cmd({"--standalone", "--nproc_per_node=2"}, {script}), env, dir_.path());
  EXPECT_EQ(by_default.code, 0) << by_default.err;
  EXPECT_EQ(by_default.err.find("progress pages"), std::string::npos) << by_default.err;
}

// PyTorch scripts themselves, under ddprun and torchrun side by side, are
// tests/pytorch's matrix. Here: the note for a Python without torch.

// A python3 first on PATH that cannot import torch: /usr/bin/python3 with -S,
// which leaves site- and dist-packages out of sys.path.
class PythonWithoutTorchTest : public DdprunTest {
 protected:
  void SetUp() override {
    if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "/usr/bin/python3 not found";
    fs::create_directories(dir_.path() / "bin");
    std::ofstream(python()) << "#!/bin/sh\nexec /usr/bin/python3 -S \"$@\"\n";
    fs::permissions(python(), fs::perms::owner_all);
    std::ofstream(script()) << "import torch\n";
    fs::create_directories(dir_.path() / "pkg");
    std::ofstream(dir_.path() / "pkg" / "__init__.py");
    std::ofstream(dir_.path() / "pkg" / "train.py") << "import torch\n";
    env_ = base_env();
    env_["PATH"] = dir_.str() + "/bin:" + env_["PATH"];
    env_["PYTHONPATH"] = dir_.str();  // for -m pkg.train
  }

  std::string python() const { return dir_.str() + "/bin/python3"; }
  std::string script() const { return dir_.str() + "/train.py"; }

  // The note's first line right after the report, and its advice.
  void expect_note(const RunResult& result, const std::string& program, const std::string& origin) {
    EXPECT_EQ(result.code, 1) << result.err;
    EXPECT_NE(result.err.find("ModuleNotFoundError: No module named 'torch'"), std::string::npos)
        << result.err;
    const std::string note = "=\nddprun: note: the workers ran " + program + " with " + python() +
                             " (" + origin + "), which has no module named 'torch'\n";
    EXPECT_NE(result.err.find(note), std::string::npos) << "expected:\n"
                                                        << note << "got:\n"
                                                        << result.err;
    EXPECT_NE(result.err.find("ddprun: note: if " + program +
                              " uses PyTorch, set PYTHON_EXEC to a "
                              "Python that has it, e.g. PYTHON_EXEC=/usr/bin/python3 ddprun ...\n"),
              std::string::npos)
        << result.err;
  }

  std::map<std::string, std::string> env_;
};

TEST_F(PythonWithoutTorchTest, ReportOfAScriptNamesThePythonAndPythonExec) {
  auto result = run(cmd({"--standalone", "--nproc_per_node=2"}, {script()}), env_, dir_.path());
  expect_note(result, script(), "the first python3 on PATH");
}

TEST_F(PythonWithoutTorchTest, ReportOfAModuleNamesThePythonAndPythonExec) {
  auto result = run(cmd({"--standalone", "-m"}, {"pkg.train"}), env_, dir_.path());
  expect_note(result, "pkg.train", "the first python3 on PATH");
}

TEST_F(PythonWithoutTorchTest, ReportSaysThePythonCameFromPythonExec) {
  auto env = env_;
  env["PYTHON_EXEC"] = python();
  env["PATH"] = base_env()["PATH"];
  auto result = run(cmd({"--standalone"}, {script()}), env, dir_.path());
  expect_note(result, script(), "$PYTHON_EXEC");
}

TEST_F(PythonWithoutTorchTest, NoNoteForAProgramRunDirectly) {
  auto result =
      run(cmd({"--standalone", "--no_python"}, {worker(), "exit", "3"}), env_, dir_.path());
  EXPECT_EQ(result.code, 3) << result.err;
  EXPECT_NE(result.err.find(" FAILED\n"), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("ddprun: note"), std::string::npos) << result.err;
}

TEST_F(DdprunTest, NoNoteWhenThePythonHasTorch) {
  if (std::system("/usr/bin/python3 -c 'import importlib.util, sys; "
                  "sys.exit(importlib.util.find_spec(\"torch\") is None)' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 has no torch";
  }
  std::ofstream(dir_.path() / "fails.py") << "raise SystemExit(3)\n";
  auto env = base_env();
  env["PYTHON_EXEC"] = "/usr/bin/python3";
  auto result = run(cmd({"--standalone"}, {(dir_.path() / "fails.py").string()}), env, dir_.path());
  EXPECT_EQ(result.code, 3) << result.err;
  EXPECT_NE(result.err.find("fails.py FAILED\n"), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("ddprun: note"), std::string::npos) << result.err;
}

}  // namespace
}  // namespace ddp::test
