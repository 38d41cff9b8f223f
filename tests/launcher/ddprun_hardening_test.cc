// End-to-end checks of real ddprun agents (--rdzv_backend=c10d, on loopback)
// against defects that once split or stalled a job:
// - a joiner killed right after taking its arrival index (it never writes its
//   record) must not fail the round: the decider forms without it after a
//   grace of a few seconds (ddprun_phantom_joiner plays that joiner);
// - nodes of one job on a shared ddp-rendezvous that run the same program
//   with different arguments, or spell its path differently, are one job, and
//   the job signature other jobs can read holds no program argument.
// Workers are ddprun_test_worker's "env" mode (<dir>/env_<RANK>_<RESTART>.json)
// or "elastic" mode (<dir>/ws<WORLD_SIZE>_r<RANK>_<pid>, until <dir>/finish
// exists). Generous timeouts: a loaded 2-core machine, also under sanitizers.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ddp/store/tcp_store.h"
#include "net_util.h"
#include "process_util.h"
#include "worker_files.h"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;

std::string abs_bin_dir() { return fs::absolute(bin_dir()).lexically_normal().string(); }
std::string ddprun() { return abs_bin_dir() + "/ddprun"; }
std::string worker() { return abs_bin_dir() + "/ddprun_test_worker"; }
std::string phantom() { return abs_bin_dir() + "/ddprun_phantom_joiner"; }

// Short keep-alives and last call, so that a round whose arrival 0 never
// decides (it died) is decided by another node within about 2 s.
constexpr const char* kConf =
    "keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=1,join_timeout=90";

class HardeningTest : public ::testing::Test {
 protected:
  // Everything this test started is killed (when it still runs) and reaped.
  ~HardeningTest() override {
    for (const auto& child : children_) {
      // 0: our child and still running; its pid: a zombie, now reaped;
      // -1: reaped already (wait_child).
      if (::waitpid(child.pid, nullptr, WNOHANG) == 0) {
        ::kill(child.pid, SIGKILL);
        ::waitpid(child.pid, nullptr, 0);
      }
    }
    if (daemon_.pid > 0 && ::waitpid(daemon_.pid, nullptr, WNOHANG) == 0) {
      ::kill(daemon_.pid, SIGTERM);
      if (wait_child(daemon_.pid, 20s) < 0) ADD_FAILURE() << "ddp-rendezvous ignored SIGTERM";
    }
  }

  Child& start(const std::vector<std::string>& argv, const std::string& tag) {
    children_.push_back(spawn(argv, base_env(), dir_.path(), tag));
    return children_.back();
  }

  // A ddprun agent of a 2-node c10d job at `endpoint` running `program`.
  Child& start_agent(const std::string& tag, const std::string& endpoint, const std::string& run_id,
                     const std::string& conf, const std::vector<std::string>& program) {
    std::vector<std::string> argv{ddprun(),
                                  "--nnodes=2",
                                  "--nproc_per_node=1",
                                  "--rdzv_backend=c10d",
                                  "--rdzv_endpoint=" + endpoint,
                                  "--rdzv_id=" + run_id,
                                  "--rdzv_conf=" + conf,
                                  "--no_python"};
    argv.insert(argv.end(), program.begin(), program.end());
    return start(argv, tag);
  }

  // Starts ddp-rendezvous on a free loopback port; returns its endpoint.
  std::string start_daemon() {
    daemon_ = spawn({abs_bin_dir() + "/ddp-rendezvous", "--host", "127.0.0.1", "--port", "0"},
                    base_env(), dir_.path(), "daemon");
    EXPECT_TRUE(eventually([&] { return !lines_of(read_text(daemon_.out)).empty(); }, 30s))
        << read_text(daemon_.err);
    const auto lines = lines_of(read_text(daemon_.out));
    return lines.empty() ? "" : "127.0.0.1:" + lines.front();
  }

  // The WORLD_SIZE and RANK the "env" worker of global rank `rank` saw ("" when missing).
  std::pair<std::string, std::string> env_of(int rank) const {
    const fs::path file = dir_.path() / ("env_" + std::to_string(rank) + "_0.json");
    if (!fs::exists(file)) return {};
    const auto env = nlohmann::json::parse(read_text(file))["env"];
    return {env.value("WORLD_SIZE", ""), env.value("RANK", "")};
  }

  int workers_with_world(int world) const { return test::workers_with_world(dir_.path(), world); }

  void finish() { std::ofstream(dir_.path() / "finish") << "done\n"; }

  std::string all_stderr() const { return stderr_of(children_); }

  TempDir dir_;
  std::deque<Child> children_;  // references stay valid as children are added
  Child daemon_;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Node 0 hosts the store and arrives; a joiner takes index 1 and is killed
// before writing its record; node 1 arrives as index 2. The round must form
// with the two real nodes once the missing record's grace (5 s) is over.
// (Before: the decider waited 10 s for the record and every node failed with
// "rendezvous failed".)
TEST_F(HardeningTest, AJoinerKilledAfterTakingItsArrivalIndexDoesNotFailTheRound) {
  const std::uint16_t port = free_port();
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  const std::vector<std::string> program{worker(), "env", dir_.str()};
  Child& node0 = start_agent("node0", endpoint, "phantom", kConf, program);
  ASSERT_TRUE(eventually([&] { return port_listens(port); }, 60s)) << all_stderr();
  // The phantom waits for node 0's record (rec_0), takes index 1 and dies.
  Child& joiner =
      start({phantom(), "127.0.0.1", std::to_string(port), "phantom", "after_rec0"}, "phantom");
  ASSERT_EQ(wait_child(joiner.pid, 90s), 128 + SIGKILL) << read_text(joiner.err) << all_stderr();
  EXPECT_EQ(read_text(joiner.out), "1\n") << "the phantom should have taken arrival index 1";
  const auto killed = std::chrono::steady_clock::now();
  Child& node1 = start_agent("node1", endpoint, "phantom", kConf, program);
  EXPECT_EQ(wait_child(node0.pid, 90s), 0) << all_stderr();
  EXPECT_EQ(wait_child(node1.pid, 90s), 0) << all_stderr();
  const double took = seconds_since(killed);
  std::printf("[ timing   ] the job formed and finished %.1f s after the phantom died\n", took);
  EXPECT_LT(took, 60.0) << all_stderr();
  EXPECT_EQ(env_of(0), std::make_pair(std::string("2"), std::string("0"))) << all_stderr();
  EXPECT_EQ(env_of(1), std::make_pair(std::string("2"), std::string("1"))) << all_stderr();
  EXPECT_EQ(all_stderr().find("rendezvous failed"), std::string::npos) << all_stderr();
}

// The phantom takes index 0 (the decider's index) before any node arrives.
// With the store hosted by node 0 that cannot be arranged: node 0's agent
// arrives as soon as its store listens. On a ddp-rendezvous daemon it can:
// the real nodes arrive as 1 and 2, and since arrival 0 never decides, one of
// them decides after the fallback delay, then forms without arrival 0.
TEST_F(HardeningTest, AJoinerKilledAfterTakingIndexZeroOnADaemonDoesNotFailTheRound) {
  const std::string endpoint = start_daemon();
  ASSERT_FALSE(endpoint.empty());
  const std::string port = endpoint.substr(endpoint.find(':') + 1);
  Child& joiner = start({phantom(), "127.0.0.1", port, "phantom0", "now"}, "phantom");
  ASSERT_EQ(wait_child(joiner.pid, 90s), 128 + SIGKILL) << read_text(joiner.err);
  EXPECT_EQ(read_text(joiner.out), "0\n") << "the phantom should have taken arrival index 0";
  const auto killed = std::chrono::steady_clock::now();
  const std::string conf = std::string("is_host=false,") + kConf;
  const std::vector<std::string> program{worker(), "env", dir_.str()};
  Child& a = start_agent("node_a", endpoint, "phantom0", conf, program);
  Child& b = start_agent("node_b", endpoint, "phantom0", conf, program);
  EXPECT_EQ(wait_child(a.pid, 90s), 0) << all_stderr();
  EXPECT_EQ(wait_child(b.pid, 90s), 0) << all_stderr();
  const double took = seconds_since(killed);
  std::printf("[ timing   ] the job formed and finished %.1f s after the phantom died\n", took);
  EXPECT_LT(took, 60.0) << all_stderr();
  EXPECT_EQ(env_of(0).first, "2") << all_stderr();
  EXPECT_EQ(env_of(1).first, "2") << all_stderr();
}

// Two nodes of one job on a shared daemon run the same program with different
// arguments: one job (before: the second was refused as "another running
// job", the signature held every argument). The signature at
// rdzv/<run_id>/config, which any client of the store can read, and the
// refusal another job gets, hold no program argument.
TEST_F(HardeningTest, PerNodeProgramArgumentsDoNotSplitAJobAndNeverReachTheStore) {
  const std::string endpoint = start_daemon();
  ASSERT_FALSE(endpoint.empty());
  const std::string conf = std::string("is_host=false,") + kConf;
  const std::string secret = "--secret=hunter2";
  Child& n0 = start_agent("node0", endpoint, "args", conf,
                          {worker(), "elastic", dir_.str(), "--tag", "node0", secret});
  Child& n1 = start_agent("node1", endpoint, "args", conf,
                          {worker(), "elastic", dir_.str(), "--tag", "node1", secret});
  // (A refused node exits at once: no need to wait for the group then.)
  eventually(
      [&] { return workers_with_world(2) == 2 || process_dead(n0.pid) || process_dead(n1.pid); },
      90s);
  ASSERT_EQ(workers_with_world(2), 2) << "the nodes did not form one job\n" << all_stderr();

  TcpStoreOptions options;
  options.host = "127.0.0.1";
  options.port = static_cast<std::uint16_t>(std::stoi(endpoint.substr(endpoint.find(':') + 1)));
  options.connect_timeout = 30s;
  TcpStore store(options);
  const std::string signature = store.get("rdzv/args/config", 10s);
  EXPECT_NE(signature.find("nnodes=2:2"), std::string::npos) << signature;
  EXPECT_NE(signature.find("ddprun_test_worker"), std::string::npos) << signature;
  for (const std::string& argument :
       std::vector<std::string>{"hunter2", "--tag", "node0", "node1", "elastic", dir_.str()}) {
    EXPECT_EQ(signature.find(argument), std::string::npos)
        << "the signature holds '" << argument << "': " << signature;
  }
  EXPECT_EQ(signature.find(abs_bin_dir()), std::string::npos)
      << "the signature holds the program's path: " << signature;

  // Another job (another node range) under the same run id is refused, and
  // what it is told of the running job holds no argument either.
  Child& other = start({ddprun(), "--nnodes=1:3", "--nproc_per_node=1", "--rdzv_backend=c10d",
                        "--rdzv_endpoint=" + endpoint, "--rdzv_id=args", "--rdzv_conf=" + conf,
                        "--no_python", worker(), "elastic", dir_.str(), secret},
                       "other");
  EXPECT_EQ(wait_child(other.pid, 90s), 1) << all_stderr();
  const std::string refusal = read_text(other.err);
  EXPECT_NE(refusal.find("run id 'args' is in use on the store at " + endpoint +
                         " by another running job (" + signature + ")"),
            std::string::npos)
      << refusal;
  EXPECT_EQ(refusal.find("hunter2"), std::string::npos) << refusal;
  EXPECT_EQ(read_text(daemon_.err).find("hunter2"), std::string::npos) << read_text(daemon_.err);
  EXPECT_EQ(workers_with_world(3), 0) << "the refused node joined the job";

  finish();
  EXPECT_EQ(wait_child(n0.pid, 90s), 0) << all_stderr();
  EXPECT_EQ(wait_child(n1.pid, 90s), 0) << all_stderr();
  EXPECT_EQ(workers_with_world(2), 2) << all_stderr();
}

// The same program, spelled as an absolute path on one node and as
// ./ddprun_test_worker from the build directory on the other: one job.
TEST_F(HardeningTest, AProgramPathSpelledDifferentlyPerNodeDoesNotSplitAJob) {
  const std::string endpoint = start_daemon();
  ASSERT_FALSE(endpoint.empty());
  const std::string conf = std::string("is_host=false,") + kConf;
  Child& n0 = start_agent("node0", endpoint, "paths", conf, {worker(), "elastic", dir_.str()});
  // env -C: ddprun starts in the build directory (same pid: env execs it).
  Child& n1 =
      start({"/usr/bin/env", "-C", abs_bin_dir(), ddprun(), "--nnodes=2", "--nproc_per_node=1",
             "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint, "--rdzv_id=paths",
             "--rdzv_conf=" + conf, "--no_python", "./ddprun_test_worker", "elastic", dir_.str()},
            "node1");
  eventually(
      [&] { return workers_with_world(2) == 2 || process_dead(n0.pid) || process_dead(n1.pid); },
      90s);
  ASSERT_EQ(workers_with_world(2), 2) << "the nodes did not form one job\n" << all_stderr();
  finish();
  EXPECT_EQ(wait_child(n0.pid, 90s), 0) << all_stderr();
  EXPECT_EQ(wait_child(n1.pid, 90s), 0) << all_stderr();
  EXPECT_EQ(all_stderr().find("another running job"), std::string::npos) << all_stderr();
}

}  // namespace
}  // namespace ddp::test
