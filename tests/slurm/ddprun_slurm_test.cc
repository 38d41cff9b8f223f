// ddprun in a faked SLURM environment: the real ddprun binary (DDP_BUILD_BIN)
// with SLURM_* variables set as srun sets them, two agents on this machine as
// node 0 and node 1 of a job whose first host is `localhost`, and
// ddprun_test_worker dumping every worker's environment. Checks what ddprun
// derives from SLURM (ranks, sizes, run id, store address and port, workers
// per node), that flags and PET_* variables win, that --standalone and
// --rdzv_endpoint leave SLURM alone, and the one-line errors for bad values.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <random>

#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include "net_util.h"
#include "process_util.h"

namespace ddp::test {
namespace {

using ::testing::HasSubstr;

std::string ddprun() { return bin_dir() + "/ddprun"; }
std::string worker() { return bin_dir() + "/ddprun_test_worker"; }

// Whether `port` can be bound on every interface right now.
bool port_free(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(port);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// A job id whose store port (20000 + id mod 10000) is free now.
std::uint64_t job_id_with_free_port() {
  std::mt19937 rng(std::random_device{}());
  for (int attempt = 0; attempt < 200; ++attempt) {
    const std::uint64_t id = 4000000 + std::uniform_int_distribution<std::uint64_t>(0, 9999)(rng);
    if (port_free(static_cast<std::uint16_t>(20000 + id % 10000))) return id;
  }
  ADD_FAILURE() << "no free port in 20000..29999";
  return 0;
}

std::uint16_t store_port_of(std::uint64_t job_id) {
  return static_cast<std::uint16_t>(20000 + job_id % 10000);
}

std::vector<std::string> cmd(std::vector<std::string> ddprun_args,
                             std::vector<std::string> program) {
  std::vector<std::string> argv{ddprun()};
  argv.insert(argv.end(), ddprun_args.begin(), ddprun_args.end());
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

class SlurmDdprunTest : public ::testing::Test {
 protected:
  // What srun gives the task on node `node` of a `nodes`-node step.
  std::map<std::string, std::string> srun_env(std::uint64_t job_id, int nodes, int node,
                                              const std::string& nodelist) {
    auto env = base_env();
    env["SLURM_JOB_ID"] = std::to_string(job_id);
    env["SLURM_JOBID"] = std::to_string(job_id);
    env["SLURM_NNODES"] = std::to_string(nodes);
    env["SLURM_JOB_NUM_NODES"] = std::to_string(nodes);
    env["SLURM_NODEID"] = std::to_string(node);
    env["SLURM_STEP_ID"] = "0";
    env["SLURM_STEPID"] = "0";
    env["SLURM_JOB_NODELIST"] = nodelist;
    env["SLURM_NODELIST"] = nodelist;
    env["SLURM_STEP_NODELIST"] = nodelist;
    env["SLURM_STEP_NUM_NODES"] = std::to_string(nodes);
    env["SLURM_NTASKS"] = std::to_string(nodes);
    env["SLURM_NTASKS_PER_NODE"] = "1";
    env["SLURM_PROCID"] = std::to_string(node);
    env["SLURM_LOCALID"] = "0";
    return env;
  }

  // Every worker's environment, by RANK.
  std::map<int, nlohmann::json> worker_envs(const fs::path& dir) {
    std::map<int, nlohmann::json> envs;
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("env_", 0) != 0 || !name.ends_with(".json")) continue;
      auto data = nlohmann::json::parse(read_text(entry.path()))["env"];
      envs[std::stoi(data["RANK"].get<std::string>())] = data;
    }
    return envs;
  }

  // Runs one agent with `args` over ddprun_test_worker (which dumps each
  // worker's environment into out_), expects it to succeed, and returns the
  // workers' environments by RANK.
  std::map<int, nlohmann::json> run_one_node(const std::vector<std::string>& args,
                                             const std::map<std::string, std::string>& env) {
    auto result =
        run(cmd(args, {worker(), "env", out_.str()}), env, dir_.path(), std::chrono::seconds(60));
    EXPECT_EQ(result.code, 0) << result.err;
    return worker_envs(out_.path());
  }

  // Runs two agents as node 0 and node 1 (node 1 first: node 0 hosts the
  // store and node 1 must wait for it) and returns their exit codes.
  std::pair<int, int> run_two_nodes(const std::vector<std::string>& args,
                                    const std::map<std::string, std::string>& env0,
                                    const std::map<std::string, std::string>& env1) {
    const auto program = std::vector<std::string>{worker(), "env", out_.str()};
    Child node1 = spawn(cmd(args, program), env1, dir_.path(), "node1");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Child node0 = spawn(cmd(args, program), env0, dir_.path(), "node0");
    const int code0 = wait_child(node0.pid, std::chrono::seconds(60));
    const int code1 = wait_child(node1.pid, std::chrono::seconds(60));
    logs_ = "node0: " + read_text(node0.err) + "\nnode1: " + read_text(node1.err);
    return {code0, code1};
  }

  TempDir dir_{"ddp-slurm-test"};
  TempDir out_{"ddp-slurm-env"};
  std::string logs_;
};

TEST_F(SlurmDdprunTest, TwoNodesStaticBackendFromTheJob) {
  const std::uint64_t job = job_id_with_free_port();
  auto env0 = srun_env(job, 2, 0, "localhost,node02");
  auto env1 = srun_env(job, 2, 1, "localhost,node02");
  env0["SLURM_NTASKS_PER_NODE"] = env1["SLURM_NTASKS_PER_NODE"] = "2";
  env1["DDP_LOG_LEVEL"] = "info";
  auto [code0, code1] = run_two_nodes({"--no_python"}, env0, env1);
  ASSERT_EQ(code0, 0) << logs_;
  ASSERT_EQ(code1, 0) << logs_;
  // Each agent says what it took from the job.
  EXPECT_NE(
      logs_.find("from SLURM: --master_addr=localhost (the first host of SLURM_STEP_NODELIST), "
                 "--master_port=" +
                 std::to_string(store_port_of(job)) +
                 " (20000 + SLURM_JOB_ID mod 10000), --nnodes=2 (SLURM_NNODES), "
                 "--node_rank=1 (SLURM_NODEID), --nproc_per_node=2 (SLURM_NTASKS_PER_NODE), "
                 "--rdzv_id=" +
                 std::to_string(job) + " (SLURM_JOB_ID)"),
      std::string::npos)
      << logs_;

  auto envs = worker_envs(out_.path());
  ASSERT_EQ(envs.size(), 4u) << logs_;
  for (const auto& [rank, wenv] : envs) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(wenv["WORLD_SIZE"], "4");
    EXPECT_EQ(wenv["LOCAL_WORLD_SIZE"], "2");  // SLURM_NTASKS_PER_NODE
    EXPECT_EQ(wenv["LOCAL_RANK"], std::to_string(rank % 2));
    EXPECT_EQ(wenv["GROUP_RANK"], std::to_string(rank / 2));
    EXPECT_EQ(wenv["GROUP_RANK"], wenv["SLURM_NODEID"]);  // node rank = SLURM_NODEID
    EXPECT_EQ(wenv["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(wenv["TORCHELASTIC_RUN_ID"], std::to_string(job));
    // The first host is loopback: node 0 is reached at 127.0.0.1.
    EXPECT_EQ(wenv["MASTER_ADDR"], "127.0.0.1");
    // The static backend's store: node 0's agent, at the first host of the
    // node list (node 0 itself reaches a loopback store at 127.0.0.1) and the
    // job's port.
    EXPECT_EQ(wenv["DDP_STORE_ADDR"], rank < 2 ? "127.0.0.1" : "localhost");
    EXPECT_EQ(wenv["DDP_STORE_PORT"], std::to_string(store_port_of(job)));
  }
}

TEST_F(SlurmDdprunTest, TwoNodesC10dBackendFromTheJob) {
  const std::uint64_t job = job_id_with_free_port();
  auto env0 = srun_env(job, 2, 0, "localhost,node02");
  auto env1 = srun_env(job, 2, 1, "localhost,node02");
  // SLURM's per-node form: 3 workers on node 0, 1 on node 1.
  env0["SLURM_NTASKS_PER_NODE"] = env1["SLURM_NTASKS_PER_NODE"] = "3,1";
  auto [code0, code1] = run_two_nodes({"--rdzv_backend=c10d", "--no_python"}, env0, env1);
  ASSERT_EQ(code0, 0) << logs_;
  ASSERT_EQ(code1, 0) << logs_;

  auto envs = worker_envs(out_.path());
  ASSERT_EQ(envs.size(), 4u) << logs_;
  for (const auto& [rank, wenv] : envs) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(wenv["WORLD_SIZE"], "4");
    // Node 1 arrived first, yet group ranks follow SLURM_NODEID.
    const std::string node = rank < 3 ? "0" : "1";
    EXPECT_EQ(wenv["SLURM_NODEID"], node);
    EXPECT_EQ(wenv["GROUP_RANK"], node);
    EXPECT_EQ(wenv["LOCAL_WORLD_SIZE"], rank < 3 ? "3" : "1");
    EXPECT_EQ(wenv["TORCHELASTIC_RUN_ID"], std::to_string(job));
    EXPECT_EQ(wenv["MASTER_ADDR"], "127.0.0.1");
  }
}

TEST_F(SlurmDdprunTest, GpusOnNodeSetTheWorkersPerNode) {
  const std::uint64_t job = job_id_with_free_port();
  auto env = srun_env(job, 1, 0, "localhost");
  env["SLURM_GPUS_ON_NODE"] = "3";
  env["SLURM_NTASKS_PER_NODE"] = "1";
  auto envs = run_one_node({"--no_python"}, env);
  ASSERT_EQ(envs.size(), 3u);
  for (const auto& [rank, wenv] : envs) {
    EXPECT_EQ(wenv["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(wenv["WORLD_SIZE"], "3");
    EXPECT_EQ(wenv["TORCHELASTIC_RUN_ID"], std::to_string(job));
  }
}

// SLURM says 2 nodes, node 1, a malformed node list, 4 GPUs: every flag given
// wins, and the variables flags override are not even read.
TEST_F(SlurmDdprunTest, ExplicitFlagsWin) {
  const std::uint16_t port = free_port();
  auto env = srun_env(job_id_with_free_port(), 2, 1, "node[03-01]");
  env["SLURM_GPUS_ON_NODE"] = "4";
  auto envs =
      run_one_node({"--nnodes=1", "--node_rank=0", "--rdzv_id=mine", "--master_addr=127.0.0.1",
                    "--master_port=" + std::to_string(port), "--nproc_per_node=1", "--no_python"},
                   env);
  ASSERT_EQ(envs.size(), 1u);
  EXPECT_EQ(envs[0]["WORLD_SIZE"], "1");
  EXPECT_EQ(envs[0]["GROUP_RANK"], "0");
  EXPECT_EQ(envs[0]["TORCHELASTIC_RUN_ID"], "mine");
  EXPECT_EQ(envs[0]["DDP_STORE_PORT"], std::to_string(port));
}

// torchrun treats PET_<NAME> as the flag: it wins over SLURM too.
TEST_F(SlurmDdprunTest, PetVariablesWin) {
  const std::uint16_t port = free_port();
  auto env = srun_env(job_id_with_free_port(), 2, 1, "node[03-01]");
  env["SLURM_GPUS_ON_NODE"] = "4";
  env["PET_NNODES"] = "1";
  env["PET_NODE_RANK"] = "0";
  env["PET_RDZV_ID"] = "from-pet";
  env["PET_MASTER_ADDR"] = "127.0.0.1";
  env["PET_MASTER_PORT"] = std::to_string(port);
  env["PET_NPROC_PER_NODE"] = "2";
  auto envs = run_one_node({"--no_python"}, env);
  ASSERT_EQ(envs.size(), 2u);
  EXPECT_EQ(envs[0]["WORLD_SIZE"], "2");
  EXPECT_EQ(envs[0]["TORCHELASTIC_RUN_ID"], "from-pet");
  EXPECT_EQ(envs[0]["DDP_STORE_PORT"], std::to_string(port));
}

// Flags win one by one: the rest still comes from SLURM.
TEST_F(SlurmDdprunTest, SomeFlagsGivenTheRestFromTheJob) {
  const std::uint64_t job = job_id_with_free_port();
  auto env = srun_env(job, 1, 0, "localhost");
  env["SLURM_GPUS_ON_NODE"] = "4";
  auto envs = run_one_node({"--nproc_per_node=2", "--no_python"}, env);
  ASSERT_EQ(envs.size(), 2u);
  EXPECT_EQ(envs[0]["LOCAL_WORLD_SIZE"], "2");
  EXPECT_EQ(envs[0]["TORCHELASTIC_RUN_ID"], std::to_string(job));
  EXPECT_EQ(envs[0]["DDP_STORE_PORT"], std::to_string(store_port_of(job)));
}

TEST_F(SlurmDdprunTest, StandaloneIgnoresSlurm) {
  const std::uint64_t job = job_id_with_free_port();
  auto env = srun_env(job, 2, 1, "node[03-01]");
  env["SLURM_NNODES"] = "two";
  env["SLURM_GPUS_ON_NODE"] = "3";
  auto envs = run_one_node({"--standalone", "--no_python"}, env);
  ASSERT_EQ(envs.size(), 1u);
  EXPECT_EQ(envs[0]["WORLD_SIZE"], "1");
  EXPECT_NE(envs[0]["TORCHELASTIC_RUN_ID"], std::to_string(job));
}

TEST_F(SlurmDdprunTest, RdzvEndpointIgnoresSlurm) {
  const std::uint16_t port = free_port();
  auto env = srun_env(job_id_with_free_port(), 2, 1, "node[03-01]");
  env["SLURM_NNODES"] = "two";
  env["SLURM_GPUS_ON_NODE"] = "3";
  auto envs = run_one_node(
      {"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--no_python"},
      env);
  ASSERT_EQ(envs.size(), 1u);
  EXPECT_EQ(envs[0]["WORLD_SIZE"], "1");
  EXPECT_EQ(envs[0]["TORCHELASTIC_RUN_ID"], "none");
}

TEST_F(SlurmDdprunTest, WithoutJobIdSlurmVariablesAreIgnored) {
  const std::uint16_t port = free_port();
  auto env = srun_env(1, 2, 1, "node[03-01]");
  env.erase("SLURM_JOB_ID");
  env["SLURM_GPUS_ON_NODE"] = "3";
  auto envs = run_one_node({"--master_port=" + std::to_string(port), "--no_python"}, env);
  ASSERT_EQ(envs.size(), 1u);
  EXPECT_EQ(envs[0]["WORLD_SIZE"], "1");
  EXPECT_EQ(envs[0]["TORCHELASTIC_RUN_ID"], "none");
}

TEST_F(SlurmDdprunTest, BadValuesAreOneLineErrorsNamingTheVariable) {
  struct Case {
    std::string name;
    std::map<std::string, std::string> set;
    std::vector<std::string> erase;
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"non-numeric SLURM_NNODES",
       {{"SLURM_NNODES", "two"}},
       {},
       {},
       "ddprun: error: SLURM_NNODES: 'two' is not a positive integer (the number of nodes); "
       "--nnodes overrides it"},
      {"malformed node list",
       {{"SLURM_STEP_NODELIST", "node[01-04"}},
       {},
       {},
       "ddprun: error: SLURM_STEP_NODELIST: 'node[01-04' is not a valid host list: unbalanced "
       "'['; --master_addr overrides it"},
      {"reversed range, c10d",
       {{"SLURM_STEP_NODELIST", "node[04-01]"}},
       {},
       {"--rdzv_backend=c10d"},
       "ddprun: error: SLURM_STEP_NODELIST: 'node[04-01]' is not a valid host list: reversed "
       "range '04-01'; --master_addr overrides it"},
      {"outside a step",
       {},
       {"SLURM_STEP_ID"},
       {},
       "ddprun: error: this SLURM job has 2 nodes (SLURM_NNODES=2) but ddprun runs outside a job "
       "step (SLURM_STEP_ID is not set"},
      {"node id out of range",
       {{"SLURM_NODEID", "2"}},
       {},
       {},
       "ddprun: error: --node_rank (from SLURM_NODEID): expected an integer in [0, 2)"},
      {"non-numeric node id",
       {{"SLURM_NODEID", "first"}},
       {},
       {},
       "ddprun: error: SLURM_NODEID: 'first' is not a non-negative integer (this node's index); "
       "--node_rank overrides it"},
      {"non-numeric job id",
       {{"SLURM_JOB_ID", "12x"}},
       {},
       {},
       "ddprun: error: SLURM_JOB_ID: '12x' is not a positive integer (a SLURM job id); --rdzv_id "
       "overrides it"},
      {"job id with the run id given",
       {{"SLURM_JOB_ID", "12x"}},
       {},
       {"--rdzv_id=r"},
       "ddprun: error: SLURM_JOB_ID: '12x' is not a positive integer (a SLURM job id); "
       "--master_port overrides it"},
      {"non-numeric GPU count",
       {{"SLURM_GPUS_ON_NODE", "all"}},
       {},
       {},
       "ddprun: error: SLURM_GPUS_ON_NODE: 'all' is not a non-negative integer (GPUs on this "
       "node); --nproc_per_node overrides it"},
      {"bad tasks per node",
       {{"SLURM_NTASKS_PER_NODE", "2(x1)"}},
       {},
       {},
       "ddprun: error: SLURM_NTASKS_PER_NODE: '2(x1)' is not a task count per node: no entry for "
       "node 1 (1 node listed); --nproc_per_node overrides it"},
      {"nnodes from SLURM against a range",
       {},
       {},
       {"--nnodes=1:2"},
       "ddprun: error: --nnodes=1:2: the static backend needs a fixed number of nodes"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto env = srun_env(4242, 2, 1, "localhost,node02");
    for (const auto& [k, v] : c.set) env[k] = v;
    for (const auto& k : c.erase) env.erase(k);
    std::vector<std::string> args = c.args;
    args.push_back("--no_python");
    auto result = run(cmd(args, {worker(), "env", out_.str()}), env, dir_.path());
    EXPECT_EQ(result.code, 2);
    EXPECT_THAT(result.err, HasSubstr(c.message));
    EXPECT_EQ(lines_of(result.err).size(), 1u) << result.err;
    EXPECT_TRUE(fs::is_empty(out_.path())) << "a worker ran";
  }
}

}  // namespace
}  // namespace ddp::test
