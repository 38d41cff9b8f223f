// ddp-rendezvous as a store that several jobs share (--rdzv_backend=c10d with
// --rdzv_conf is_host=false on every node): jobs with different run ids run at
// once, each in its own keys; a second job with a run id a running job uses is
// refused with a clear error. Workers are ddprun_test_worker's "elastic" mode.
#include <signal.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <set>
#include <string>
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

class SharedStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = spawn({bin_dir() + "/ddp-rendezvous", "--host", "127.0.0.1", "--port", "0"},
                    base_env(), dir_.path(), "daemon");
    ASSERT_TRUE(eventually([&] { return !lines_of(read_text(daemon_.out)).empty(); }, 20s))
        << read_text(daemon_.err);
    endpoint_ = "127.0.0.1:" + lines_of(read_text(daemon_.out)).front();
  }

  ~SharedStoreTest() override {
    for (const auto& agent : agents_) kill_if_alive(agent.pid);
    if (daemon_.pid > 0) {
      ::kill(daemon_.pid, SIGTERM);
      wait_child(daemon_.pid);
    }
  }

  // An agent of job `run_id` whose workers write to <dir>/<run_id>/.
  Child& start_agent(const std::string& run_id, const std::string& nnodes) {
    const fs::path out = dir_.path() / run_id;
    fs::create_directories(out);
    agents_.push_back(
        spawn({ddprun(), "--nnodes=" + nnodes, "--nproc_per_node=1", "--rdzv_backend=c10d",
               "--rdzv_endpoint=" + endpoint_, "--rdzv_id=" + run_id, "--no_python",
               "--rdzv_conf=is_host=false,keep_alive_interval=0.5,"
               "keep_alive_max_attempt=2,last_call_timeout=1,join_timeout=60",
               worker(), "elastic", out.string()},
              base_env(), dir_.path(), run_id + std::to_string(agents_.size())));
    return agents_.back();
  }

  // The "<addr>:<port> <prefix>" lines of job `run_id`'s workers.
  std::vector<std::string> worker_stores(const std::string& run_id) const {
    std::vector<std::string> stores;
    for (const auto& entry : fs::directory_iterator(dir_.path() / run_id)) {
      // (a worker writes <name>.tmp, then renames it)
      if (entry.path().filename().string().rfind("store_r", 0) == 0 &&
          entry.path().extension() != ".tmp") {
        stores.push_back(read_text(entry.path()));
      }
    }
    return stores;
  }

  int workers_with_world(const std::string& run_id, int world) const {
    return test::workers_with_world(dir_.path() / run_id, world);
  }

  void finish(const std::string& run_id) {
    std::ofstream(dir_.path() / run_id / "finish") << "done\n";
  }

  std::string all_stderr() const { return stderr_of(agents_); }

  TempDir dir_;
  Child daemon_;
  std::string endpoint_;
  std::deque<Child> agents_;
};

TEST_F(SharedStoreTest, TwoJobsWithDifferentRunIdsRunAtOnceInTheirOwnKeys) {
  Child& a0 = start_agent("job_a", "2");
  Child& b0 = start_agent("job_b", "2");
  Child& a1 = start_agent("job_a", "2");
  Child& b1 = start_agent("job_b", "2");
  ASSERT_TRUE(eventually(
      [&] { return workers_with_world("job_a", 2) == 2 && workers_with_world("job_b", 2) == 2; },
      60s))
      << all_stderr();
  // Both jobs run at the same time, each a world of 2 with its own prefix
  // below its run id in the one daemon.
  for (const std::string run_id : {"job_a", "job_b"}) {
    const auto stores = worker_stores(run_id);
    ASSERT_EQ(stores.size(), 2u) << run_id;
    for (const auto& store : stores) {
      EXPECT_EQ(store.rfind(endpoint_ + " rdzv/" + run_id + "/", 0), 0u) << store;
    }
    EXPECT_EQ(stores[0], stores[1]) << "the workers of one job share one prefix";
  }
  EXPECT_NE(worker_stores("job_a")[0].substr(endpoint_.size()),
            worker_stores("job_b")[0].substr(endpoint_.size()));
  finish("job_a");
  finish("job_b");
  for (Child* agent : {&a0, &a1, &b0, &b1})
    EXPECT_EQ(wait_child(agent->pid, 60s), 0) << all_stderr();
  EXPECT_EQ(workers_with_world("job_a", 2) + workers_with_world("job_b", 2), 4)
      << "no job saw the other's nodes\n"
      << all_stderr();
}

TEST_F(SharedStoreTest, ASecondJobWithARunIdInUseIsRefusedWithAClearError) {
  Child& a0 = start_agent("shared", "2");
  Child& a1 = start_agent("shared", "2");
  ASSERT_TRUE(eventually([&] { return workers_with_world("shared", 2) == 2; }, 60s))
      << all_stderr();
  // Another job (another node range) under the same run id.
  Child& other = start_agent("shared", "1:3");
  EXPECT_EQ(wait_child(other.pid, 60s), 1) << all_stderr();
  const std::string err = read_text(other.err);
  EXPECT_NE(err.find("run id 'shared' is in use on the store at " + endpoint_ +
                     " by another running job (nnodes=2:2"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("use another --rdzv_id"), std::string::npos) << err;
  EXPECT_EQ(workers_with_world("shared", 3), 0) << "the refused node joined the job";
  finish("shared");
  EXPECT_EQ(wait_child(a0.pid, 60s), 0) << all_stderr();
  EXPECT_EQ(wait_child(a1.pid, 60s), 0) << all_stderr();
  // Once that job ended, the run id is free again.
  fs::remove(dir_.path() / "shared" / "finish");
  Child& again = start_agent("shared", "1:2");
  ASSERT_TRUE(eventually([&] { return workers_with_world("shared", 1) == 1; }, 60s))
      << all_stderr();
  finish("shared");
  EXPECT_EQ(wait_child(again.pid, 60s), 0) << all_stderr();
}

}  // namespace
}  // namespace ddp::test
