// The agent's side of the control channels (worker_control.h), against the
// worker's end of each pair held by the test.
#include "worker_control.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <utility>

#include "ddp/worker_contract/control_channel.h"
#include "ddp/worker_contract/worker_contract.h"

namespace ddp::agent {
namespace {

// The worker's end, as a started worker holds it (the agent closed its copy).
int take_worker_end(WorkerControl& control, int local_rank) {
  const int fd = control.prepare(local_rank);
  const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  control.started(local_rank);
  return copy;
}

TEST(WorkerControl, AWorkerIsInPlaceOnceItSaysHello) {
  WorkerControl control;
  const int worker = take_worker_end(control, 0);
  control.poll();
  EXPECT_FALSE(control.in_place(0));
  ASSERT_EQ(control::Sent::kSent,
            control::send(worker, control::Message("hello").set("in_place", 1)));
  control.poll();
  EXPECT_TRUE(control.in_place(0));
  EXPECT_FALSE(control.in_place(1));  // no such worker
  ::close(worker);
}

TEST(WorkerControl, ReportsAreKeptUntilTheNextReform) {
  WorkerControl control;
  const int worker = take_worker_end(control, 2);
  const control::Message reformed = contract::encode(contract::Reformed{4, 0, 0.5, 0.25});
  const control::Message synced =
      contract::encode(contract::Synced{4, 1, /*received=*/true, false, 1048576, 0.125});
  ASSERT_EQ(control::Sent::kSent, control::send(worker, reformed));
  ASSERT_EQ(control::Sent::kSent, control::send(worker, synced));
  control.poll();
  ASSERT_TRUE(control.reformed(2));
  EXPECT_EQ(control.reformed(2)->round, 4);
  EXPECT_DOUBLE_EQ(control.reformed(2)->build_seconds, 0.25);
  ASSERT_TRUE(control.synced(2));
  EXPECT_EQ(control.synced(2)->root, 1);
  EXPECT_EQ(control.synced(2)->bytes, 1048576);
  EXPECT_TRUE(control.synced(2)->received);
  control.expect_reform(2, 5);
  EXPECT_FALSE(control.reformed(2));
  EXPECT_FALSE(control.synced(2));
  ::close(worker);
}

// A report the worker sent before it heard of the round the agent expects now
// (its sync of the round that ended, read after expect_reform) is not taken
// for one of the new round: the synced report carries its round, and the
// agent drops the stale one.
TEST(WorkerControl, AReportOfTheRoundThatEndedIsNotTakenForTheNextOne) {
  WorkerControl control;
  const int worker = take_worker_end(control, 0);
  control.expect_reform(0, 3);
  ASSERT_EQ(control::Sent::kSent,
            control::send(worker, contract::encode(contract::Reformed{3, 0, 0.5, 0.25})));
  ASSERT_EQ(control::Sent::kSent,
            control::send(worker, contract::encode(contract::Synced{3, 0, false, true, 64, 0.5})));
  control.poll();
  ASSERT_TRUE(control.reformed(0));
  ASSERT_TRUE(control.synced(0));
  EXPECT_EQ(control.synced(0)->round, 3);
  // Round 3 ends as the worker finishes another sync in it; round 4 is expected.
  ASSERT_EQ(control::Sent::kSent,
            control::send(worker, contract::encode(contract::Synced{3, 0, false, true, 64, 0.5})));
  ASSERT_EQ(control::Sent::kSent,
            control::send(worker, contract::encode(contract::Reformed{3, 0, 0.5, 0.25})));
  control.expect_reform(0, 4);
  control.poll();
  EXPECT_FALSE(control.synced(0));
  EXPECT_FALSE(control.reformed(0));
  ASSERT_EQ(control::Sent::kSent,
            control::send(worker, contract::encode(contract::Reformed{4, 1, 0.5, 0.25})));
  ASSERT_EQ(control::Sent::kSent,
            control::send(worker, contract::encode(contract::Synced{4, 1, true, true, 64, 0.5})));
  control.poll();
  ASSERT_TRUE(control.reformed(0));
  EXPECT_EQ(control.reformed(0)->rank, 1);
  ASSERT_TRUE(control.synced(0));
  EXPECT_EQ(control.synced(0)->round, 4);
  EXPECT_TRUE(control.synced(0)->received);
  ::close(worker);
}

TEST(WorkerControl, TheAgentsMessagesReachTheWorker) {
  WorkerControl control;
  const int worker = take_worker_end(control, 0);
  ASSERT_EQ(control.send(0, control::Message("abort").set("why", "node 2 was lost")),
            control::Sent::kSent);
  control::Message got;
  ASSERT_EQ(control::receive(worker, got, false), control::Received::kMessage);
  EXPECT_EQ(got.type, "abort");
  EXPECT_EQ(got.text("why"), "node 2 was lost");
  EXPECT_EQ(control.send(7, control::Message("abort")), control::Sent::kClosed);  // no such worker
  ::close(worker);
  EXPECT_EQ(control.send(0, control::Message("abort")), control::Sent::kClosed);  // gone
}

TEST(WorkerControl, AFloodingOrGarbledWorkerCannotHoldTheAgent) {
  WorkerControl control;
  const int worker = take_worker_end(control, 0);
  ::fcntl(worker, F_SETFL, O_NONBLOCK);  // the test never blocks on a full buffer
  ASSERT_EQ(::send(worker, "garbage", 7, 0), 7);
  for (int i = 0; i < 99; ++i) {
    ASSERT_EQ(control::Sent::kSent,
              control::send(worker, control::Message("hello").set("in_place", 1)));
  }
  ASSERT_EQ(control::Sent::kSent,
            control::send(worker, control::Message("hello").set("in_place", 0)));
  // One poll reads a bounded number (the garbage dropped): not the last hello yet.
  control.poll();
  EXPECT_TRUE(control.in_place(0));
  // The rest waits for the next polls.
  control.poll();
  control.poll();
  EXPECT_FALSE(control.in_place(0));
  ::close(worker);
}

// A kept worker that never reads its channel: the agent's sends return at
// once, and once the socket's buffer is full they say so (they used to block,
// and the agent's loop with them).
TEST(WorkerControl, SendingToAWorkerThatNeverReadsReturnsFullAtOnce) {
  WorkerControl control;
  const int worker = take_worker_end(control, 3);
  control::Message abort("abort");
  abort.set("round", 2).set("why", std::string(2000, 'x'));
  auto filling = std::async(std::launch::async, [&] {
    int sent = 0;
    for (; sent < 100000; ++sent) {  // a few hundred fill the buffer
      const control::Sent result = control.send(3, abort);
      if (result != control::Sent::kSent) return std::make_pair(sent, result);
    }
    return std::make_pair(sent, control::Sent::kSent);
  });
  if (filling.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ::shutdown(worker, SHUT_RDWR);  // the blocked send returns: the test ends
    filling.wait();
    ::close(worker);
    FAIL() << "the agent's send blocked on a worker that never reads";
  }
  const auto [sent, result] = filling.get();
  EXPECT_GT(sent, 0);
  EXPECT_EQ(result, control::Sent::kFull);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(control.send(3, abort), control::Sent::kFull);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  ::close(worker);
  EXPECT_EQ(control.send(3, abort), control::Sent::kClosed);
}

TEST(WorkerControl, ANewWorkerInASlotGetsANewChannel) {
  WorkerControl control;
  const int first = take_worker_end(control, 0);
  ASSERT_EQ(control::Sent::kSent,
            control::send(first, control::Message("hello").set("in_place", 1)));
  control.poll();
  ASSERT_TRUE(control.in_place(0));
  const int second = take_worker_end(control, 0);  // the slot's next worker
  EXPECT_FALSE(control.in_place(0));
  control::Message got;
  EXPECT_EQ(control::receive(first, got, false), control::Received::kClosed);
  ::close(first);
  ::close(second);
}

}  // namespace
}  // namespace ddp::agent
