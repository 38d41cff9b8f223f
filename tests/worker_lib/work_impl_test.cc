// WorkImpl's completion callbacks (Work::on_completion), which the torch
// backend chains torch futures on.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>

#include "work_impl.h"

namespace ddp::detail {
namespace {

using namespace std::chrono_literals;

TEST(WorkImplCompletion, CallbackRunsOnceWhenCompleted) {
  WorkImpl work(0, "allreduce", 5s);
  int calls = 0;
  bool completed_in_callback = false;
  ASSERT_TRUE(work.on_completion([&] {
    ++calls;
    completed_in_callback = work.is_completed();
  }));
  EXPECT_EQ(calls, 0);
  work.complete();
  work.complete();
  work.fail(std::make_exception_ptr(std::runtime_error("late")));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(completed_in_callback);
  EXPECT_EQ(work.exception(), nullptr);
}

TEST(WorkImplCompletion, CallbackSeesTheFailure) {
  WorkImpl work(3, "broadcast", 5s);
  std::exception_ptr seen;
  ASSERT_TRUE(work.on_completion([&] { seen = work.exception(); }));
  work.fail(std::make_exception_ptr(std::runtime_error("peer 1 died")));
  ASSERT_NE(seen, nullptr);
  EXPECT_THROW(std::rethrow_exception(seen), std::runtime_error);
}

TEST(WorkImplCompletion, CallbackAddedAfterCompletionRunsAtOnce) {
  WorkImpl work(1, "barrier", 5s);
  work.complete();
  int calls = 0;
  ASSERT_TRUE(work.on_completion([&] { ++calls; }));
  EXPECT_EQ(calls, 1);
}

TEST(WorkImplCompletion, EveryCallbackRunsWhenCompletionRacesRegistration) {
  for (int round = 0; round < 50; ++round) {
    WorkImpl work(round, "allreduce", 5s);
    std::atomic<int> calls{0};
    std::thread completer([&] { work.complete(); });
    for (int i = 0; i < 20; ++i) work.on_completion([&] { ++calls; });
    completer.join();
    EXPECT_EQ(calls.load(), 20);
  }
}

}  // namespace
}  // namespace ddp::detail
