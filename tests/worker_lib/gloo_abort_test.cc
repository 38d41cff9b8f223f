// ProcessGroup::abort on the Gloo backend (and on the in-process test double):
// the operation in flight, the queued ones and every later one fail with
// GroupChanged carrying the reason, at once; the peers blocked on the aborted
// rank fail too; a Work that had completed stays completed; an aborted group is
// destroyed promptly; the ranks re-form a new group on a new store prefix while a
// rank left on the old one fails instead of hanging. Ranks are threads over a
// MemoryStore with real Gloo connections. Every group has a 60 s timeout and
// every aborted wait is asserted to end within 5 s, so a wait that is not woken
// shows up as a failure, not as a slow pass.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "ddp/common/error.h"
#include "ddp/store/memory_store.h"
#include "ddp/store/prefix_store.h"
#include "ddp/thread_process_group.h"
#include "test_util.h"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr auto kGroupTimeout = 60s;
constexpr auto kPrompt = 5s;  // bound of every wait that an abort must end

GlooOptions options_for(AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto) {
  GlooOptions options;
  options.timeout = kGroupTimeout;
  options.allreduce_algorithm = algorithm;
  if (algorithm == AllreduceAlgorithm::kSharedMemory) {
    options.shared_memory = true;
  } else if (algorithm != AllreduceAlgorithm::kAuto) {
    options.shared_memory = false;
  }
  return options;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void report(const std::string& what, double seconds) {
  std::printf("[   timing ] %s: %.3f s\n", what.c_str(), seconds);
  std::fflush(stdout);
}

// Waits at most `bound` for `work`: its failure, or nullptr when it succeeded.
// A Work still running after `bound` is a test failure.
std::exception_ptr failure_within(const WorkPtr& work, std::chrono::milliseconds bound = kPrompt) {
  try {
    if (!work->wait(bound)) {
      ADD_FAILURE() << "work #" << work->sequence_number() << " still running after "
                    << bound.count() << " ms";
    }
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

// what() of `error` when it is an E; a test failure (and "") otherwise.
template <typename E>
std::string what_if(const std::exception_ptr& error) {
  if (!error) {
    ADD_FAILURE() << "expected a failure, got success (or still running)";
    return "";
  }
  try {
    std::rethrow_exception(error);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "failed with another error type: " << e.what();
  }
  return "";
}

// ---- (a) the collective in flight, for every all-reduce algorithm ---------------

class GlooAbortAlgorithm : public ::testing::TestWithParam<AllreduceAlgorithm> {};

TEST_P(GlooAbortAlgorithm, FailsTheCollectiveInFlightHereAndOnThePeerAtOnce) {
  const int world = 3;
  auto groups = make_groups(world, std::make_shared<MemoryStore>(), options_for(GetParam()));
  std::vector<float> b0(1000, 1.0f), b1(1000, 2.0f);
  auto w0 = groups[0]->allreduce(Buffer::of(b0));
  auto w1 = groups[1]->allreduce(Buffer::of(b1));
  // Rank 2 stays connected but never issues the collective: 0 and 1 block.
  std::this_thread::sleep_for(300ms);
  ASSERT_FALSE(w0->is_completed());
  ASSERT_FALSE(w1->is_completed());

  const auto start = Clock::now();
  groups[0]->abort("node 3 was lost");
  report(fmt::format("{}: abort() returned after", to_string(GetParam())), seconds_since(start));
  const auto here = what_if<GroupChanged>(failure_within(w0));
  const double here_s = seconds_since(start);
  EXPECT_THAT(here, HasSubstr("node 3 was lost"));
  EXPECT_THAT(here, HasSubstr("allreduce #0"));
  EXPECT_LT(here_s, 5.0);
  // Rank 1 waits on rank 2 (and on rank 0); its connection to rank 0 was reset.
  const auto peer = what_if<NetworkError>(failure_within(w1));
  const double peer_s = seconds_since(start);
  EXPECT_THAT(peer, Not(HasSubstr("timed out")));
  EXPECT_LT(peer_s, 5.0);
  report(fmt::format("{}: rank 0 (aborted) failed after", to_string(GetParam())), here_s);
  report(fmt::format("{}: rank 1 (peer) failed after", to_string(GetParam())), peer_s);

  // Rank 1's group is over as well: its next collective fails, never hangs.
  std::vector<float> more(4, 1.0f);
  EXPECT_NE(failure_within(groups[1]->allreduce(Buffer::of(more))), nullptr);
}

// ---- (b) queued and later operations --------------------------------------------

TEST(GlooAbort, QueuedAndLaterOperationsFailWithGroupChanged) {
  auto groups = make_groups(2, std::make_shared<MemoryStore>(), options_for());
  auto& g = groups[0];  // rank 1 never issues anything
  std::vector<float> a(256, 1.0f), b(256, 2.0f), gathered(512), scattered(128), c(64, 3.0f);
  std::vector<std::int32_t> out(8, 7), in(8);
  auto in_flight = g->allreduce(Buffer::of(a));
  std::vector<WorkPtr> queued = {
      g->broadcast(Buffer::of(b), 0),
      g->allgather(Buffer::of(gathered), Buffer::of(b)),
      g->reduce_scatter(Buffer::of(scattered), Buffer::of(b)),
      g->reduce(Buffer::of(c), 0),
      g->barrier(),
      g->send(Buffer::of(out), 1, 3),
      g->recv(Buffer::of(in), 1, 4),
  };
  std::this_thread::sleep_for(200ms);
  ASSERT_FALSE(in_flight->is_completed());
  for (const auto& w : queued) ASSERT_FALSE(w->is_completed());

  const auto start = Clock::now();
  g->abort("round 7 ended: node 2 joined");
  EXPECT_THAT(what_if<GroupChanged>(failure_within(in_flight)),
              HasSubstr("round 7 ended: node 2 joined"));
  const std::vector<std::string> names = {
      "broadcast", "allgather", "reduce_scatter", "reduce", "barrier", "send", "recv"};
  for (std::size_t i = 0; i < queued.size(); ++i) {
    const auto what = what_if<GroupChanged>(failure_within(queued[i]));
    EXPECT_THAT(what, HasSubstr("round 7 ended: node 2 joined")) << names[i];
    EXPECT_THAT(what, HasSubstr(names[i])) << names[i];
  }
  report("queued operations all failed after", seconds_since(start));

  // Every later operation has failed by the time it returns.
  std::vector<WorkPtr> later = {
      g->allreduce(Buffer::of(a)),
      g->broadcast(Buffer::of(b), 1),
      g->allgather(Buffer::of(gathered), Buffer::of(b)),
      g->reduce_scatter(Buffer::of(scattered), Buffer::of(b)),
      g->reduce(Buffer::of(c), 1),
      g->barrier(),
      g->send(Buffer::of(out), 1, 5),
      g->recv(Buffer::of(in), 1, 6),
  };
  for (const auto& w : later) {
    EXPECT_TRUE(w->is_completed());
    EXPECT_THAT(what_if<GroupChanged>(w->exception()), HasSubstr("round 7 ended: node 2 joined"));
  }
  // Collectives keep their numbering after the abort (six were issued before).
  EXPECT_EQ(later[0]->sequence_number(), 6u);
  for (float v : a) EXPECT_EQ(v, 1.0f);  // nothing was written into the buffers
  for (std::int32_t v : in) EXPECT_EQ(v, 0);
}

// ---- (c) idempotent, first reason kept, concurrent ------------------------------

TEST(GlooAbort, IsIdempotentKeepsTheFirstReasonAndIsSafeFromManyThreads) {
  auto groups = make_groups(2, std::make_shared<MemoryStore>(), options_for());
  auto& g = groups[0];
  std::vector<float> a(1024, 1.0f);
  auto in_flight = g->allreduce(Buffer::of(a));  // rank 1 never joins
  std::this_thread::sleep_for(100ms);

  // Eight threads abort at once while a ninth keeps issuing collectives.
  constexpr int kAborters = 8;
  std::latch go(kAborters + 1);
  std::vector<std::thread> threads;
  for (int i = 0; i < kAborters; ++i) {
    threads.emplace_back([&, i] {
      go.arrive_and_wait();
      g->abort("reason " + std::to_string(i));
    });
  }
  std::vector<std::vector<float>> buffers(200, std::vector<float>(16, 1.0f));
  std::vector<WorkPtr> issued;
  threads.emplace_back([&] {
    go.arrive_and_wait();
    for (auto& buffer : buffers) issued.push_back(g->allreduce(Buffer::of(buffer)));
  });
  for (auto& t : threads) t.join();
  g->abort("a later reason");

  const auto first = what_if<GroupChanged>(failure_within(in_flight));
  int named = 0;
  std::string reason;
  for (int i = 0; i < kAborters; ++i) {
    if (first.find("reason " + std::to_string(i)) != std::string::npos) {
      ++named;
      reason = "reason " + std::to_string(i);
    }
  }
  EXPECT_EQ(named, 1) << first;
  EXPECT_THAT(first, Not(HasSubstr("a later reason")));
  // Every collective issued meanwhile failed (rank 1 never joins), with the same reason.
  for (const auto& w : issued) {
    const auto what = what_if<GroupChanged>(failure_within(w));
    EXPECT_THAT(what, HasSubstr(reason));
  }
  std::vector<float> more(4);
  EXPECT_THAT(what_if<GroupChanged>(g->barrier()->exception()), HasSubstr(reason));

  // The peer's group, aborted twice at once from two threads, too.
  std::thread other([&] { groups[1]->abort("peer reason A"); });
  groups[1]->abort("peer reason B");
  other.join();
  const auto peer = what_if<GroupChanged>(groups[1]->allreduce(Buffer::of(more))->exception());
  EXPECT_TRUE((peer.find("peer reason A") == std::string::npos) !=
              (peer.find("peer reason B") == std::string::npos))
      << peer;
}

// ---- (d) completed Works stay completed -----------------------------------------

TEST(GlooAbort, WorkCompletedBeforeTheAbortStaysSuccessful) {
  auto groups = make_groups(2, std::make_shared<MemoryStore>(), options_for());
  std::vector<std::vector<float>> bufs = {std::vector<float>(100, 1.0f),
                                          std::vector<float>(100, 2.0f)};
  std::vector<WorkPtr> done(2);
  run_threads(2, [&](int r) {
    done[r] = groups[r]->allreduce(Buffer::of(bufs[r]));
    done[r]->wait();
  });
  std::vector<std::int32_t> sent(4, 42), received(4, 0);
  auto send = groups[0]->send(Buffer::of(sent), 1, 9);
  auto recv = groups[1]->recv(Buffer::of(received), 0, 9);
  ASSERT_TRUE(send->wait(kPrompt));
  ASSERT_TRUE(recv->wait(kPrompt));

  groups[0]->abort("after the fact");
  groups[1]->abort("after the fact");
  for (const auto& w : {done[0], done[1], send, recv}) {
    EXPECT_TRUE(w->is_completed());
    EXPECT_EQ(w->exception(), nullptr);
    EXPECT_TRUE(w->wait(1ms));
  }
  for (const auto& buf : bufs) {
    for (float v : buf) EXPECT_EQ(v, 3.0f);
  }
  for (std::int32_t v : received) EXPECT_EQ(v, 42);
}

// ---- (e) a blocked receive -------------------------------------------------------

TEST(GlooAbort, BlockedReceiveAndSendAreAborted) {
  auto groups = make_groups(2, std::make_shared<MemoryStore>(), options_for());
  std::vector<std::int32_t> in0(16), in1(16), out0(16, 5);
  auto recv0 = groups[0]->recv(Buffer::of(in0), 1, 5);   // rank 1 never sends tag 5
  auto send0 = groups[0]->send(Buffer::of(out0), 1, 7);  // nor receives tag 7
  auto recv1 = groups[1]->recv(Buffer::of(in1), 0, 6);   // rank 0 never sends tag 6
  std::this_thread::sleep_for(200ms);
  ASSERT_FALSE(recv0->is_completed());
  ASSERT_FALSE(send0->is_completed());
  ASSERT_FALSE(recv1->is_completed());

  const auto start = Clock::now();
  groups[0]->abort("a worker elsewhere restarted");
  EXPECT_THAT(what_if<GroupChanged>(failure_within(recv0)),
              HasSubstr("a worker elsewhere restarted"));
  report("blocked recv failed after", seconds_since(start));
  EXPECT_THAT(what_if<GroupChanged>(failure_within(send0)), HasSubstr("send #1"));
  // The peer's receive from the aborted rank: its connection was reset.
  what_if<NetworkError>(failure_within(recv1));
  report("the peer's recv failed after", seconds_since(start));
  for (std::int32_t v : in0) EXPECT_EQ(v, 0);
}

// ---- (f) destroying an aborted group ---------------------------------------------

TEST_P(GlooAbortAlgorithm, DestroyingAnAbortedGroupReturnsPromptly) {
  const int world = 3;
  auto groups = make_groups(world, std::make_shared<MemoryStore>(), options_for(GetParam()));
  std::vector<float> b0(1 << 16, 1.0f), b1(1 << 16, 1.0f), queued(8);
  std::vector<std::int32_t> in(4);
  auto w0 = groups[0]->allreduce(Buffer::of(b0));  // in flight, rank 2 never joins
  auto recv = groups[0]->recv(Buffer::of(in), 1);  // queued behind it
  auto q0 = groups[0]->allreduce(Buffer::of(queued));
  auto w1 = groups[1]->allreduce(Buffer::of(b1));
  std::this_thread::sleep_for(200ms);

  groups[0]->abort("shutting the round down");
  auto start = Clock::now();
  groups[0].reset();  // without waiting for any Work first
  const double destroy_s = seconds_since(start);
  EXPECT_LT(destroy_s, 5.0);
  report(fmt::format("{}: destroying the aborted group took", to_string(GetParam())), destroy_s);
  for (const auto& w : {w0, recv, q0}) {
    EXPECT_TRUE(w->is_completed());
    what_if<GroupChanged>(w->exception());
  }
  // The peers, one blocked on the aborted rank and one idle, go down promptly too.
  start = Clock::now();
  groups[1].reset();
  groups[2].reset();
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_TRUE(w1->is_completed());
  EXPECT_NE(w1->exception(), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, GlooAbortAlgorithm,
                         ::testing::Values(AllreduceAlgorithm::kRing, AllreduceAlgorithm::kDirect,
                                           AllreduceAlgorithm::kBcube,
                                           AllreduceAlgorithm::kSharedMemory),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// ---- (g) re-forming ----------------------------------------------------------------

TEST(GlooAbort, SurvivorsReformOnANewPrefixWhileALeftoverRankFails) {
  auto base = std::make_shared<MemoryStore>();
  auto old_groups = make_groups(3, std::make_shared<PrefixStore>("round/0/", base), options_for());
  run_threads(3, [&](int r) {
    std::vector<float> x(32, 1.0f);
    old_groups[r]->allreduce(Buffer::of(x))->wait();
    for (float v : x) EXPECT_EQ(v, 3.0f);
  });

  // Rank 2's node is "lost": ranks 0 and 1 are inside the next collective when
  // their control threads abort the old group.
  std::latch reformed(2);
  std::vector<std::shared_ptr<ProcessGroup>> new_groups(2);
  std::thread control([&] {
    std::this_thread::sleep_for(300ms);
    old_groups[0]->abort("round 0 ended: rank 2's node was lost");
    old_groups[1]->abort("round 0 ended: rank 2's node was lost");
  });
  // Counts down once, also when the thread leaves early (a failure), so that
  // rank 2 never waits forever.
  struct CountDownOnce {
    std::latch& latch;
    bool done = false;
    void operator()() {
      if (!done) latch.count_down();
      done = true;
    }
    ~CountDownOnce() { (*this)(); }
  };
  run_threads(3, [&](int r) {
    if (r == 2) {
      // Left on the old group: once the others have re-formed, its collective
      // fails instead of hanging or reaching the new groups.
      reformed.wait();
      std::vector<float> x(32, 1.0f);
      const auto start = Clock::now();
      what_if<NetworkError>(failure_within(old_groups[2]->allreduce(Buffer::of(x))));
      report("the leftover rank's collective on the old group failed after", seconds_since(start));
      for (float v : x) EXPECT_EQ(v, 1.0f);
      return;
    }
    CountDownOnce count_down{reformed};
    std::vector<float> x(32, 1.0f);
    const auto error = failure_within(old_groups[r]->allreduce(Buffer::of(x)), 10s);
    if (r == 0) {
      what_if<GroupChanged>(error);
    } else {
      // Rank 1 may see rank 0's reset before its own abort: either error.
      what_if<ddp::Error>(error);
    }
    // The same thread forms the next round's group, as ddp::reform would.
    new_groups[r] =
        make_gloo_process_group(std::make_shared<PrefixStore>("round/1/", base), r, 2, [] {
          auto o = options_for();
          o.hostname = "127.0.0.1";
          return o;
        }());
    for (int step = 0; step < 3; ++step) {
      std::vector<float> y(1000, static_cast<float>(r + 1));
      new_groups[r]->allreduce(Buffer::of(y))->wait();
      for (float v : y) EXPECT_EQ(v, 3.0f);
      if (step == 0) count_down();
    }
  });
  control.join();
  // The new groups keep working after the leftover rank's failure.
  run_threads(2, [&](int r) {
    std::vector<double> z(7, r + 0.5);
    new_groups[r]->allreduce(Buffer::of(z))->wait();
    for (double v : z) EXPECT_EQ(v, 2.0);
  });
}

// ---- the in-process test double ----------------------------------------------------

TEST(ThreadProcessGroupAbort, EndsTheWorldWithGroupChangedAndKeepsTheFirstReason) {
  auto world = std::make_shared<testing::ThreadWorld>(2, 20s);
  testing::ThreadProcessGroup g0(world, 0), g1(world, 1);
  std::vector<float> a0(4, 1.0f), a1(4, 2.0f);
  auto c0 = g0.allreduce(Buffer::of(a0), ReduceOp::kSum);
  auto c1 = g1.allreduce(Buffer::of(a1), ReduceOp::kSum);
  ASSERT_TRUE(c0->wait(kPrompt));
  ASSERT_TRUE(c1->wait(kPrompt));
  std::vector<float> p(4, 1.0f);
  auto pending = g0.allreduce(Buffer::of(p), ReduceOp::kSum);  // rank 1 never joins
  EXPECT_FALSE(pending->is_completed());

  g1.abort("first reason");
  g0.abort("second reason");
  EXPECT_TRUE(pending->is_completed());
  const auto what = what_if<GroupChanged>(pending->exception());
  EXPECT_THAT(what, HasSubstr("first reason"));
  EXPECT_THAT(what, Not(HasSubstr("second reason")));
  for (const auto& w : {g0.allreduce(Buffer::of(p), ReduceOp::kSum), g1.barrier(),
                        g1.broadcast(Buffer::of(p), 0)}) {
    EXPECT_TRUE(w->is_completed());
    EXPECT_THAT(what_if<GroupChanged>(w->exception()), HasSubstr("first reason"));
  }
  EXPECT_EQ(c0->exception(), nullptr);
  for (float v : a0) EXPECT_EQ(v, 3.0f);
  for (float v : p) EXPECT_EQ(v, 1.0f);
}

}  // namespace
}  // namespace ddp::test
