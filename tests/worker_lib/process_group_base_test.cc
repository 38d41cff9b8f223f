// What the backends' process groups share (worker_lib/src/process_group_base.h):
// the constructor's checks, the abort signal and its errors, the tracking
// started once connected, and the Works failed after an abort.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "ddp/common/error.h"
#include "ddp/store/memory_store.h"
#include "process_group_base.h"

namespace ddp::detail {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(GroupAbortTest, TheFirstReasonStays) {
  GroupAbort abort("ProcessGroupTest", "group 'g' rank 1/3");
  EXPECT_FALSE(abort.is_set());
  EXPECT_TRUE(abort.set("node 2 was lost"));
  EXPECT_TRUE(abort.is_set());
  EXPECT_FALSE(abort.set("a later reason"));
  EXPECT_EQ(abort.reason(), "node 2 was lost");
}

TEST(GroupAbortTest, ErrorIsGroupChangedNamingTheOperationAndReason) {
  GroupAbort abort("ProcessGroupTest", "group 'g' rank 1/3");
  abort.set("node 2 was lost");
  const auto error = abort.error("allreduce", 7);
  EXPECT_THROW(std::rethrow_exception(error), GroupChanged);
  const std::string what = message_of(error);
  EXPECT_THAT(what, HasSubstr("ProcessGroupTest::allreduce"));
  EXPECT_THAT(what,
              HasSubstr("group 'g' rank 1/3: allreduce #7 failed: the group was aborted: node 2 "
                        "was lost"));
}

TEST(CheckGroupArgumentsTest, RefusesEachBadArgument) {
  MemoryStore store;
  EXPECT_NO_THROW(check_group_arguments("PG", &store, 0, 1, 1ms));
  EXPECT_NO_THROW(check_group_arguments("PG", &store, 2, 3, 1ms));
  EXPECT_THROW(check_group_arguments("PG", nullptr, 0, 1, 1ms), InvalidArgument);
  EXPECT_THROW(check_group_arguments("PG", &store, 0, 0, 1ms), InvalidArgument);
  EXPECT_THROW(check_group_arguments("PG", &store, -1, 2, 1ms), InvalidArgument);
  EXPECT_THROW(check_group_arguments("PG", &store, 2, 2, 1ms), InvalidArgument);
  EXPECT_THROW(check_group_arguments("PG", &store, 0, 2, 0ms), InvalidArgument);
  try {
    check_group_arguments("PG", &store, 3, 2, 1ms);
    FAIL() << "a rank outside the group was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 3 is outside [0, 2)"));
  }
}

struct TestOptions {
  std::chrono::milliseconds timeout = 1s;
  std::string name = "test";
};

// The smallest backend: no operation, only what the base gives.
class TestGroup final : public ProcessGroupBase<TestOptions> {
 public:
  TestGroup(std::shared_ptr<Store> store, int rank, int size, TestOptions options)
      : ProcessGroupBase("ProcessGroupTest", std::move(store), rank, size, std::move(options)) {}

  std::string backend_name() const override { return "test"; }
  WorkPtr allreduce(Buffer, ReduceOp) override { return nullptr; }
  WorkPtr broadcast(Buffer, int) override { return nullptr; }
  WorkPtr allgather(Buffer, Buffer) override { return nullptr; }
  WorkPtr reduce_scatter(Buffer, Buffer, ReduceOp) override { return nullptr; }
  WorkPtr reduce(Buffer, int, ReduceOp) override { return nullptr; }
  WorkPtr barrier() override { return nullptr; }
  WorkPtr gather(Buffer, Buffer, int) override { return nullptr; }
  WorkPtr scatter(Buffer, Buffer, int) override { return nullptr; }
  WorkPtr alltoall(Buffer, Buffer, std::vector<std::size_t>, std::vector<std::size_t>) override {
    return nullptr;
  }
  WorkPtr send(Buffer, int, int) override { return nullptr; }
  WorkPtr recv(Buffer, int, int) override { return nullptr; }
  WorkPtr recv_any(Buffer, int) override { return nullptr; }
  void abort(const std::string& reason) override { abort_->set(reason); }

  using ProcessGroupBase::abort_;
  using ProcessGroupBase::arrivals_;
  using ProcessGroupBase::failed_work;
  using ProcessGroupBase::start_tracking;
};

TEST(ProcessGroupBaseTest, TheConstructorChecksItsArguments) {
  auto store = std::make_shared<MemoryStore>();
  EXPECT_THROW(TestGroup(nullptr, 0, 1, {}), InvalidArgument);
  EXPECT_THROW(TestGroup(store, 1, 1, {}), InvalidArgument);
  TestOptions no_timeout;
  no_timeout.timeout = 0ms;
  EXPECT_THROW(TestGroup(store, 0, 1, no_timeout), InvalidArgument);
  TestGroup group(store, 1, 2, {});
  EXPECT_EQ(group.rank(), 1);
  EXPECT_EQ(group.size(), 2);
}

TEST(ProcessGroupBaseTest, TrackingStartsOnlyWhenAsked) {
  auto store = std::make_shared<MemoryStore>();
  TestGroup group(store, 0, 2, {});
  EXPECT_EQ(group.arrivals_, nullptr);
  group.start_tracking();
  ASSERT_NE(group.arrivals_, nullptr);
  group.arrivals_->entered(0);
  // Rank 0 publishes its arrival; rank 1 never entered.
  EXPECT_EQ(group.arrivals_->missing(0, 50ms), std::vector<int>{1});
}

TEST(ProcessGroupBaseTest, WorkIssuedAfterTheAbortFailsAtOnceWithItsReason) {
  TestOptions options;
  options.name = "grads";
  TestGroup group(std::make_shared<MemoryStore>(), 0, 2, options);
  group.abort("the round ended");
  auto work = group.failed_work(4, "broadcast");
  EXPECT_TRUE(work->is_completed());
  EXPECT_EQ(work->sequence_number(), 4u);
  EXPECT_THROW(work->wait(), GroupChanged);
  EXPECT_THAT(message_of(work->exception()),
              HasSubstr("group 'grads' rank 0/2: broadcast #4 failed: the group was aborted: the "
                        "round ended"));
}

TEST(CollectiveArgumentChecks, RootsChunksAndAlltoallCounts) {
  EXPECT_NO_THROW(check_root("op", 2, 3));
  EXPECT_THROW(check_root("op", 3, 3), InvalidArgument);
  EXPECT_THROW(check_root("op", -1, 3), InvalidArgument);
  std::vector<float> six(6), two(2);
  std::vector<double> six_doubles(6);
  EXPECT_NO_THROW(check_chunks("op", Buffer::of(six), Buffer::of(two), "output", "input", 3));
  EXPECT_THROW(check_chunks("op", Buffer::of(six), Buffer::of(two), "output", "input", 2),
               InvalidArgument);
  try {
    check_chunks("ProcessGroupTest::gather", Buffer::of(six_doubles), Buffer::of(two), "output",
                 "input", 3);
    ADD_FAILURE() << "float64 chunks of float32 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("ProcessGroupTest::gather"));
    EXPECT_THAT(e.what(), HasSubstr("output dtype float64 differs from input dtype float32"));
  }
  // Even splits when no counts are given; counts as given otherwise.
  auto even = split_alltoall("op", Buffer::of(six), Buffer::of(six), {}, {}, 1, 3);
  EXPECT_EQ(even.input, (std::vector<std::uint64_t>{2, 2, 2}));
  EXPECT_EQ(even.output, (std::vector<std::uint64_t>{2, 2, 2}));
  auto uneven = split_alltoall("op", Buffer::of(two), Buffer::of(six), {1, 0, 1}, {5, 0, 1}, 1, 3);
  EXPECT_EQ(uneven.input, (std::vector<std::uint64_t>{5, 0, 1}));
  EXPECT_EQ(uneven.output, (std::vector<std::uint64_t>{1, 0, 1}));
  EXPECT_THROW(split_alltoall("op", Buffer::of(two), Buffer::of(two), {}, {}, 0, 3),
               InvalidArgument);  // 2 elements do not split among 3 ranks
  EXPECT_THROW(split_alltoall("op", Buffer::of(six), Buffer::of(six), {6}, {6}, 0, 3),
               InvalidArgument);  // one count for three ranks
  EXPECT_THROW(split_alltoall("op", Buffer::of(six), Buffer::of(six), {2, 2, 2}, {2, 2, 1}, 0, 3),
               InvalidArgument);  // the input counts add up to 5, not 6
  EXPECT_THROW(split_alltoall("op", Buffer::of(six), Buffer::of(six), {1, 2, 3}, {3, 2, 1}, 0, 3),
               InvalidArgument);  // rank 0 sends itself 3 but expects 1
  EXPECT_THROW(split_alltoall("op", Buffer::of(six_doubles), Buffer::of(six), {}, {}, 0, 3),
               InvalidArgument);
}

}  // namespace
}  // namespace ddp::detail
