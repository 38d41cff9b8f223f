// In-place recovery under real ddprun agents on this host (--rdzv_backend=c10d,
// --nnodes 2:3, short keep-alives), with recovery_worker_main.cc as the
// program: it opts in, all-reduces its rank + 1 and says what it sees on
// stdout ("ready ..." once per process, "sum rank=R world=W value=V" after
// each (re)formation). Each agent's stdout is one file, so "ready" lines
// count the worker processes a node started. Generous timeouts: a loaded
// 2-core machine. The demo across network namespaces is in tests/cluster.
#include <signal.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "net_util.h"
#include "process_util.h"
#include "temp_dir.h"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;

std::string ddprun() { return bin_dir() + "/ddprun"; }
std::string worker() { return bin_dir() + "/recovery_test_worker"; }

class InPlaceTest : public ::testing::Test {
 protected:
  ~InPlaceTest() override {
    for (const auto& agent : agents_) kill_if_alive(agent.pid);
  }

  static constexpr const char* kConf =
      "keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=1,join_timeout=60";

  // An agent of the job; the first one hosts the store.
  Child& start_agent(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv{ddprun(),
                                  "--nnodes=2:3",
                                  "--nproc_per_node=1",
                                  "--rdzv_backend=c10d",
                                  "--rdzv_endpoint=" + endpoint_,
                                  "--rdzv_id=in_place",
                                  "--no_python",
                                  std::string("--rdzv_conf=") + kConf};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back(worker());
    argv.push_back(dir_.str());
    agents_.push_back(
        spawn(argv, base_env(), dir_.path(), "agent" + std::to_string(agents_.size())));
    if (agents_.size() == 1) {
      EXPECT_TRUE(eventually([&] { return port_listens(port_); }, 30s))
          << read_text(agents_.back().err);
    }
    return agents_.back();
  }

  static int count(const Child& agent, const std::string& text) {
    const std::string out = read_text(agent.out);
    int n = 0;
    for (auto at = out.find(text); at != std::string::npos; at = out.find(text, at + 1)) ++n;
    return n;
  }

  // Waits until the agent's workers said `text` `times` times in all.
  static bool said(const Child& agent, const std::string& text, int times = 1) {
    return eventually([&] { return count(agent, text) >= times; }, 60s, 20ms);
  }

  void touch(const std::string& name) { std::ofstream(dir_.path() / name) << "\n"; }

  std::string all_output() const {
    std::string text;
    for (const auto& a : agents_) text += read_text(a.out) + read_text(a.err);
    return text;
  }

  TempDir dir_{"ddp-in-place"};
  std::uint16_t port_ = free_port();
  std::string endpoint_ = "127.0.0.1:" + std::to_string(port_);
  std::deque<Child> agents_;
};

TEST_F(InPlaceTest, SurvivorsOfALostNodeKeepTheirWorkersAndReform) {
  Child& first = start_agent();
  Child& second = start_agent();
  Child& third = start_agent();
  for (Child* a : {&first, &second, &third}) {
    ASSERT_TRUE(said(*a, "world=3 value=6")) << all_output();
  }
  ::kill(third.pid, SIGKILL);  // the node dies; its worker with it (parent-death signal)
  EXPECT_EQ(wait_child(third.pid), 128 + SIGKILL);
  ASSERT_TRUE(said(first, "world=2 value=3")) << all_output();
  ASSERT_TRUE(said(second, "world=2 value=3")) << all_output();
  // The same worker processes: each survivor's node started one, ever.
  EXPECT_EQ(count(first, "ready "), 1) << all_output();
  EXPECT_EQ(count(second, "ready "), 1) << all_output();
  EXPECT_EQ(count(first, "reformed round="), 1) << all_output();
  touch("stop");
  EXPECT_EQ(wait_child(first.pid, 60s), 0) << all_output();
  EXPECT_EQ(wait_child(second.pid, 60s), 0) << all_output();
  const std::string log = read_text(first.err) + read_text(second.err);
  EXPECT_NE(log.find("the workers recover in place"), std::string::npos) << log;
  EXPECT_NE(log.find("in-place recovery from round"), std::string::npos) << log;
  // The abort is expected: each survivor's worker says it once, short, at
  // info, never at error level nor with the diagnosis of the collective it
  // broke (before: a ~500-character error line as well).
  for (Child* a : {&first, &second}) {
    const std::string err = read_text(a->err);
    int told = 0;
    for (const auto& line : lines_of(err)) {
      if (line.rfind("[default0]:", 0) != 0) continue;  // the worker's lines
      EXPECT_EQ(line.find("[error]"), std::string::npos) << line;
      if (line.find("was lost") == std::string::npos) continue;
      ++told;
      EXPECT_NE(line.find("[info]"), std::string::npos) << line;
      EXPECT_LT(line.size(), 240u) << line;
    }
    EXPECT_EQ(told, 1) << err;
  }
}

TEST_F(InPlaceTest, ANodeThatJoinsMeetsTheRunningWorkersInTheNextRound) {
  Child& first = start_agent();
  Child& second = start_agent();
  ASSERT_TRUE(said(first, "world=2 value=3")) << all_output();
  Child& third = start_agent();
  for (Child* a : {&first, &second, &third}) {
    ASSERT_TRUE(said(*a, "world=3 value=6")) << all_output();
  }
  EXPECT_EQ(count(first, "ready "), 1) << all_output();
  EXPECT_EQ(count(second, "ready "), 1) << all_output();
  touch("stop");
  for (Child* a : {&first, &second, &third}) EXPECT_EQ(wait_child(a->pid, 60s), 0) << all_output();
}

TEST_F(InPlaceTest, AWorkerCrashRestartsOnlyItsOwnNode) {
  const std::vector<std::string> restarts = {"--max_restarts=1"};
  Child& first = start_agent(restarts);
  Child& second = start_agent(restarts);
  Child& third = start_agent(restarts);
  for (Child* a : {&first, &second, &third}) {
    ASSERT_TRUE(said(*a, "world=3 value=6")) << all_output();
  }
  // Which node runs rank 1 is the rendezvous' choice: find it.
  Child* crashing = nullptr;
  for (Child* a : {&first, &second, &third}) {
    if (count(*a, "sum rank=1 ") > 0) crashing = a;
  }
  ASSERT_NE(crashing, nullptr) << all_output();
  touch("crash_rank1");
  ASSERT_TRUE(said(*crashing, "crash")) << all_output();
  // Its node starts a new worker, which joins the others; they kept theirs.
  ASSERT_TRUE(said(*crashing, "ready ", 2)) << all_output();
  for (Child* a : {&first, &second, &third}) {
    ASSERT_TRUE(said(*a, "world=3 value=6", 2)) << all_output();
    if (a != crashing) {
      EXPECT_EQ(count(*a, "ready "), 1) << all_output();
    }
  }
  touch("stop");
  for (Child* a : {&first, &second, &third}) EXPECT_EQ(wait_child(a->pid, 60s), 0) << all_output();
}

// The fallback: a kept worker that fails while its group re-forms is a
// failure of the new round, which spends a restart as any failure does.
TEST_F(InPlaceTest, AKeptWorkerThatCannotReformFallsBackToARestart) {
  const std::vector<std::string> restarts = {"--max_restarts=1"};
  Child& first = start_agent(restarts);
  Child& second = start_agent(restarts);
  Child& third = start_agent(restarts);
  for (Child* a : {&first, &second, &third}) {
    ASSERT_TRUE(said(*a, "world=3 value=6")) << all_output();
  }
  touch("no_reform");  // every kept worker gives up at the change
  ::kill(third.pid, SIGKILL);
  EXPECT_EQ(wait_child(third.pid), 128 + SIGKILL);
  ASSERT_TRUE(said(first, "changed: ")) << all_output();
  ASSERT_TRUE(said(second, "changed: ")) << all_output();
  ::unlink((dir_.path() / "no_reform").c_str());
  // Both survivors' nodes start new workers, which train on.
  ASSERT_TRUE(said(first, "world=2 value=3")) << all_output();
  ASSERT_TRUE(said(second, "world=2 value=3")) << all_output();
  EXPECT_EQ(count(first, "ready "), 2) << all_output();
  EXPECT_EQ(count(second, "ready "), 2) << all_output();
  touch("stop");
  EXPECT_EQ(wait_child(first.pid, 60s), 0) << all_output();
  EXPECT_EQ(wait_child(second.pid, 60s), 0) << all_output();
  const std::string log = read_text(first.err) + read_text(second.err);
  EXPECT_NE(log.find("restarting the worker group (1/1 restarts)"), std::string::npos) << log;
}

}  // namespace
}  // namespace ddp::test
