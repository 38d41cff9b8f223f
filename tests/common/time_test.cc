#include "ddp/common/time.h"

#include <thread>

#include <gtest/gtest.h>

namespace ddp {
namespace {

using namespace std::chrono_literals;

TEST(Deadline, ExpiresAfterItsTimeout) {
  Deadline deadline(20ms);
  EXPECT_FALSE(deadline.expired());
  EXPECT_GT(deadline.remaining().count(), 0);
  std::this_thread::sleep_for(30ms);
  EXPECT_TRUE(deadline.expired());
  EXPECT_EQ(deadline.remaining().count(), 0);
}

TEST(Deadline, NeverDoesNotExpireAndHugeTimeoutsSaturate) {
  EXPECT_FALSE(Deadline::never().expired());
  EXPECT_FALSE(Deadline(Duration::max()).expired());
  EXPECT_GT(Deadline::never().remaining(), std::chrono::hours(24 * 365));
}

TEST(Backoff, DoublesUpToTheMaximumWithBoundedJitter) {
  Backoff backoff(10ms, 80ms);
  Duration expected_base = 10ms;
  for (int i = 0; i < 8; ++i) {
    Duration d = backoff.next();
    EXPECT_GE(d, expected_base);
    EXPECT_LE(d, expected_base + expected_base / 4 + 1ms);
    expected_base = std::min<Duration>(expected_base * 2, 80ms);
  }
  backoff.reset();
  EXPECT_LE(backoff.next(), 13ms);
}

}  // namespace
}  // namespace ddp

TEST(FakeTime, MovesOnlyWhenAdvanced) {
  ddp::FakeTime time;
  const auto start = time.now();
  EXPECT_EQ(time.now(), start);
  time.advance(std::chrono::milliseconds(1500));
  EXPECT_EQ(time.now() - start, std::chrono::milliseconds(1500));
}

TEST(FakeTime, DrivesADeadline) {
  ddp::FakeTime time;
  ddp::Deadline deadline(std::chrono::seconds(5), time);
  EXPECT_FALSE(deadline.expired());
  EXPECT_EQ(deadline.remaining(), std::chrono::seconds(5));
  time.advance(std::chrono::milliseconds(4999));
  EXPECT_FALSE(deadline.expired());
  time.advance(std::chrono::milliseconds(1));
  EXPECT_TRUE(deadline.expired());
  EXPECT_EQ(deadline.remaining(), std::chrono::milliseconds(0));
}

namespace ddp {
namespace {

TEST(FakeTimeWall, TheWallClockMovesWithTheFakeClockOnly) {
  FakeTime time;
  const auto start = time.wall_now();
  EXPECT_EQ(std::chrono::duration_cast<std::chrono::seconds>(start.time_since_epoch()).count(),
            1767225600);  // 2026-01-01T00:00:00Z
  time.advance(std::chrono::milliseconds(2500));
  EXPECT_EQ(time.wall_now() - start, std::chrono::milliseconds(2500));
  // The real runtime's is the system clock.
  const auto before = std::chrono::system_clock::now();
  const auto real = real_runtime().wall_now();
  EXPECT_GE(real, before);
  EXPECT_LE(real - before, std::chrono::seconds(5));
}

}  // namespace
}  // namespace ddp
