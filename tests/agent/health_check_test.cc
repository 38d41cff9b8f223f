// The health check before a join (agent/src/health_check.h): real commands
// through the posix event loop, and the retries against a fake loop and a
// fake clock.
#include "health_check.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <deque>
#include <fstream>
#include <thread>

#include "job_status.h"
#include "process_state.h"
#include "temp_dir.h"

namespace ddp::agent {
namespace {

using namespace std::chrono_literals;
using test::TempDir;

// Records what the gate tells its watchers.
struct SeenEvents : AgentEvents {
  std::vector<std::string> notices;
  std::vector<std::string> checks;
  void notice(const std::string& line) override { notices.push_back(line); }
  void health_check(const std::string& failure) override { checks.push_back(failure); }
};

class RealCheckTest : public ::testing::Test {
 protected:
  HealthCheckResult run(const std::string& command, std::chrono::milliseconds timeout = 10s) {
    options_.command = command;
    options_.timeout = timeout;
    options_.output_file = (dir_.path() / "health_check.log").string();
    HealthGate gate(options_, *loop_, real_runtime(), events_, nullptr);
    HealthCheckFacts facts;
    facts.node_rank = 2;
    facts.local_world_size = 4;
    facts.run_id = "job7";
    facts.attempt = 3;
    return gate.run_once(health_check_env({"PATH=/usr/bin:/bin"}, facts));
  }

  TempDir dir_;
  HealthCheckOptions options_;
  SeenEvents events_;
  std::unique_ptr<WorkerEventLoop> loop_ = make_posix_event_loop({SIGUSR2});
};

TEST_F(RealCheckTest, PassingCommandPasses) {
  const auto result = run("echo fine");
  EXPECT_EQ(result.kind, HealthCheckResult::Kind::kPassed);
  EXPECT_EQ(result.output, "fine\n");
}

TEST_F(RealCheckTest, FailureCarriesStatusAndOutputOfBothStreams) {
  const auto result = run("echo gpu 3; echo ecc errors >&2; exit 7");
  ASSERT_EQ(result.kind, HealthCheckResult::Kind::kFailed);
  EXPECT_EQ(result.status, 7);
  EXPECT_EQ(result.output, "gpu 3\necc errors\n");
  EXPECT_EQ(describe_failure("check.sh", result, 60s),
            "health check `check.sh` exited with status 7; its output: gpu 3|ecc errors");
}

TEST_F(RealCheckTest, OutputIsCutToItsTail) {
  const auto result = run("head -c 10000 /dev/zero | tr '\\0' a; echo END; exit 1");
  ASSERT_EQ(result.kind, HealthCheckResult::Kind::kFailed);
  EXPECT_EQ(result.output.size(), HealthCheckResult::kOutputTail);
  EXPECT_TRUE(result.output.ends_with("aaaEND\n"));
}

TEST_F(RealCheckTest, KilledBySignalIsAFailure) {
  const auto result = run("kill -TERM $$");
  ASSERT_EQ(result.kind, HealthCheckResult::Kind::kFailed);
  EXPECT_EQ(result.status, -SIGTERM);
  EXPECT_NE(describe_failure("c", result, 1s).find("killed by signal 15"), std::string::npos);
}

TEST_F(RealCheckTest, GetsTheNodesFacts) {
  const auto result =
      run("echo $DDP_HEALTH_CHECK_NODE_RANK,$LOCAL_WORLD_SIZE,$TORCHELASTIC_RUN_ID,"
          "$DDP_HEALTH_CHECK_ATTEMPT,[$DDP_HEALTH_CHECK_LAST_ROUND]");
  ASSERT_EQ(result.kind, HealthCheckResult::Kind::kPassed);
  EXPECT_EQ(result.output, "2,4,job7,3,[]\n");
}

pid_t read_pid(const std::filesystem::path& file) {
  pid_t pid = 0;
  std::ifstream(file) >> pid;
  return pid;
}

bool gone_within(pid_t pid, std::chrono::milliseconds limit) {
  const auto until = Clock::now() + limit;
  while (!test::process_dead(pid)) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

TEST_F(RealCheckTest, TimeoutKillsTheWholeGroup) {
  const auto pid_file = dir_.path() / "child.pid";
  const auto started = Clock::now();
  const auto result =
      run("sleep 30 & echo $! > " + pid_file.string() + "; echo waiting; wait", 300ms);
  EXPECT_LT(Clock::now() - started, 5s);
  ASSERT_EQ(result.kind, HealthCheckResult::Kind::kTimedOut);
  EXPECT_EQ(result.output, "waiting\n");
  const pid_t child = read_pid(pid_file);
  ASSERT_GT(child, 0);
  EXPECT_TRUE(gone_within(child, 5s));
  EXPECT_NE(describe_failure("c", result, 300ms).find("timed out after 300 ms"), std::string::npos);
}

TEST_F(RealCheckTest, AHandledSignalKillsTheCheckAndIsReturned) {
  const auto pid_file = dir_.path() / "child.pid";
  std::thread sender([] {
    std::this_thread::sleep_for(300ms);
    ::kill(::getpid(), SIGUSR2);
  });
  const auto result = run("sleep 30 & echo $! > " + pid_file.string() + "; wait");
  sender.join();
  ASSERT_EQ(result.kind, HealthCheckResult::Kind::kInterrupted);
  EXPECT_EQ(result.signo, SIGUSR2);
  const pid_t child = read_pid(pid_file);
  ASSERT_GT(child, 0);
  EXPECT_TRUE(gone_within(child, 5s));
}

TEST(HealthCheckBackoffTest, DoublesUpToTheCap) {
  HealthCheckBackoff backoff(1s, 30s);
  std::vector<long> seen;
  for (int i = 0; i < 7; ++i) seen.push_back(static_cast<long>(backoff.next().count()));
  EXPECT_EQ(seen, (std::vector<long>{1000, 2000, 4000, 8000, 16000, 30000, 30000}));
}

TEST(HealthCheckEnvTest, ReplacesTheInheritedValuesAndLeavesUnknownsEmpty) {
  HealthCheckFacts facts;
  facts.local_world_size = 2;
  facts.run_id = "r";
  const auto env = health_check_env({"LOCAL_WORLD_SIZE=9", "HOME=/h"}, facts);
  EXPECT_EQ(env,
            (std::vector<std::string>{
                "HOME=/h", "DDP_HEALTH_CHECK_NODE_RANK=", "DDP_HEALTH_CHECK_ATTEMPT=1",
                "DDP_HEALTH_CHECK_LAST_ROUND=", "LOCAL_WORLD_SIZE=2", "TORCHELASTIC_RUN_ID=r"}));
}

// Each launch exits with the next scripted status at once; waits move the
// fake clock to their deadline.
class ScriptedLoop final : public WorkerEventLoop {
 public:
  ScriptedLoop(FakeTime& time, std::deque<int> statuses)
      : time_(time), statuses_(std::move(statuses)) {}
  int launch(const ProcessSpec& spec) override {
    launched_at.push_back(time_.now());
    for (const auto& var : spec.env) {
      if (var.starts_with("DDP_HEALTH_CHECK_ATTEMPT=")) attempts.push_back(var);
    }
    LoopEvent exit;
    exit.kind = LoopEvent::Kind::kExited;
    exit.pid = ++pid_;
    exit.status = statuses_.front();
    statuses_.pop_front();
    queued_.push_back(exit);
    return pid_;
  }
  void signal_group(int, int) override {}
  LoopEvent next_event(Clock::time_point deadline) override {
    if (!queued_.empty()) {
      LoopEvent event = queued_.front();
      queued_.pop_front();
      return event;
    }
    if (deadline > time_.now()) {
      time_.advance(std::chrono::duration_cast<Duration>(deadline - time_.now()));
    }
    return LoopEvent{};
  }
  void wake() override {}

  std::vector<Clock::time_point> launched_at;
  std::vector<std::string> attempts;

 private:
  FakeTime& time_;
  std::deque<int> statuses_;
  std::deque<LoopEvent> queued_;
  int pid_ = 100;
};

HealthCheckOptions fast_options() {
  HealthCheckOptions options;
  options.command = "check";
  options.backoff_initial = 1s;
  options.backoff_max = 4s;
  return options;
}

std::vector<long> gaps_ms(const std::vector<Clock::time_point>& times) {
  std::vector<long> gaps;
  for (std::size_t i = 1; i < times.size(); ++i) {
    gaps.push_back(static_cast<long>(
        std::chrono::duration_cast<std::chrono::milliseconds>(times[i] - times[i - 1]).count()));
  }
  return gaps;
}

TEST(HealthGateTest, RetriesWithBackoffUntilItPasses) {
  FakeTime time;
  ScriptedLoop loop(time, {1, 1, 1, 1, 0});
  SeenEvents events;
  const HealthCheckOptions options = fast_options();
  HealthGate gate(options, loop, time, events, nullptr);
  EXPECT_EQ(gate.pass({"A=b"}, HealthCheckFacts{}, 600s), std::nullopt);
  EXPECT_EQ(gaps_ms(loop.launched_at), (std::vector<long>{1000, 2000, 4000, 4000}));
  ASSERT_EQ(events.checks.size(), 5u);
  EXPECT_NE(events.checks[0].find("exited with status 1"), std::string::npos);
  EXPECT_EQ(events.checks.back(), "");
  EXPECT_NE(events.notices.front().find("try 1: health check `check` exited with status 1"),
            std::string::npos);
  EXPECT_EQ(events.notices.back(), "the health check passed on try 5; joining");
}

TEST(HealthGateTest, GivesUpAtTheJoinTimeoutWithExitCodeOne) {
  FakeTime time;
  ScriptedLoop loop(time, std::deque<int>(20, 3));
  SeenEvents events;
  const HealthCheckOptions options = fast_options();
  HealthGate gate(options, loop, time, events, nullptr);
  // Tries at 0, 1, 3, 7 s; the next (11 s) would pass the 10 s join timeout.
  EXPECT_EQ(gate.pass({}, HealthCheckFacts{}, 10s), 1);
  EXPECT_EQ(loop.launched_at.size(), 4u);
  EXPECT_NE(events.notices.back().find("failed 4 times"), std::string::npos);
  EXPECT_NE(events.notices.back().find("join timeout (10000 ms"), std::string::npos);
}

TEST(HealthGateTest, EachTryIsNumbered) {
  FakeTime time;
  ScriptedLoop loop(time, {1, 2, 0});
  SeenEvents events;
  const HealthCheckOptions options = fast_options();
  HealthGate gate(options, loop, time, events, nullptr);
  EXPECT_EQ(gate.pass({}, HealthCheckFacts{}, 60s), std::nullopt);
  EXPECT_EQ(loop.attempts,
            (std::vector<std::string>{"DDP_HEALTH_CHECK_ATTEMPT=1", "DDP_HEALTH_CHECK_ATTEMPT=2",
                                      "DDP_HEALTH_CHECK_ATTEMPT=3"}));
}

TEST(HealthReadinessTest, NotReadyNamesTheFailedCheck) {
  JobSnapshot job;
  job.state = JobState::kRendezvous;
  job.health_check_failure = "health check `c` exited with status 1; its output: gpu bad";
  const Health ready = readiness(job);
  EXPECT_FALSE(ready.ok);
  EXPECT_EQ(ready.reason,
            "not joining: health check `c` exited with status 1; its output: gpu bad");
  job.health_check_failure.clear();
  EXPECT_EQ(readiness(job).reason.find("not joining"), std::string::npos);
}

}  // namespace
}  // namespace ddp::agent
