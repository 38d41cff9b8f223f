// In-place re-forming of real worker processes (recovery_worker_main.cc, Gloo
// over loopback) driven by a fake agent: the test holds the agent's ends of
// the control channels and an in-process store, and says what ddprun's agent
// says (abort, round). No launcher, no rendezvous: the worker library's side
// alone, every timing generous (the workers' own timeout is 60 s; each wait
// here is 30 s and returns as soon as the line shows up).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/store_server/store_server.h"
#include "ddp/worker_contract/control_channel.h"
#include "ddp/worker_contract/worker_contract.h"
#include "process_state.h"
#include "process_util.h"
#include "temp_dir.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr auto kWait = 30s;

struct Worker {
  test::Child child;
  int agent_fd = -1;
  std::string tag;
  int code = -1;  // once reaped (exit())
};

class FakeAgent {
 public:
  FakeAgent() : server_(StoreServerOptions{}) { server_.start(); }
  ~FakeAgent() {
    std::ofstream(dir_.path() / "stop").put('\n');
    for (auto& w : workers_) {
      if (w->code < 0) test::wait_child(w->child.pid, 10s);
      if (w->agent_fd >= 0) ::close(w->agent_fd);
    }
  }

  // Waits for the worker to exit (at most kWait); its exit code.
  static int exit_code(Worker& w) {
    if (w.code < 0) w.code = test::wait_child(w.child.pid, kWait);
    return w.code;
  }

  // A worker of round `prefix` as ddprun starts one.
  Worker& start(int rank, int world, const std::string& prefix) {
    auto [agent_fd, worker_fd] = control::make_socket_pair();
    auto env = test::base_env();
    contract::WorkerRound round;
    round.rank = rank;
    round.world_size = world;
    round.group_rank = rank;  // one worker a node
    round.group_world_size = world;
    round.store_addr = "127.0.0.1";
    round.store_port = server_.port();
    round.store_prefix = prefix;
    // As ddprun's agent: a failed collective waits this long for the word
    // that its round ended (a killed peer's connection breaks first).
    round.change_grace = std::chrono::milliseconds(30000);
    for (const auto& [name, value] : contract::environment_of(round)) env[name] = value;
    env["DDP_CONTROL_FD"] = "3";
    test::SpawnOptions options;
    options.die_with_parent = true;
    auto w = std::make_unique<Worker>();
    w->tag = "worker" + std::to_string(workers_.size());
    w->child = test::spawn({test::bin_dir() + "/recovery_test_worker", dir_.str()}, env,
                           dir_.path(), w->tag, options, {worker_fd});
    ::close(worker_fd);
    w->agent_fd = agent_fd;
    workers_.push_back(std::move(w));
    return *workers_.back();
  }

  void abort(Worker& w, int round, const std::string& why) {
    ASSERT_EQ(
        control::send(w.agent_fd, control::Message("abort").set("round", round).set("why", why)),
        control::Sent::kSent);
  }

  void round(Worker& w, int round, int rank, int world, const std::string& prefix) {
    contract::WorkerRound r;
    r.round = round;
    r.rank = rank;
    r.world_size = world;
    r.store_addr = "127.0.0.1";
    r.store_port = static_cast<int>(server_.port());
    r.store_prefix = prefix;
    // One node per worker, as ddprun would form it with one worker per node.
    r.group_rank = rank;
    r.group_world_size = world;
    r.restart_count = round;
    r.master_addr = "127.0.0.1";
    r.master_port = 29500 + round;
    ASSERT_EQ(control::send(w.agent_fd, contract::encode(r)), control::Sent::kSent);
  }

  // The agent's end goes, as when the agent dies.
  static void close(Worker& w) {
    ::close(w.agent_fd);
    w.agent_fd = -1;
  }

  // The worker's stdout lines.
  static std::vector<std::string> lines(const Worker& w) {
    return test::lines_of(test::read_text(w.child.out));
  }

  // Waits until the worker said `line` (a whole line), at most kWait.
  static bool said(const Worker& w, const std::string& line,
                   std::chrono::milliseconds wait = kWait) {
    return test::eventually(
        [&] {
          for (const auto& l : lines(w)) {
            if (l == line) return true;
          }
          return false;
        },
        wait, 20ms);
  }

  // How many lines the worker said that start with `prefix`.
  static int count(const Worker& w, const std::string& prefix) {
    int n = 0;
    for (const auto& l : lines(w)) n += l.rfind(prefix, 0) == 0 ? 1 : 0;
    return n;
  }

  // What the worker told the agent, waiting for one message of `type`.
  static std::optional<control::Message> heard(const Worker& w, const std::string& type) {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (std::chrono::steady_clock::now() < deadline) {
      control::Message m;
      const auto got = control::receive(w.agent_fd, m, false);
      if (got == control::Received::kMessage && m.type == type) return m;
      if (got == control::Received::kClosed) return std::nullopt;
      if (got == control::Received::kNothing) std::this_thread::sleep_for(10ms);
    }
    return std::nullopt;
  }

  std::string stderr_of(const Worker& w) const { return test::read_text(w.child.err); }

 private:
  test::TempDir dir_{"ddp-reform"};
  StoreServer server_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

TEST(Reform, SurvivorsOfALostRankKeepTheirProcessesAndReformAsTheNextRound) {
  FakeAgent agent;
  Worker& a = agent.start(0, 3, "r0");
  Worker& b = agent.start(1, 3, "r0");
  Worker& c = agent.start(2, 3, "r0");
  for (Worker* w : {&a, &b, &c}) ASSERT_TRUE(FakeAgent::heard(*w, "hello")) << w->tag;
  ASSERT_TRUE(FakeAgent::said(a, "sum rank=0 world=3 value=6")) << agent.stderr_of(a);
  ASSERT_TRUE(FakeAgent::said(b, "sum rank=1 world=3 value=6"));
  const pid_t pid_a = a.child.pid;
  const pid_t pid_b = b.child.pid;
  ::kill(c.child.pid, SIGKILL);  // rank 2's node is gone
  agent.abort(a, 0, "node 2 was lost");
  agent.abort(b, 0, "node 2 was lost");
  ASSERT_TRUE(test::eventually([&] { return FakeAgent::count(a, "changed: ") > 0; }, kWait, 20ms))
      << agent.stderr_of(a);
  ASSERT_TRUE(test::eventually([&] { return FakeAgent::count(b, "changed: ") > 0; }, kWait, 20ms));
  // The abort's reason reaches the program.
  bool named = false;
  for (const auto& l : FakeAgent::lines(a)) named |= l.find("node 2 was lost") != std::string::npos;
  EXPECT_TRUE(named);
  agent.round(a, 1, 0, 2, "r1");
  agent.round(b, 1, 1, 2, "r1");
  ASSERT_TRUE(FakeAgent::said(a, "reformed round=1 rank=0 world=2")) << agent.stderr_of(a);
  ASSERT_TRUE(FakeAgent::said(b, "reformed round=1 rank=1 world=2"));
  EXPECT_TRUE(FakeAgent::said(a, "sum rank=0 world=2 value=3"));
  EXPECT_TRUE(FakeAgent::said(b, "sum rank=1 world=2 value=3"));
  auto reformed = FakeAgent::heard(a, "reformed");
  ASSERT_TRUE(reformed);
  EXPECT_EQ(reformed->integer("round"), 1);
  EXPECT_TRUE(reformed->number("wait_seconds"));
  EXPECT_TRUE(reformed->number("build_seconds"));
  // The rest of the round the agent named reaches the program.
  EXPECT_TRUE(FakeAgent::said(
      a, "node group_rank=0 group_world_size=2 restart_count=1 master=127.0.0.1:29501"));
  EXPECT_TRUE(FakeAgent::said(
      b, "node group_rank=1 group_world_size=2 restart_count=1 master=127.0.0.1:29501"));
  // The state transfer after the re-form names the round it was in (the
  // agent tells a report of the new round from one of the round that ended).
  auto synced = FakeAgent::heard(a, "synced");
  ASSERT_TRUE(synced);
  auto sync = contract::decode_synced(*synced);
  ASSERT_TRUE(sync);
  EXPECT_EQ(sync->round, 1);
  // The same processes all along.
  EXPECT_FALSE(test::process_dead(pid_a));
  EXPECT_FALSE(test::process_dead(pid_b));
  EXPECT_EQ(FakeAgent::count(a, "ready "), 1);
}

TEST(Reform, ANewcomerJoinsTheSurvivorsInTheNextRound) {
  FakeAgent agent;
  Worker& a = agent.start(0, 2, "r0");
  Worker& b = agent.start(1, 2, "r0");
  ASSERT_TRUE(FakeAgent::said(a, "sum rank=0 world=2 value=3")) << agent.stderr_of(a);
  agent.abort(a, 0, "a node asked to join");
  agent.abort(b, 0, "a node asked to join");
  agent.round(a, 1, 0, 3, "r1");
  agent.round(b, 1, 1, 3, "r1");
  Worker& c = agent.start(2, 3, "r1");  // a fresh process, straight into round 1
  ASSERT_TRUE(FakeAgent::said(c, "sum rank=2 world=3 value=6")) << agent.stderr_of(c);
  EXPECT_TRUE(FakeAgent::said(a, "sum rank=0 world=3 value=6"));
  EXPECT_TRUE(FakeAgent::said(b, "sum rank=1 world=3 value=6"));
}

TEST(Reform, ARoundThatEndsWhileTheWorkersJoinItIsLeftForTheNextOne) {
  FakeAgent agent;
  Worker& a = agent.start(0, 2, "r0");
  Worker& b = agent.start(1, 2, "r0");
  ASSERT_TRUE(FakeAgent::said(a, "sum rank=0 world=2 value=3")) << agent.stderr_of(a);
  agent.abort(a, 0, "first change");
  agent.abort(b, 0, "first change");
  // Round 1 names a third rank that never comes: both wait for it in the store...
  agent.round(a, 1, 0, 3, "r1");
  agent.round(b, 1, 1, 3, "r1");
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(FakeAgent::count(a, "reformed round=1"), 0);
  // ...until round 1 ends too: reform() says so and the next call joins round 2.
  agent.abort(a, 1, "second change");
  agent.abort(b, 1, "second change");
  ASSERT_TRUE(test::eventually([&] { return FakeAgent::count(a, "changed: ") >= 2; }, kWait, 20ms))
      << agent.stderr_of(a);
  agent.round(a, 2, 0, 2, "r2");
  agent.round(b, 2, 1, 2, "r2");
  EXPECT_TRUE(FakeAgent::said(a, "reformed round=2 rank=0 world=2")) << agent.stderr_of(a);
  EXPECT_TRUE(FakeAgent::said(b, "sum rank=1 world=2 value=3"));
}

TEST(Reform, AWorkerLeftInTheOldRoundNeverCompletesACollectiveWithTheNewOne) {
  FakeAgent agent;
  Worker& a = agent.start(0, 3, "r0");
  Worker& b = agent.start(1, 3, "r0");
  Worker& c = agent.start(2, 3, "r0");
  ASSERT_TRUE(FakeAgent::said(c, "sum rank=2 world=3 value=6")) << agent.stderr_of(c);
  // a and b move on to round 1; c is never told.
  agent.abort(a, 0, "moving on");
  agent.abort(b, 0, "moving on");
  agent.round(a, 1, 0, 2, "r1");
  agent.round(b, 1, 1, 2, "r1");
  ASSERT_TRUE(FakeAgent::said(a, "sum rank=0 world=2 value=3")) << agent.stderr_of(a);
  // c's group lost its peers: its collective fails; it never says a sum of round 1.
  agent.close(c);  // and then its agent goes: it can wait for no word any more
  EXPECT_EQ(FakeAgent::exit_code(c), 4) << agent.stderr_of(c);
  EXPECT_EQ(FakeAgent::count(c, "sum "), 1);
}

TEST(Reform, AWorkerWaitingForItsNextRoundLeavesWhenTheAgentGoesAway) {
  FakeAgent agent;
  Worker& a = agent.start(0, 1, "r0");
  ASSERT_TRUE(FakeAgent::said(a, "sum rank=0 world=1 value=1")) << agent.stderr_of(a);
  agent.abort(a, 0, "change");
  ASSERT_TRUE(test::eventually([&] { return FakeAgent::count(a, "changed: ") > 0; }, kWait, 20ms));
  agent.close(a);  // the agent dies
  EXPECT_EQ(FakeAgent::exit_code(a), 4) << agent.stderr_of(a);
  EXPECT_EQ(FakeAgent::count(a, "shutdown: "), 1);
}

}  // namespace
}  // namespace ddp
