// Elastic runs of real ddprun agents on this host (--rdzv_backend=c10d,
// --nnodes MIN:MAX, short keep-alives): a lost node, scale-up, a spare, too
// few nodes, a lost store host. Workers are ddprun_test_worker's "elastic"
// mode: each announces itself as <dir>/ws<WORLD_SIZE>_r<RANK>_<pid> and runs
// until <dir>/finish exists. Generous timeouts: a loaded 2-core machine.
// The same scenarios across network namespaces are in tests/cluster.
#include <signal.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "net_util.h"
#include "process_util.h"
#include "worker_files.h"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;

std::string ddprun() { return bin_dir() + "/ddprun"; }
std::string worker() { return bin_dir() + "/ddprun_test_worker"; }

class ElasticTest : public ::testing::Test {
 protected:
  ~ElasticTest() override {
    for (const auto& agent : agents_) kill_if_alive(agent.pid);
  }

  static constexpr const char* kConf =
      "keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=1,join_timeout=60";

  // An agent of the job. The first one started hosts the store (callers wait
  // for it to listen before starting others).
  Child& start_agent(const std::string& nnodes, const std::string& conf = kConf) {
    std::vector<std::string> argv{ddprun(),
                                  "--nnodes=" + nnodes,
                                  "--nproc_per_node=1",
                                  "--rdzv_backend=c10d",
                                  "--rdzv_endpoint=" + endpoint_,
                                  "--rdzv_id=elastic",
                                  "--no_python",
                                  "--rdzv_conf=" + conf};
    argv.push_back(worker());
    argv.push_back("elastic");
    argv.push_back(dir_.str());
    agents_.push_back(
        spawn(argv, base_env(), dir_.path(), "agent" + std::to_string(agents_.size())));
    return agents_.back();
  }

  // Starts the store host and waits until its store listens.
  Child& start_host(const std::string& nnodes) {
    Child& host = start_agent(nnodes);
    EXPECT_TRUE(eventually([&] { return port_listens(port_); }, 30s)) << read_text(host.err);
    return host;
  }

  // Workers that announced WORLD_SIZE = `world`.
  int workers_with_world(int world) const { return test::workers_with_world(dir_.path(), world); }

  bool wait_workers(int world, int count, std::chrono::milliseconds timeout = 60s) {
    return eventually([&] { return workers_with_world(world) >= count; }, timeout);
  }

  void finish() { std::ofstream(dir_.path() / "finish") << "done\n"; }

  std::string all_stderr() const { return stderr_of(agents_); }

  // An agent of a 2-node job with --exit_barrier_timeout=1 running `script`
  // under /bin/sh (the first one started hosts the store).
  Child& start_scripted(const std::string& script);

  TempDir dir_;
  std::uint16_t port_ = free_port();
  std::string endpoint_ = "127.0.0.1:" + std::to_string(port_);
  std::deque<Child> agents_;  // references stay valid as agents are added
};

TEST_F(ElasticTest, SurvivorsOfALostNodeReformWithTheNewWorldSizeAndFinish) {
  Child& host = start_host("2:3");
  Child& second = start_agent("2:3");
  Child& third = start_agent("2:3");
  ASSERT_TRUE(wait_workers(3, 3)) << all_stderr();
  ::kill(third.pid, SIGKILL);
  EXPECT_EQ(wait_child(third.pid), 128 + SIGKILL);
  ASSERT_TRUE(wait_workers(2, 2)) << "the survivors did not re-form\n" << all_stderr();
  finish();
  EXPECT_EQ(wait_child(host.pid, 60s), 0) << all_stderr();
  EXPECT_EQ(wait_child(second.pid, 60s), 0) << all_stderr();
  const std::string log = read_text(host.err) + read_text(second.err);
  EXPECT_NE(log.find("was lost"), std::string::npos) << log;
  EXPECT_NE(log.find("re-formed the group"), std::string::npos) << log;
}

TEST_F(ElasticTest, ANodeThatArrivesBelowMaxIsAdmittedAtOnce) {
  Child& host = start_host("2:3");
  Child& second = start_agent("2:3");
  ASSERT_TRUE(wait_workers(2, 2)) << all_stderr();
  Child& third = start_agent("2:3");
  ASSERT_TRUE(wait_workers(3, 3)) << "no scale-up to 3 nodes\n" << all_stderr();
  finish();
  for (Child* agent : {&host, &second, &third})
    EXPECT_EQ(wait_child(agent->pid, 60s), 0) << all_stderr();
}

TEST_F(ElasticTest, ASpareAtMaxTakesOverWhenAMemberDies) {
  Child& host = start_host("1:2");
  Child& second = start_agent("1:2");
  ASSERT_TRUE(wait_workers(2, 2)) << all_stderr();
  Child& spare = start_agent("1:2");
  std::this_thread::sleep_for(2s);
  EXPECT_EQ(workers_with_world(2), 2) << "a spare must not disturb a full group\n" << all_stderr();
  ::kill(second.pid, SIGKILL);
  EXPECT_EQ(wait_child(second.pid), 128 + SIGKILL);
  ASSERT_TRUE(wait_workers(2, 4)) << "the spare did not take over\n" << all_stderr();
  finish();
  EXPECT_EQ(wait_child(host.pid, 60s), 0) << all_stderr();
  EXPECT_EQ(wait_child(spare.pid, 60s), 0) << all_stderr();
}

TEST_F(ElasticTest, AWorkerFailureWithEveryNodeAliveSpendsARestart) {
  auto agent = [&](const std::string& tag) {
    return spawn(
        {ddprun(), "--nnodes=1:2", "--nproc_per_node=1", "--rdzv_backend=c10d",
         "--rdzv_endpoint=" + endpoint_, "--rdzv_id=elastic", "--no_python", "--max_restarts=1",
         std::string("--rdzv_conf=") + kConf, worker(), "fail_on_attempt0", "3"},
        base_env(), dir_.path(), tag);
  };
  agents_.push_back(agent("first"));
  Child& first = agents_.back();
  ASSERT_TRUE(eventually([&] { return port_listens(port_); }, 30s)) << read_text(first.err);
  agents_.push_back(agent("second"));
  Child& second = agents_.back();
  EXPECT_EQ(wait_child(first.pid, 60s), 0) << all_stderr();
  EXPECT_EQ(wait_child(second.pid, 60s), 0) << all_stderr();
  const std::string log = all_stderr();
  EXPECT_NE(log.find("restarting the worker group (1/1 restarts)"), std::string::npos) << log;
  EXPECT_EQ(log.find("was lost"), std::string::npos) << log;
}

TEST_F(ElasticTest, TooFewNodesFailAfterTheJoinTimeoutWithAClearMessage) {
  Child& host = start_agent("2:3", "join_timeout=2,last_call_timeout=1");
  EXPECT_EQ(wait_child(host.pid, 60s), 1);
  const std::string err = read_text(host.err);
  EXPECT_NE(err.find("1 of at least 2 nodes joined within the join timeout"), std::string::npos)
      << err;
}

TEST_F(ElasticTest, WhenTheStoreHostDiesTheOthersExitPromptlyNamingTheStore) {
  Child& host = start_host("2:3");
  Child& second = start_agent("2:3");
  ASSERT_TRUE(wait_workers(2, 2)) << all_stderr();
  ::kill(host.pid, SIGKILL);
  EXPECT_EQ(wait_child(host.pid), 128 + SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  EXPECT_EQ(wait_child(second.pid, 30s), 1) << all_stderr();
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 10s) << "not prompt";
  const std::string err = read_text(second.err);
  EXPECT_NE(err.find("lost the rendezvous store"), std::string::npos) << err;
  EXPECT_NE(err.find(endpoint_), std::string::npos) << "the error names the store's address\n"
                                                    << err;
  // Said once, and nothing else: no node stopped the job, no worker failed
  // (before: "the agent of node -1 stopped the job (its workers failed ...)").
  EXPECT_EQ(err.find("lost the rendezvous store"), err.rfind("lost the rendezvous store")) << err;
  EXPECT_EQ(err.find("node -1"), std::string::npos) << err;
  EXPECT_EQ(err.find("stopped the job"), std::string::npos) << err;
}

// Two c10d nodes with --exit_barrier_timeout=1, each running its own script.
Child& ElasticTest::start_scripted(const std::string& script) {
  agents_.push_back(spawn(
      {ddprun(), "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
       "--rdzv_endpoint=" + endpoint_, "--rdzv_id=elastic", "--no_python",
       "--exit_barrier_timeout=1", std::string("--rdzv_conf=") + kConf, "/bin/sh", "-c", script},
      base_env(), dir_.path(), "agent" + std::to_string(agents_.size())));
  return agents_.back();
}

// --max_restarts=2 is the job's, across three real agents (c10d, 2 to 3
// nodes): node A's worker fails first; node C joins after that restart and
// reads the job's count (its agent has made none), and its worker fails
// next; node B's worker then fails with no restart left, and every agent
// stops alike with B's exit code (with per-agent counts C would restart alone).
TEST_F(ElasticTest, FailuresOnThreeNodesSpendOneJobWideRestartBudget) {
  // Each worker notes what it was told, then fails where the script says.
  const std::string script =
      "echo > \"$0/seen_${1}_job${DDP_JOB_RESTART_COUNT}_changes${DDP_MEMBERSHIP_CHANGES}"
      "_agent${TORCHELASTIC_RESTART_COUNT}\";"
      "case \"$1:${DDP_JOB_RESTART_COUNT}:${DDP_MEMBERSHIP_CHANGES}\" in"
      "  A:0:*) exit 5;; C:1:1) exit 7;; B:2:*) exit 9;; esac;"
      "while [ ! -e \"$0/finish\" ]; do sleep 0.1; done";
  auto agent = [&](const std::string& node) -> Child& {
    agents_.push_back(spawn(
        {ddprun(), "--nnodes=2:3", "--nproc_per_node=1", "--rdzv_backend=c10d",
         "--rdzv_endpoint=" + endpoint_, "--rdzv_id=elastic", "--no_python", "--max_restarts=2",
         std::string("--rdzv_conf=") + kConf, "/bin/sh", "-c", script, dir_.str(), node},
        base_env(), dir_.path(), "node" + node));
    return agents_.back();
  };
  auto seen = [&](const std::string& name) { return fs::exists(dir_.path() / ("seen_" + name)); };
  Child& a = agent("A");
  ASSERT_TRUE(eventually([&] { return port_listens(port_); }, 30s)) << read_text(a.err);
  Child& b = agent("B");
  // Round 1, after A's failure: both run with the job's one restart spent.
  ASSERT_TRUE(eventually(
      [&] { return seen("A_job1_changes0_agent1") && seen("B_job1_changes0_agent1"); }, 60s))
      << all_stderr();
  Child& c = agent("C");
  for (Child* node : {&a, &b, &c}) EXPECT_EQ(wait_child(node->pid, 90s), 9) << all_stderr();
  // C joined with the job's count, not its own zero, and the change counted apart.
  EXPECT_TRUE(seen("C_job1_changes1_agent0")) << all_stderr();
  EXPECT_TRUE(seen("C_job2_changes1_agent1")) << all_stderr();
  EXPECT_TRUE(seen("A_job2_changes1_agent2")) << all_stderr();
  EXPECT_FALSE(seen("A_job3_changes1_agent3")) << "a third restart\n" << all_stderr();
  const std::string c_err = read_text(c.err);
  EXPECT_NE(
      c_err.find("no restarts are left (--max_restarts=2, all spent by the job across its nodes)"),
      std::string::npos)
      << c_err;
}

// The store host's workers finish first: past its exit barrier's timeout it
// keeps serving the store until the slower node is done (before: it left,
// and the other node's healthy workers were killed, exit 1).
TEST_F(ElasticTest, TheStoreHostStaysPastItsExitBarrierUntilTheSlowerNodeFinishes) {
  const fs::path done = dir_.path() / "slow_done";
  Child& host = start_scripted("exit 0");
  ASSERT_TRUE(eventually([&] { return port_listens(port_); }, 30s)) << read_text(host.err);
  Child& slow = start_scripted("sleep 5; echo finished > " + done.string());
  EXPECT_EQ(wait_child(host.pid, 60s), 0) << all_stderr();
  EXPECT_TRUE(fs::exists(done)) << "the host left before the slower node's workers finished\n"
                                << all_stderr();
  EXPECT_EQ(wait_child(slow.pid, 60s), 0) << all_stderr();
  EXPECT_EQ(all_stderr().find("lost the rendezvous store"), std::string::npos) << all_stderr();
}

// The other node finishes first and leaves after its exit barrier (its
// keep-alives stop): it is not declared lost, and the host's workers run on
// to their end once (before: the host re-formed the group without it, and
// its workers were stopped).
TEST_F(ElasticTest, ANodeThatFinishedAndLeftIsNotDeclaredLost) {
  const fs::path runs = dir_.path() / "host_runs";
  Child& host = start_scripted("echo run >> " + runs.string() + "; sleep 6");
  ASSERT_TRUE(eventually([&] { return port_listens(port_); }, 30s)) << read_text(host.err);
  Child& quick = start_scripted("exit 0");
  EXPECT_EQ(wait_child(quick.pid, 60s), 0) << all_stderr();
  EXPECT_EQ(wait_child(host.pid, 60s), 0) << all_stderr();
  EXPECT_EQ(read_text(runs), "run\n") << all_stderr();
  EXPECT_EQ(all_stderr().find("was lost"), std::string::npos) << all_stderr();
}

}  // namespace
}  // namespace ddp::test
