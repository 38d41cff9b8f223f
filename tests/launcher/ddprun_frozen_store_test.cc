// Two real ddprun agents (static rendezvous on 127.0.0.1): Ctrl-C on node 1
// while node 0, which hosts the agents' store, is frozen (SIGSTOP). Node 1 must
// stop its workers and exit within a few seconds instead of waiting minutes for
// the store to take its "abort".
#include <signal.h>

#include <gtest/gtest.h>

#include "net_util.h"
#include "process_util.h"

namespace ddp::test {
namespace {

std::string ddprun() { return bin_dir() + "/ddprun"; }
std::string worker() { return bin_dir() + "/ddprun_test_worker"; }

// Starts node `rank` of a two-node job whose worker sleeps until stopped and
// writes its pid to <dir>/<rank>/0.pid.
Child start_node(int rank, const std::string& port, const TempDir& dir) {
  const fs::path out = dir.path() / std::to_string(rank);
  fs::create_directories(out);
  return spawn({ddprun(), "--nnodes=2", "--node_rank=" + std::to_string(rank),
                "--master_addr=127.0.0.1", "--master_port=" + port, "--rdzv_id=frozen",
                "--stop_grace=5", "--no_python", worker(), "sleep", out.string()},
               base_env(), dir.path(), "node" + std::to_string(rank));
}

TEST(FrozenStore, SigintOnANodeWhoseStoreHostIsFrozenExitsWithinSeconds) {
  TempDir dir;
  const std::string port = std::to_string(free_port());
  Child node0 = start_node(0, port, dir);
  Child node1 = start_node(1, port, dir);
  // Whatever happens below, nothing we started survives the test.
  struct Cleanup {
    Child& a;
    Child& b;
    ~Cleanup() {
      for (Child* child : {&a, &b}) {
        if (child->pid <= 0) continue;  // already reaped
        ::kill(child->pid, SIGCONT);
        ::kill(child->pid, SIGKILL);
        wait_child(child->pid, std::chrono::seconds(5));
      }
    }
  } cleanup{node0, node1};

  const fs::path pid_file0 = dir.path() / "0" / "0.pid";
  const fs::path pid_file1 = dir.path() / "1" / "0.pid";
  ASSERT_TRUE(wait_for_file(pid_file0, std::chrono::seconds(20))) << read_text(node0.err);
  ASSERT_TRUE(wait_for_file(pid_file1, std::chrono::seconds(20))) << read_text(node1.err);
  ASSERT_TRUE(eventually([&] { return !read_text(pid_file1).empty(); }));
  const pid_t worker1 = std::stoi(read_text(pid_file1));

  ASSERT_EQ(::kill(node0.pid, SIGSTOP), 0);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(node1.pid, SIGINT), 0);
  // Before the fix node 1 waited for the store's full timeout (minutes): the
  // wait below then kills it and returns -1.
  const int code = wait_child(node1.pid, std::chrono::seconds(30));
  node1.pid = -1;
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(code, 128 + SIGINT) << read_text(node1.err);
  // The announce deadline is 5 s; the margin covers a loaded machine.
  EXPECT_LT(took, std::chrono::seconds(15)) << read_text(node1.err);
  EXPECT_TRUE(eventually([&] { return process_dead(worker1); }, std::chrono::seconds(5)))
      << "node 1's worker outlived its agent";

  // Thaw node 0 and end it; its worker follows it (parent-death signal).
  ::kill(node0.pid, SIGCONT);
  ::kill(node0.pid, SIGTERM);
  wait_child(node0.pid, std::chrono::seconds(20));
  node0.pid = -1;
  const pid_t worker0 = std::stoi(read_text(pid_file0));
  EXPECT_TRUE(eventually([&] { return process_dead(worker0); }, std::chrono::seconds(5)));
}

}  // namespace
}  // namespace ddp::test
