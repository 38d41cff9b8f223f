// The round's end watcher (rendezvous/src/round_control.h): once its
// destructor returned, its wake-up never runs (the agent destroys what the
// wake-up touches right after). Before: the watch thread checked that it was
// not cancelled and then woke its owner, so a destructor that ran between the
// two returned with a wake-up still to come. No test can force that
// interleaving; this one races the key's arrival against the destructor many
// times, with the end landing on both sides of it.
#include "round_control.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "ddp/store/memory_store.h"

namespace ddp::rendezvous_detail {
namespace {

TEST(EndKeyWatch, NoWakeUpRunsAfterTheDestructorReturned) {
  std::mt19937 random(17);
  std::uniform_int_distribution<int> delay_us(0, 300);
  int woke = 0, late = 0;
  for (int i = 0; i < 2000; ++i) {
    auto store = std::make_shared<MemoryStore>();
    auto destroyed = std::make_shared<std::atomic<bool>>(false);
    auto counts = std::make_shared<std::atomic<int>>(0);
    auto late_count = std::make_shared<std::atomic<int>>(0);
    auto watch = watch_end_key(
        store, "end",
        [destroyed, counts, late_count] {
          ++*counts;
          if (destroyed->load()) ++*late_count;
        },
        "test");
    const int set_after = delay_us(random), destroy_after = delay_us(random);
    std::thread setter([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(set_after));
      store->set("end", "done");
    });
    std::this_thread::sleep_for(std::chrono::microseconds(destroy_after));
    watch.reset();
    destroyed->store(true);
    setter.join();
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // a late wake-up would come now
    woke += counts->load();
    late += late_count->load();
  }
  EXPECT_EQ(late, 0) << "wake-ups after the destructor returned";
  EXPECT_GT(woke, 0) << "the race never let the end arrive first: the test proves nothing";
}

}  // namespace
}  // namespace ddp::rendezvous_detail
