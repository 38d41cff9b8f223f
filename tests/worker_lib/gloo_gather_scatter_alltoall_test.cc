// gather, scatter, all-to-all (even and uneven, zero counts included) and
// recv_any of the Gloo backend, checked against what each rank computes alone;
// ranks that disagree get errors naming the difference, never a hang; bad
// arguments are InvalidArgument. Ranks are threads over a MemoryStore.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <set>

#include "ddp/common/error.h"
#include "gloo/collective_check.h"
#include "test_util.h"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// The value rank `rank` puts at element i of what it sends to rank `to`
// (small enough for every dtype, uint8 and int8 included).
double value_from(int rank, int to, std::size_t i) {
  return static_cast<double>((rank * 17 + to * 5 + static_cast<int>(i % 7)) % 100);
}

// value_from, as 0 or 1 for bool.
double value_in(DType dtype, int rank, int to, std::size_t i) {
  const double v = value_from(rank, to, i);
  return dtype == DType::kBool ? static_cast<double>(static_cast<int>(v) % 2) : v;
}

TEST(GlooGatherScatter, EveryDtypeFromEveryRoot) {
  const int world = 3;
  const std::size_t n = 1001;
  auto groups = make_groups(world, std::make_shared<MemoryStore>());
  for (DType dtype : all_dtypes()) {
    for (int root = 0; root < world; ++root) {
      run_threads(world, [&](int r) {
        // Gather: only the root has an output; the others pass an empty buffer.
        TypedBuffer mine(dtype, n);
        for (std::size_t i = 0; i < n; ++i) mine.set(i, value_from(r, root, i));
        TypedBuffer gathered(dtype, r == root ? n * world : 0);
        ASSERT_TRUE(groups[r]->gather(gathered.view(), mine.view(), root)->wait());
        // Scatter back what the root gathered: only the root has an input.
        TypedBuffer back(dtype, n);
        ASSERT_TRUE(groups[r]->scatter(back.view(), gathered.view(), root)->wait());
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_EQ(back.get(i), value_from(r, root, i))
              << "scatter " << to_string(dtype) << " root " << root << " rank " << r;
        }
        if (r != root) return;
        for (int src = 0; src < world; ++src) {
          for (std::size_t i = 0; i < n; ++i) {
            ASSERT_EQ(gathered.get(src * n + i), value_from(src, root, i))
                << "gather " << to_string(dtype) << " root " << root << " from " << src;
          }
        }
      });
    }
  }
}

TEST(GlooGatherScatter, GroupOfOneRankAndZeroElements) {
  auto one = make_groups(1, std::make_shared<MemoryStore>());
  std::vector<float> in = {1, 2, 3};
  std::vector<float> out(3);
  ASSERT_TRUE(one[0]->gather(Buffer::of(out), Buffer::of(in), 0)->wait());
  EXPECT_EQ(out, in);
  std::vector<float> back(3);
  ASSERT_TRUE(one[0]->scatter(Buffer::of(back), Buffer::of(in), 0)->wait());
  EXPECT_EQ(back, in);
  auto groups = make_groups(2, std::make_shared<MemoryStore>());
  run_threads(2, [&](int r) {
    std::vector<float> none;
    ASSERT_TRUE(groups[r]->gather(Buffer::of(none), Buffer::of(none), 1)->wait());
    ASSERT_TRUE(groups[r]->scatter(Buffer::of(none), Buffer::of(none), 0)->wait());
  });
}

// Rank r sends counts[r][j] elements to rank j.
using CountMatrix = std::vector<std::vector<std::size_t>>;

void check_alltoall(const std::vector<std::shared_ptr<ProcessGroup>>& groups, DType dtype,
                    const CountMatrix& counts) {
  const int world = static_cast<int>(groups.size());
  run_threads(world, [&](int r) {
    std::vector<std::size_t> in_counts = counts[r];
    std::vector<std::size_t> out_counts;
    for (int j = 0; j < world; ++j) out_counts.push_back(counts[j][r]);
    TypedBuffer in(dtype, std::accumulate(in_counts.begin(), in_counts.end(), std::size_t{0}));
    TypedBuffer out(dtype, std::accumulate(out_counts.begin(), out_counts.end(), std::size_t{0}));
    std::size_t at = 0;
    for (int to = 0; to < world; ++to) {
      for (std::size_t i = 0; i < in_counts[to]; ++i) in.set(at++, value_in(dtype, r, to, i));
    }
    for (std::size_t i = 0; i < out.count(); ++i) out.set(i, 99);
    ASSERT_TRUE(groups[r]->alltoall(out.view(), in.view(), out_counts, in_counts)->wait());
    at = 0;
    for (int from = 0; from < world; ++from) {
      for (std::size_t i = 0; i < out_counts[from]; ++i) {
        ASSERT_EQ(out.get(at++), value_in(dtype, from, r, i))
            << to_string(dtype) << " rank " << r << " from " << from << " i " << i;
      }
    }
  });
}

TEST(GlooAlltoall, UnevenCountsWithZerosEveryDtype) {
  const int world = 3;
  auto groups = make_groups(world, std::make_shared<MemoryStore>());
  const CountMatrix uneven = {{2, 0, 5000}, {1, 3, 0}, {0, 700, 4}};
  const CountMatrix nothing_from_rank_1 = {{1, 0, 2}, {0, 0, 0}, {3, 0, 1}};
  const CountMatrix all_zero = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
  for (DType dtype : all_dtypes()) {
    check_alltoall(groups, dtype, uneven);
    check_alltoall(groups, dtype, nothing_from_rank_1);
  }
  check_alltoall(groups, DType::kBool, uneven);
  check_alltoall(groups, DType::kFloat32, all_zero);
}

TEST(GlooAlltoall, EvenSplitWhenNoCountsAreGiven) {
  const int world = 4;
  const std::size_t chunk = 250;
  auto groups = make_groups(world, std::make_shared<MemoryStore>());
  run_threads(world, [&](int r) {
    std::vector<std::int64_t> in(chunk * world);
    std::vector<std::int64_t> out(chunk * world, -1);
    for (int to = 0; to < world; ++to) {
      for (std::size_t i = 0; i < chunk; ++i) in[to * chunk + i] = r * 1000 + to * 10 + (i % 3);
    }
    ASSERT_TRUE(groups[r]->alltoall(Buffer::of(out), Buffer::of(in), {}, {})->wait());
    for (int from = 0; from < world; ++from) {
      for (std::size_t i = 0; i < chunk; ++i) {
        ASSERT_EQ(out[from * chunk + i], from * 1000 + r * 10 + static_cast<int>(i % 3));
      }
    }
  });
  auto one = make_groups(1, std::make_shared<MemoryStore>());
  std::vector<float> in = {4, 5}, out(2);
  ASSERT_TRUE(one[0]->alltoall(Buffer::of(out), Buffer::of(in), {}, {})->wait());
  EXPECT_EQ(out, in);
}

TEST(GlooAlltoall, PeersThatDisagreeOnCountsFailOnEveryRankAndTheGroupGoesOn) {
  const int world = 3;
  GlooOptions options;
  options.timeout = 20s;  // the error must come long before this
  auto groups = make_groups(world, std::make_shared<MemoryStore>(), options);
  std::vector<std::string> errors(world);
  const auto start = std::chrono::steady_clock::now();
  run_threads(world, [&](int r) {
    // Rank 0 sends 2 elements to rank 2, which expects 3 from it.
    std::vector<std::size_t> in_counts = {1, 1, r == 0 ? 2u : 1u};
    std::vector<std::size_t> out_counts = {r == 2 ? 3u : 1u, 1, 1};
    std::vector<float> in(std::accumulate(in_counts.begin(), in_counts.end(), std::size_t{0}));
    std::vector<float> out(std::accumulate(out_counts.begin(), out_counts.end(), std::size_t{0}));
    auto work = groups[r]->alltoall(Buffer::of(out), Buffer::of(in), out_counts, in_counts);
    try {
      work->wait();
    } catch (const InvalidArgument& e) {
      errors[r] = e.what();
    }
    std::vector<float> ok(5, 1.0f);
    ASSERT_TRUE(groups[r]->allreduce(Buffer::of(ok))->wait());
    EXPECT_EQ(ok[4], 3.0f);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  for (int r = 0; r < world; ++r) {
    EXPECT_THAT(errors[r], HasSubstr("ProcessGroupGloo::alltoall"));
    EXPECT_THAT(errors[r], HasSubstr("rank 0 sends 2 elements to rank 2, which expects 3"));
  }
}

TEST(GlooAlltoall, PeersThatDisagreeOnTheDtypeFailOnEveryRank) {
  const int world = 2;
  auto groups = make_groups(world, std::make_shared<MemoryStore>());
  std::vector<std::string> errors(world);
  run_threads(world, [&](int r) {
    TypedBuffer in(r == 0 ? DType::kFloat32 : DType::kInt32, 4);
    TypedBuffer out(in.dtype, 4);
    errors[r] = error_text(groups[r]->alltoall(out.view(), in.view(), {}, {}));
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_THAT(errors[r], HasSubstr("rank 0 exchanges float32 but rank 1 int32"));
  }
}

TEST(GlooCollectiveCheck, DisagreementsOnTheNewCollectivesAreErrorsOnEveryRank) {
  const int world = 3;
  GlooOptions options;
  options.timeout = 20s;
  options.debug_detail = true;
  auto groups = make_groups(world, std::make_shared<MemoryStore>(), options);
  std::vector<std::string> roots(world), counts(world), kinds(world);
  run_threads(world, [&](int r) {
    const int root = r == 1 ? 2 : 0;
    std::vector<float> in(4), out(r == root ? 12 : 0);
    roots[r] = error_text(groups[r]->gather(Buffer::of(out), Buffer::of(in), root));
    std::vector<float> part(r == 2 ? 5 : 4), whole(r == 0 ? part.size() * world : 0);
    counts[r] = error_text(groups[r]->scatter(Buffer::of(part), Buffer::of(whole), 0));
    // Rank 0 calls an all-to-all, rank 1 a gather to itself, rank 2 a gather to rank 0.
    std::vector<float> gathered(9), mine(3), theirs(3);
    kinds[r] =
        r == 0
            ? error_text(groups[r]->alltoall(Buffer::of(theirs), Buffer::of(mine), {}, {}))
            : error_text(groups[r]->gather(Buffer::of(gathered), Buffer::of(mine), r == 1 ? 1 : 0));
    // Every rank skipped each bad collective: the group goes on working.
    std::vector<std::int8_t> ok(3, 1);
    ASSERT_TRUE(groups[r]->allreduce(Buffer::of(ok))->wait());
    EXPECT_EQ(ok[2], 3);
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_THAT(roots[r], HasSubstr("ranks [0,2] called gather(seq=0, count=4, dtype=float32, "
                                    "root=0)"));
    EXPECT_THAT(roots[r], HasSubstr("ranks [1] called gather(seq=0, count=4, dtype=float32, "
                                    "root=2)"));
    EXPECT_THAT(counts[r], HasSubstr("ranks [0,1] called scatter(seq=1, count=4"));
    EXPECT_THAT(counts[r], HasSubstr("ranks [2] called scatter(seq=1, count=5"));
    EXPECT_THAT(kinds[r], HasSubstr("ranks [0] called alltoall(seq=2, dtype=float32)"));
    EXPECT_THAT(kinds[r],
                HasSubstr("ranks [1] called gather(seq=2, count=3, dtype=float32, root=1)"));
    EXPECT_THAT(kinds[r],
                HasSubstr("ranks [2] called gather(seq=2, count=3, dtype=float32, root=0)"));
  }
}

TEST(GlooAlltoall, DifferentInputCountsAreNoDisagreementForTheCollectiveCheck) {
  const int world = 2;
  GlooOptions options;
  options.debug_detail = true;
  auto groups = make_groups(world, std::make_shared<MemoryStore>(), options);
  check_alltoall(groups, DType::kInt32, {{1, 6}, {2, 0}});
}

TEST(GlooRecvAny, ReceivesFromEachOfTwoSendersAndNamesThem) {
  const int world = 3;
  auto groups = make_groups(world, std::make_shared<MemoryStore>());
  run_threads(world, [&](int r) {
    if (r != 0) {
      std::vector<std::int32_t> payload(100, r * 11);
      auto sent = groups[r]->send(Buffer::of(payload), 0, 7);
      ASSERT_TRUE(sent->wait());
      EXPECT_EQ(sent->source_rank(), -1);
      return;
    }
    std::vector<std::int32_t> first(100, -1), second(100, -1);
    auto w1 = groups[0]->recv_any(Buffer::of(first), 7);
    auto w2 = groups[0]->recv_any(Buffer::of(second), 7);
    ASSERT_TRUE(w1->wait());
    ASSERT_TRUE(w2->wait());
    const std::set<int> sources = {w1->source_rank(), w2->source_rank()};
    EXPECT_EQ(sources, (std::set<int>{1, 2}));
    for (auto v : first) ASSERT_EQ(v, w1->source_rank() * 11);
    for (auto v : second) ASSERT_EQ(v, w2->source_rank() * 11);
  });
}

TEST(GlooRecvAny, MatchesOnlyItsTagAndTimesOutNamingTheOperation) {
  GlooOptions options;
  options.timeout = 700ms;
  auto groups = make_groups(2, std::make_shared<MemoryStore>(), options);
  std::vector<float> payload(8, 5.0f), wrong_tag(8, 0.0f), right_tag(8, 0.0f);
  auto sent = groups[1]->send(Buffer::of(payload), 0, 3);
  auto other = groups[0]->recv_any(Buffer::of(wrong_tag), 4);
  auto mine = groups[0]->recv_any(Buffer::of(right_tag), 3);
  try {
    other->wait();
    ADD_FAILURE() << "a recv_any with tag 4 received the message sent with tag 3";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("recv_any"));
    EXPECT_THAT(e.what(), HasSubstr("from any rank (tag 4)"));
  }
  ASSERT_TRUE(mine->wait());
  ASSERT_TRUE(sent->wait());
  EXPECT_EQ(mine->source_rank(), 1);
  EXPECT_EQ(other->source_rank(), -1);
  EXPECT_EQ(right_tag[7], 5.0f);
}

TEST(GlooNewCollectives, RejectBadArguments) {
  auto groups = make_groups(2, std::make_shared<MemoryStore>());
  std::vector<float> three(3), five(5), six(6);
  std::vector<double> six_doubles(6);
  // gather: the root's output must be size x input, of the same dtype; a root in range.
  EXPECT_THROW(groups[0]->gather(Buffer::of(five), Buffer::of(three), 0), InvalidArgument);
  EXPECT_THROW(groups[0]->gather(Buffer::of(six_doubles), Buffer::of(three), 0), InvalidArgument);
  EXPECT_THROW(groups[0]->gather(Buffer::of(six), Buffer::of(three), 2), InvalidArgument);
  EXPECT_THROW(groups[0]->gather(Buffer::of(six), Buffer::of(three), -1), InvalidArgument);
  // scatter: the root's input must be size x output.
  EXPECT_THROW(groups[0]->scatter(Buffer::of(three), Buffer::of(five), 0), InvalidArgument);
  EXPECT_THROW(groups[0]->scatter(Buffer::of(three), Buffer::of(six), 5), InvalidArgument);
  // alltoall: counts per rank that add up to the buffers; an even split that divides.
  EXPECT_THROW(groups[0]->alltoall(Buffer::of(six), Buffer::of(six), {3, 3}, {2, 3}),
               InvalidArgument);
  EXPECT_THROW(groups[0]->alltoall(Buffer::of(six), Buffer::of(six), {6}, {6}), InvalidArgument);
  EXPECT_THROW(groups[0]->alltoall(Buffer::of(five), Buffer::of(five), {}, {}), InvalidArgument);
  EXPECT_THROW(groups[0]->alltoall(Buffer::of(six), Buffer::of(six), {2, 4}, {3, 3}),
               InvalidArgument);  // rank 0 sends itself 3 but expects 2
  EXPECT_THROW(groups[0]->alltoall(Buffer::of(six_doubles), Buffer::of(six), {}, {}),
               InvalidArgument);
  try {
    groups[0]->alltoall(Buffer::of(six), Buffer::of(six), {3, 3}, {1, 2, 3});
    ADD_FAILURE() << "three counts in a group of two were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("input counts has 3 entries"));
  }
  // recv_any: a tag >= 0, a CPU buffer, a group with another rank.
  EXPECT_THROW(groups[0]->recv_any(Buffer::of(three), -1), InvalidArgument);
  Buffer gpu = Buffer::of(three);
  gpu.device = Device::cuda(0);
  EXPECT_THROW(groups[0]->recv_any(gpu), InvalidArgument);
  EXPECT_THROW(groups[0]->gather(Buffer::of(six), gpu, 0), InvalidArgument);
  EXPECT_THROW(groups[0]->alltoall(Buffer::of(three), gpu, {}, {}), InvalidArgument);
  auto one = make_groups(1, std::make_shared<MemoryStore>());
  EXPECT_THROW(one[0]->recv_any(Buffer::of(three)), InvalidArgument);
  // Nothing was queued by the refused calls: the group still works.
  run_threads(2, [&](int r) {
    std::vector<float> ok(2, 1.0f);
    ASSERT_TRUE(groups[r]->allreduce(Buffer::of(ok))->wait());
    EXPECT_EQ(ok[1], 2.0f);
  });
}

TEST(AlltoallCounts, FindMismatchNamesRanksAndCounts) {
  using detail::AlltoallCounts;
  AlltoallCounts a{DType::kInt32, {1, 2}, {1, 4}};
  AlltoallCounts b{DType::kInt32, {4, 0}, {2, 0}};
  EXPECT_EQ(detail::find_alltoall_mismatch({a, b}), "");
  b.output = {3, 0};
  EXPECT_EQ(detail::find_alltoall_mismatch({a, b}),
            "ranks disagree on the all-to-all: rank 0 sends 2 elements to rank 1, which expects 3");
  b.dtype = DType::kInt8;
  EXPECT_THAT(detail::find_alltoall_mismatch({a, b}),
              HasSubstr("rank 0 exchanges int32 but rank 1 int8"));
  auto words = a.encode();
  auto back = AlltoallCounts::decode(words.data(), 2);
  EXPECT_EQ(back.dtype, a.dtype);
  EXPECT_EQ(back.input, a.input);
  EXPECT_EQ(back.output, a.output);
  words[0] = 200;
  EXPECT_THROW(AlltoallCounts::decode(words.data(), 2), ProtocolError);
}

}  // namespace
}  // namespace ddp::test
