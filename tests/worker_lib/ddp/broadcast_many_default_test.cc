// ProcessGroup::broadcast_many' default (a backend without its own: one
// broadcast() a buffer) over the in-process ThreadProcessGroup: every buffer
// arrives, the Work completes once every broadcast did, and a failure of any
// of them is the Work's. broadcast_is_fast() defaults to false.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "ddp/common/error.h"
#include "thread_process_group.h"

namespace ddp::testing {
namespace {

TEST(BroadcastManyDefault, EveryBufferArrivesFromTheRoot) {
  const int world = 3;
  auto shared = std::make_shared<ThreadWorld>(world);
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> a(world);
  std::vector<std::vector<std::int64_t>> b(world);
  for (int r = 0; r < world; ++r) {
    a[static_cast<std::size_t>(r)].assign(100, static_cast<float>(r));
    b[static_cast<std::size_t>(r)].assign(7, r * 10);
  }
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ThreadProcessGroup group(shared, r);
      EXPECT_FALSE(group.broadcast_is_fast());
      auto& mine_a = a[static_cast<std::size_t>(r)];
      auto& mine_b = b[static_cast<std::size_t>(r)];
      const WorkPtr work = group.broadcast_many({Buffer::of(mine_a), Buffer::of(mine_b)}, 1);
      EXPECT_TRUE(work->wait());
      EXPECT_TRUE(work->is_completed());
      EXPECT_EQ(work->exception(), nullptr);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    for (float x : a[static_cast<std::size_t>(r)]) EXPECT_EQ(x, 1.0f) << "rank " << r;
    for (std::int64_t x : b[static_cast<std::size_t>(r)]) EXPECT_EQ(x, 10) << "rank " << r;
  }
}

TEST(BroadcastManyDefault, AFailedBroadcastFailsTheWork) {
  const int world = 2;
  auto shared = std::make_shared<ThreadWorld>(world);
  ThreadProcessGroup group(shared, 0);
  std::vector<float> a(4), b(4);
  group.abort("a node left");
  const WorkPtr work = group.broadcast_many({Buffer::of(a), Buffer::of(b)}, 0);
  EXPECT_THROW(work->wait(), GroupChanged);
  EXPECT_NE(work->exception(), nullptr);
}

}  // namespace
}  // namespace ddp::testing
