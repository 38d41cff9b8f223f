// The bitwise reductions (BAND, BOR, BXOR) on the integer dtypes and bool, and
// torch's semantics of the other reductions on bool, through every all-reduce
// path of the Gloo backend and through reduce and reduce_scatter; checked
// against results each rank computes alone. Ranks are threads over a MemoryStore.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>

#include <fmt/format.h>

#include "ddp/common/error.h"
#include "reduce_functions.h"
#include "test_util.h"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

const std::vector<DType>& bitwise_dtypes() {
  static const std::vector<DType> kAll = {DType::kInt32, DType::kInt64, DType::kUInt8, DType::kInt8,
                                          DType::kBool};
  return kAll;
}
const std::vector<ReduceOp>& bitwise_ops() {
  static const std::vector<ReduceOp> kAll = {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};
  return kAll;
}
// The reductions each (dtype, op) case runs: the bitwise ones everywhere, and
// on bool also sum, product, min and max (torch's logical meanings).
std::vector<ReduceOp> ops_for(DType dtype) {
  auto ops = bitwise_ops();
  if (dtype == DType::kBool) {
    ops.insert(ops.end(), {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax});
  }
  return ops;
}

// Rank `rank`'s element i: bit patterns that differ among ranks (with the sign
// bit set in some signed values), 0/1 for bool.
std::int64_t input_bits(DType dtype, int rank, std::size_t i) {
  const auto k = static_cast<std::int64_t>((static_cast<std::size_t>(rank) * 5 + i * 3) % 13);
  if (dtype == DType::kBool) return (k % 3 == 0) ? 1 : (k % 2);
  if (dtype == DType::kUInt8) return (k * 19 + 3) % 256;
  return (k * 19 + 3) % 128 - (k % 2 ? 64 : 0);  // fits int8, negative for odd k
}

// What the reduction of every rank's element i is, computed here alone. On
// bool (0/1) sum is or, product and, min and, max or.
std::int64_t expected_bits(DType dtype, ReduceOp op, int world, std::size_t i) {
  if (dtype == DType::kBool) {
    if (op == ReduceOp::kSum || op == ReduceOp::kMax) op = ReduceOp::kBor;
    if (op == ReduceOp::kProduct || op == ReduceOp::kMin) op = ReduceOp::kBand;
  }
  auto acc = static_cast<double>(input_bits(dtype, 0, i));
  for (int r = 1; r < world; ++r) {
    acc = combine(op, acc, static_cast<double>(input_bits(dtype, r, i)));
  }
  return static_cast<std::int64_t>(acc);
}

void fill(TypedBuffer& buf, int rank, std::size_t first = 0) {
  for (std::size_t i = 0; i < buf.count(); ++i) {
    buf.set(i, static_cast<double>(input_bits(buf.dtype, rank, first + i)));
  }
}

struct PathCase {
  AllreduceAlgorithm algorithm;
  int world;
};

class BitwiseAllreduceTest : public ::testing::TestWithParam<PathCase> {};

TEST_P(BitwiseAllreduceTest, EveryIntegerDtypeAndBoolMatchesTheRanksOwnResult) {
  const AllreduceAlgorithm algorithm = GetParam().algorithm;
  const int world = GetParam().world;
  GlooOptions options;
  options.timeout = 20s;
  options.allreduce_algorithm = algorithm;
  options.max_segment_bytes = 4096;
  options.shm_slot_bytes = 4096;  // several shared-memory steps for the larger counts
  auto groups = make_groups(world, std::make_shared<MemoryStore>(), options);
  for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{9001}}) {
    for (DType dtype : bitwise_dtypes()) {
      for (ReduceOp op : ops_for(dtype)) {
        run_threads(world, [&](int r) {
          TypedBuffer buf(dtype, count);
          fill(buf, r);
          ASSERT_TRUE(groups[r]->allreduce(buf.view(), op)->wait());
          for (std::size_t i = 0; i < count; ++i) {
            ASSERT_EQ(buf.get(i), static_cast<double>(expected_bits(dtype, op, world, i)))
                << "rank " << r << " algorithm " << to_string(algorithm) << " dtype "
                << to_string(dtype) << " op " << to_string(op) << " count " << count << " i " << i;
          }
        });
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, BitwiseAllreduceTest,
                         ::testing::Values(PathCase{AllreduceAlgorithm::kSharedMemory, 3},
                                           PathCase{AllreduceAlgorithm::kRing, 3},
                                           PathCase{AllreduceAlgorithm::kDirect, 3},
                                           PathCase{AllreduceAlgorithm::kBcube, 4},
                                           PathCase{AllreduceAlgorithm::kAuto, 1}),
                         [](const auto& info) {
                           return fmt::format("{}_world{}", to_string(info.param.algorithm),
                                              info.param.world);
                         });

TEST(GlooBitwise, ReduceAndReduceScatterTakeTheBitwiseOpsAndBool) {
  const int world = 3;
  const int root = 2;
  const std::size_t chunk = 333;
  auto groups = make_groups(world, std::make_shared<MemoryStore>());
  for (DType dtype : bitwise_dtypes()) {
    for (ReduceOp op : ops_for(dtype)) {
      run_threads(world, [&](int r) {
        TypedBuffer to_root(dtype, chunk);
        fill(to_root, r);
        ASSERT_TRUE(groups[r]->reduce(to_root.view(), root, op)->wait());
        if (r == root) {
          for (std::size_t i = 0; i < chunk; ++i) {
            ASSERT_EQ(to_root.get(i), static_cast<double>(expected_bits(dtype, op, world, i)))
                << "reduce " << to_string(dtype) << " " << to_string(op);
          }
        }
        TypedBuffer in(dtype, chunk * world);
        TypedBuffer out(dtype, chunk);
        fill(in, r);
        ASSERT_TRUE(groups[r]->reduce_scatter(out.view(), in.view(), op)->wait());
        for (std::size_t i = 0; i < chunk; ++i) {
          ASSERT_EQ(out.get(i), static_cast<double>(expected_bits(dtype, op, world, r * chunk + i)))
              << "reduce_scatter " << to_string(dtype) << " " << to_string(op) << " rank " << r;
        }
      });
    }
  }
}

TEST(GlooBitwise, BitwiseOpsOnFloatsAndBoolAverageAreRefusedBeforeAnythingIsSent) {
  // One rank alone: a call that sent anything would wait for rank 1 and hang.
  auto groups = make_groups(2, std::make_shared<MemoryStore>());
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (ReduceOp op : bitwise_ops()) {
      TypedBuffer buf(dtype, 4);
      TypedBuffer whole(dtype, 8);
      try {
        groups[0]->allreduce(buf.view(), op);
        ADD_FAILURE() << to_string(op) << " on " << to_string(dtype) << " was accepted";
      } catch (const InvalidArgument& e) {
        EXPECT_THAT(e.what(), HasSubstr(to_string(op)));
        EXPECT_THAT(e.what(), HasSubstr(to_string(dtype)));
      }
      EXPECT_THROW(groups[0]->reduce(buf.view(), 0, op), InvalidArgument);
      EXPECT_THROW(groups[0]->reduce_scatter(buf.view(), whole.view(), op), InvalidArgument);
    }
  }
  TypedBuffer flags(DType::kBool, 4);
  try {
    groups[0]->allreduce(flags.view(), ReduceOp::kAvg);
    ADD_FAILURE() << "avg on bool was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("avg"));
    EXPECT_THAT(e.what(), HasSubstr("bool"));
  }
  // Nothing was queued: the group still runs a collective of both ranks.
  run_threads(2, [&](int r) {
    std::vector<std::int8_t> v = {static_cast<std::int8_t>(r == 0 ? 0x0f : 0x3c)};
    ASSERT_TRUE(groups[r]->allreduce(Buffer::of(v.data(), v.size()), ReduceOp::kBxor)->wait());
    EXPECT_EQ(v[0], 0x33);
  });
}

TEST(GlooBitwise, Int8SumAndProductWrapLikePyTorch) {
  auto groups = make_groups(2, std::make_shared<MemoryStore>());
  run_threads(2, [&](int r) {
    std::vector<std::int8_t> sum = {100, -100};
    std::vector<std::int8_t> prod = {16, -3};
    ASSERT_TRUE(groups[r]->allreduce(Buffer::of(sum.data(), sum.size()))->wait());
    ASSERT_TRUE(
        groups[r]->allreduce(Buffer::of(prod.data(), prod.size()), ReduceOp::kProduct)->wait());
    EXPECT_EQ(sum[0], static_cast<std::int8_t>(200 - 256));
    EXPECT_EQ(sum[1], static_cast<std::int8_t>(-200 + 256));
    EXPECT_EQ(prod[0], static_cast<std::int8_t>(0));  // 256 wraps to 0
    EXPECT_EQ(prod[1], 9);
  });
}

TEST(ReduceFunctions, NameTheOpAndDtypeTheyRefuse) {
  EXPECT_THROW(detail::reduce_function(DType::kFloat32, ReduceOp::kBand), InvalidArgument);
  EXPECT_THROW(detail::reduce_function(DType::kBFloat16, ReduceOp::kBxor), InvalidArgument);
  EXPECT_THROW(detail::reduce_function(DType::kBool, ReduceOp::kAvg), InvalidArgument);
  for (DType dtype : bitwise_dtypes()) {
    for (ReduceOp op : ops_for(dtype)) {
      EXPECT_NE(detail::reduce_function(dtype, op), nullptr);
    }
  }
  EXPECT_STREQ(to_string(DType::kInt8), "int8");
  EXPECT_STREQ(to_string(DType::kBool), "bool");
  EXPECT_EQ(element_size(DType::kInt8), 1u);
  EXPECT_EQ(element_size(DType::kBool), 1u);
  EXPECT_STREQ(to_string(ReduceOp::kBand), "band");
  EXPECT_STREQ(to_string(ReduceOp::kBor), "bor");
  EXPECT_STREQ(to_string(ReduceOp::kBxor), "bxor");
  bool flags[2] = {true, false};
  std::int8_t small[2] = {-1, 1};
  EXPECT_EQ(Buffer::of(flags, 2).dtype, DType::kBool);
  EXPECT_EQ(Buffer::of(small, 2).dtype, DType::kInt8);
}

}  // namespace
}  // namespace ddp::test
