// The device-independent logic of the NCCL backend, driven with fake device
// events: completion in issue order, timeouts naming missing ranks, async
// errors aborting the communicator, the unique-id exchange.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "ddp/common/error.h"
#include "ddp/store/memory_store.h"
#include "work_tracker.h"

namespace ddp::detail {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// The watchdog thread reads the asynchronous error while the test sets it:
// both go through the mutex.
struct FakeBackend {
  std::atomic<int> aborts{0};
  void set_async(std::string error) {
    std::lock_guard lock(mutex);
    async = std::move(error);
  }
  WorkTracker::Hooks hooks() {
    return {[this] {
              std::lock_guard lock(mutex);
              return async;
            },
            [this] { ++aborts; },
            {}};
  }

 private:
  std::mutex mutex;
  std::optional<std::string> async;
};

std::shared_ptr<WorkImpl> make_work(std::uint64_t seq, const char* op = "allreduce") {
  return std::make_shared<WorkImpl>(seq, op, 5s);
}

TEST(WorkTracker, CompletesInIssueOrder) {
  FakeBackend backend;
  WorkTracker tracker("test", 10s, nullptr, backend.hooks());
  std::vector<std::shared_ptr<WorkImpl>> works;
  std::vector<bool> done(3, false);
  for (int i = 0; i < 3; ++i) {
    works.push_back(make_work(i));
    tracker.add(works.back(), i, [&done, i] { return static_cast<bool>(done[i]); });
  }
  done[1] = true;  // the device finished #1 before #0: not reported yet
  tracker.poll();
  EXPECT_FALSE(works[0]->is_completed());
  EXPECT_FALSE(works[1]->is_completed());
  done[0] = true;
  tracker.poll();
  EXPECT_TRUE(works[0]->is_completed());
  EXPECT_TRUE(works[1]->is_completed());
  EXPECT_FALSE(works[2]->is_completed());
  EXPECT_EQ(tracker.outstanding(), 1u);
  EXPECT_EQ(backend.aborts, 0);
}

TEST(WorkTracker, TimeoutAbortsAndNamesMissingRanks) {
  auto store = std::make_shared<MemoryStore>();
  auto arrivals0 = std::make_shared<ArrivalTracker>(store, 0, 3);
  ArrivalTracker arrivals1(store, 1, 3);
  arrivals0->entered(0);
  arrivals1.entered(0);  // rank 2 never enters collective 0
  FakeBackend backend;
  WorkTracker tracker("ProcessGroupNccl[test]", 1s, arrivals0, backend.hooks());
  auto issued = WorkTracker::Clock::now();
  auto w0 = make_work(0);
  auto w1 = make_work(1, "broadcast");
  tracker.add(
      w0, 0, [] { return false; }, issued);
  tracker.add(
      w1, 1, [] { return false; }, issued);
  EXPECT_EQ(tracker.poll(issued + 500ms), std::nullopt);
  auto failure = tracker.poll(issued + 1500ms);
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(backend.aborts, 1);
  try {
    w0->wait();
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("allreduce #0 timed out"));
    EXPECT_THAT(e.what(), HasSubstr("ranks that did not arrive: [2]"));
  }
  EXPECT_THROW(w1->wait(), BackendError);
  EXPECT_THROW(tracker.add(make_work(2), 2, [] { return true; }), BackendError);
  EXPECT_TRUE(tracker.broken());
}

TEST(WorkTracker, AsyncErrorAbortsFromTheWatchdog) {
  FakeBackend backend;
  WorkTracker tracker("test", 60s, nullptr, backend.hooks());
  auto w = make_work(0);
  tracker.add(w, 0, [] { return false; });
  tracker.start_watchdog(10ms);
  backend.set_async("unhandled system error");
  try {
    w->wait(5s);
    FAIL() << "expected BackendError";
  } catch (const BackendError& e) {
    EXPECT_THAT(e.what(), HasSubstr("unhandled system error"));
  }
  EXPECT_EQ(backend.aborts, 1);
}

TEST(WorkTracker, FailingQueryFailsTheWork) {
  FakeBackend backend;
  WorkTracker tracker("test", 60s, nullptr, backend.hooks());
  auto w = make_work(0);
  tracker.add(w, 0, []() -> bool { throw BackendError("cuda", "illegal memory access"); });
  tracker.poll();
  EXPECT_THROW(w->wait(), BackendError);
  EXPECT_EQ(backend.aborts, 1);
}

TEST(UniqueIdExchange, RankZeroPublishesOthersBlock) {
  MemoryStore store;
  std::string got1, got2;
  std::thread t1([&] {
    got1 = exchange_unique_id(
        store, 1, [] { return std::string("x"); }, 5s);
  });
  std::thread t2([&] {
    got2 = exchange_unique_id(
        store, 2, [] { return std::string("y"); }, 5s);
  });
  std::this_thread::sleep_for(50ms);
  auto id = exchange_unique_id(
      store, 0, [] { return std::string("\x01\x00\x02id", 5); }, 5s);
  t1.join();
  t2.join();
  EXPECT_EQ(id, std::string("\x01\x00\x02id", 5));
  EXPECT_EQ(got1, id);
  EXPECT_EQ(got2, id);
}

TEST(UniqueIdExchange, TimesOutNamingTheKey) {
  MemoryStore store;
  try {
    exchange_unique_id(
        store, 1, [] { return std::string(); }, 100ms);
    FAIL();
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("nccl/unique_id"));
  }
}

}  // namespace
}  // namespace ddp::detail
