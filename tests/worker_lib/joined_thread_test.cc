// The worker library's owned threads (worker_lib/src/joined_thread.h): started
// through the runtime, joined by their owner, never left running.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <utility>

#include "ddp/common/time.h"
#include "joined_thread.h"

namespace ddp::detail {
namespace {

using namespace std::chrono_literals;

// A body that runs until released, so a test can tell a join from a no-op.
struct Gate {
  std::mutex mutex;
  std::condition_variable cv;
  bool open = false;
  std::atomic<int> finished{0};

  void wait_and_finish() {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return open; });
    ++finished;
  }
  void release() {
    {
      std::lock_guard lock(mutex);
      open = true;
    }
    cv.notify_all();
  }
};

TEST(JoinedThreadTest, StartsThroughTheRuntime) {
  FakeTime time;
  std::atomic<bool> ran{false};
  JoinedThread thread([&] { ran = true; }, time);
  thread.join();
  EXPECT_TRUE(ran.load());
  EXPECT_EQ(time.threads_started(), 1);
  EXPECT_FALSE(thread.joinable());
  thread.join();  // joined already: returns at once
}

TEST(JoinedThreadTest, TheDestructorWaitsForTheBody) {
  Gate gate;
  {
    JoinedThread thread([&] { gate.wait_and_finish(); });
    EXPECT_TRUE(thread.joinable());
    gate.release();
  }
  EXPECT_EQ(gate.finished.load(), 1);
}

TEST(JoinedThreadTest, AssigningJoinsTheThreadHeldBefore) {
  Gate first;
  Gate second;
  JoinedThread thread([&] { first.wait_and_finish(); });
  first.release();
  thread = JoinedThread([&] { second.wait_and_finish(); });
  EXPECT_EQ(first.finished.load(), 1);
  EXPECT_TRUE(thread.joinable());
  second.release();
  thread.join();
  EXPECT_EQ(second.finished.load(), 1);
}

TEST(JoinedThreadTest, AnEmptyOneHoldsNoThread) {
  JoinedThread none;
  EXPECT_FALSE(none.joinable());
  none.join();
  JoinedThread moved_from([] {});
  JoinedThread taken(std::move(moved_from));
  EXPECT_TRUE(taken.joinable());
  taken.join();
}

}  // namespace
}  // namespace ddp::detail
