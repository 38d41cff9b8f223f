// BackgroundCall and BackgroundWorker: waits bounded by a deadline, late work
// abandoned without blocking its owner, and the worker's order of ticks and
// tasks. Work that "blocks forever" waits on a latch the test opens at its end,
// so that no abandoned thread outlives the test binary's checks.
#include "ddp/common/background.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ddp {
namespace {

using namespace std::chrono_literals;

// A gate that abandoned work waits on; opened by the test.
struct Gate {
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
};

TEST(BackgroundCall, WaitReturnsOnceTheCallReturned) {
  std::atomic<int> ran{0};
  BackgroundCall call([&ran] { ran = 1; });
  EXPECT_TRUE(call.wait_until(Clock::now() + 60s));
  EXPECT_TRUE(call.finished());
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(call.error(), nullptr);
}

TEST(BackgroundCall, WaitWithoutADeadlineReturnsOnceTheCallReturned) {
  auto gate = std::make_shared<Gate>();
  std::atomic<bool> ran{false};
  BackgroundCall call([opened = gate->opened, &ran] {
    opened.wait();
    ran = true;
  });
  EXPECT_FALSE(call.finished());
  gate->open.set_value();
  call.wait();
  EXPECT_TRUE(call.finished());
  EXPECT_TRUE(ran.load());
}

TEST(BackgroundCall, KeepsWhatEscapedTheCall) {
  BackgroundCall call([] { throw std::runtime_error("store gone"); });
  ASSERT_TRUE(call.wait_until(Clock::now() + 60s));
  ASSERT_NE(call.error(), nullptr);
  try {
    std::rethrow_exception(call.error());
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "store gone");
  }
}

TEST(BackgroundCall, ALateCallIsAbandonedWithoutBlockingItsOwner) {
  auto gate = std::make_shared<Gate>();
  auto finished = std::make_shared<std::atomic<bool>>(false);
  const auto start = Clock::now();
  {
    BackgroundCall call([opened = gate->opened, finished] {
      opened.wait();
      *finished = true;
    });
    EXPECT_FALSE(call.wait_for(50ms));
    EXPECT_FALSE(call.finished());
    EXPECT_EQ(call.error(), nullptr) << "no error before the call returned";
  }  // destroyed while the call still blocks
  EXPECT_LT(Clock::now() - start, 30s) << "the destructor must not wait for the call";
  EXPECT_FALSE(finished->load());
  gate->open.set_value();
  // The abandoned call finishes on its own, touching only what it owns.
  for (int i = 0; i < 6000 && !finished->load(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(finished->load());
}

TEST(BackgroundWorker, TicksAtOnceAndThenEveryPeriod) {
  auto ticks = std::make_shared<std::atomic<int>>(0);
  BackgroundWorker worker(10ms, [ticks] { ++*ticks; });
  for (int i = 0; i < 6000 && ticks->load() < 3; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_GE(ticks->load(), 3);
  EXPECT_TRUE(worker.stop(60s));
  const int after_stop = ticks->load();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(ticks->load(), after_stop) << "no tick after stop";
}

TEST(BackgroundWorker, RunsPostedTasksInOrderBeforeTheNextTickAndTheLastTaskLast) {
  struct Log {
    std::mutex mutex;
    std::vector<std::string> entries;
    void add(std::string e) {
      std::lock_guard lock(mutex);
      entries.push_back(std::move(e));
    }
  };
  auto log = std::make_shared<Log>();
  // A period far longer than the test: only the first tick runs.
  BackgroundWorker worker(1h, [log] { log->add("tick"); });
  worker.post([log] { log->add("a"); });
  worker.post([log] { throw std::runtime_error("best effort"); });
  worker.post([log] { log->add("b"); });
  EXPECT_TRUE(worker.stop(60s, [log] { log->add("last"); }));
  std::lock_guard lock(log->mutex);
  // The first tick may run before or after the tasks posted at start; the
  // tasks keep their order, a failing one does not stop the rest, and the
  // last task runs last.
  std::vector<std::string> tasks;
  for (const auto& e : log->entries) {
    if (e != "tick") tasks.push_back(e);
  }
  EXPECT_EQ(tasks, (std::vector<std::string>{"a", "b", "last"}));
  EXPECT_EQ(log->entries.back(), "last");
  EXPECT_LE(std::count(log->entries.begin(), log->entries.end(), "tick"), 1);
}

TEST(BackgroundWorker, AFailingTickEndsTheWorker) {
  auto ticks = std::make_shared<std::atomic<int>>(0);
  auto tasks = std::make_shared<std::atomic<int>>(0);
  BackgroundWorker worker(1ms, [ticks] {
    ++*ticks;
    throw std::runtime_error("store unreachable");
  });
  for (int i = 0; i < 6000 && ticks->load() < 1; ++i) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(ticks->load(), 1);
  worker.post([tasks] { ++*tasks; });
  EXPECT_TRUE(worker.stop(60s));
  EXPECT_EQ(tasks->load(), 0);
}

TEST(BackgroundWorker, AWorkerBlockedPastTheStopDeadlineIsAbandoned) {
  auto gate = std::make_shared<Gate>();
  auto entered = std::make_shared<std::atomic<bool>>(false);
  auto done = std::make_shared<std::atomic<bool>>(false);
  const auto start = Clock::now();
  {
    BackgroundWorker worker(1h, [opened = gate->opened, entered, done] {
      *entered = true;
      opened.wait();
      *done = true;
    });
    // Stopped once its first tick blocks (a stop before it would end the
    // worker without a tick at all).
    for (int i = 0; i < 6000 && !entered->load(); ++i) std::this_thread::sleep_for(10ms);
    ASSERT_TRUE(entered->load());
    EXPECT_FALSE(worker.stop(50ms));
    EXPECT_FALSE(worker.stop(60s)) << "a second stop answers the same, at once";
  }
  EXPECT_LT(Clock::now() - start, 30s);
  gate->open.set_value();
  for (int i = 0; i < 6000 && !done->load(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(done->load());
}

TEST(FakeTime, SleepingAdvancesTheClockAndReturnsAtOnce) {
  FakeTime time;
  const Runtime& runtime = time;
  const auto start = runtime.now();
  const auto real_start = Clock::now();
  runtime.sleep_for(1h);
  EXPECT_EQ(runtime.now() - start, 1h);
  EXPECT_LT(Clock::now() - real_start, 30s);
  runtime.sleep_for(-5s);
  EXPECT_EQ(runtime.now() - start, 1h) << "a negative sleep does not move the clock back";
}

TEST(FakeTime, ThreadsAreStartedThroughTheRuntimeAndCounted) {
  FakeTime time;
  {
    BackgroundCall call([] {}, time);
    EXPECT_TRUE(call.wait_until(Clock::now() + 60s));
    EXPECT_EQ(time.threads_started(), 1);
    BackgroundWorker worker(
        1h, [] {}, time);
    EXPECT_EQ(time.threads_started(), 2);
    EXPECT_TRUE(worker.stop(60s));
  }
  BackgroundCall real([] {});
  EXPECT_TRUE(real.wait_until(Clock::now() + 60s));
  EXPECT_EQ(time.threads_started(), 2) << "work started with the real runtime is not counted";
}

}  // namespace
}  // namespace ddp
