// Failure behaviour of the Gloo backend: a rank that never arrives, ranks that
// disagree under the collective check (DDP_DEBUG=DETAIL), and the pure pieces behind the diagnostics.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>

#include "arrival_tracker.h"
#include "ddp/common/error.h"
#include "gloo/collective_check.h"
#include "test_util.h"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(GlooFailures, RankThatNeverArrivesGivesTimeoutErrorNamingIt) {
  const int world = 3;
  GlooOptions options;
  options.timeout = 1500ms;
  auto groups = make_groups(world, std::make_shared<MemoryStore>(), options);
  // One successful collective first, so the failing one has sequence number 1.
  run_threads(world, [&](int r) {
    std::vector<float> buf(10, 1.0f);
    groups[r]->allreduce(Buffer::of(buf))->wait();
  });
  std::vector<std::string> errors(world);
  run_threads(world, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(4s);  // stays connected but never calls the collective
      return;
    }
    std::vector<float> buf(100000, 1.0f);
    auto start = std::chrono::steady_clock::now();
    auto work = groups[r]->allreduce(Buffer::of(buf));
    try {
      work->wait();
      ADD_FAILURE() << "rank " << r << ": allreduce without rank 2 succeeded";
    } catch (const TimeoutError& e) {
      errors[r] = e.what();
      EXPECT_LT(std::chrono::steady_clock::now() - start, 8s);
    }
    // The group is unusable afterwards: later work fails at once, never hangs.
    std::vector<float> more(4, 1.0f);
    EXPECT_THROW(groups[r]->allreduce(Buffer::of(more))->wait(), BackendError);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(errors[r], HasSubstr("ProcessGroupGloo::allreduce"));
    EXPECT_THAT(errors[r], HasSubstr("seq 1"));
    EXPECT_THAT(errors[r], HasSubstr("ranks that did not arrive: [2]"));
  }
}

// The check exchanges the descriptors through the shared-memory segment when
// the group has one (every rank on one host), else through Gloo's TCP pairs.
class GlooDetailCheck : public ::testing::TestWithParam<bool> {};

TEST_P(GlooDetailCheck, ReportsSizeMismatchInsteadOfHanging) {
  const int world = 3;
  GlooOptions options;
  options.timeout = 10s;
  options.debug_detail = true;
  options.shared_memory = GetParam();
  auto groups = make_groups(world, std::make_shared<MemoryStore>(), options);
  std::vector<std::string> errors(world);
  run_threads(world, [&](int r) {
    std::vector<float> buf(r == 1 ? 20 : 10, 1.0f);
    errors[r] = error_text(groups[r]->allreduce(Buffer::of(buf)));
    // Every rank skipped the bad collective: the group goes on working.
    std::vector<float> ok(8, 2.0f);
    groups[r]->allreduce(Buffer::of(ok))->wait();
    for (float v : ok) EXPECT_EQ(v, 6.0f);
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_THAT(errors[r], HasSubstr("collective #0 (checked across the ranks)"));
    EXPECT_THAT(errors[r], HasSubstr("ranks [0,2] called allreduce(seq=0, count=10"));
    EXPECT_THAT(errors[r], HasSubstr("ranks [1] called allreduce(seq=0, count=20"));
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, GlooDetailCheck, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "shm" : "tcp"; });

TEST(GlooFailures, DetailCheckReportsDifferentOperations) {
  const int world = 2;
  GlooOptions options;
  options.timeout = 10s;
  options.debug_detail = true;
  auto groups = make_groups(world, std::make_shared<MemoryStore>(), options);
  std::vector<std::string> errors(world);
  run_threads(world, [&](int r) {
    std::vector<double> buf(16, 1.0);
    errors[r] = r == 0 ? error_text(groups[r]->broadcast(Buffer::of(buf), 0))
                       : error_text(groups[r]->allreduce(Buffer::of(buf), ReduceOp::kMax));
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_THAT(errors[r], HasSubstr("broadcast(seq=0, count=16, dtype=float64, root=0)"));
    EXPECT_THAT(errors[r], HasSubstr("allreduce(seq=0, count=16, dtype=float64, op=max)"));
  }
}

TEST(GlooFailures, DestroyingTheGroupCancelsQueuedWork) {
  GlooOptions options;
  options.timeout = 1s;
  auto groups = make_groups(2, std::make_shared<MemoryStore>(), options);
  std::vector<float> a(4), b(4);
  std::vector<std::int32_t> in(4);
  auto w1 = groups[0]->allreduce(Buffer::of(a));  // in flight: times out (rank 1 never joins)
  auto w2 = groups[0]->allreduce(Buffer::of(b));  // queued
  auto w3 = groups[0]->recv(Buffer::of(in), 1);   // pending receive
  std::this_thread::sleep_for(50ms);
  groups[0].reset();
  EXPECT_TRUE(w1->is_completed());
  EXPECT_TRUE(w2->is_completed());
  EXPECT_TRUE(w3->is_completed());
  EXPECT_NE(w1->exception(), nullptr);
  EXPECT_NE(w2->exception(), nullptr);
  EXPECT_THROW(w3->wait(), ShutdownError);
}

TEST(CollectiveDescriptor, RoundTripsAndDescribes) {
  detail::CollectiveDescriptor d{
      detail::CollectiveOp::kReduce, DType::kBFloat16, ReduceOp::kMin, 3, 42, 1234567};
  auto bytes = d.encode();
  EXPECT_EQ(detail::CollectiveDescriptor::decode(bytes.data()), d);
  EXPECT_EQ(d.describe(), "reduce(seq=42, count=1234567, dtype=bfloat16, op=min, root=3)");
  bytes[0] ^= 0xff;
  EXPECT_THROW(detail::CollectiveDescriptor::decode(bytes.data()), ProtocolError);
}

TEST(CollectiveDescriptor, FindMismatchGroupsRanks) {
  detail::CollectiveDescriptor a{
      detail::CollectiveOp::kAllreduce, DType::kFloat32, ReduceOp::kSum, -1, 7, 10};
  auto b = a;
  EXPECT_EQ(detail::find_mismatch({a, b, a}), "");
  b.dtype = DType::kFloat16;
  auto text = detail::find_mismatch({a, b, a, b});
  EXPECT_THAT(text,
              HasSubstr("ranks [0,2] called allreduce(seq=7, count=10, dtype=float32, op=sum)"));
  EXPECT_THAT(text,
              HasSubstr("ranks [1,3] called allreduce(seq=7, count=10, dtype=float16, op=sum)"));
}

TEST(ArrivalTracker, NamesRanksThatDidNotEnter) {
  auto store = std::make_shared<MemoryStore>();
  detail::ArrivalTracker t0(store, 0, 3), t1(store, 1, 3), t2(store, 2, 3);
  t0.entered(0);
  t1.entered(0);
  t2.entered(0);
  t0.entered(1);
  t2.entered(1);
  EXPECT_EQ(t0.missing(1, 500ms), std::vector<int>{1});
  EXPECT_EQ(t0.missing(0, 500ms), std::vector<int>{});
  EXPECT_EQ(t1.missing(5, 100ms), (std::vector<int>{0, 1, 2}));
}

}  // namespace
}  // namespace ddp::test
