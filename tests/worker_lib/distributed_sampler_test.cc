// DistributedSampler against torch.utils.data.DistributedSampler (torch 1.13 in
// /usr/bin/python3, run at test time), plus properties that hold without torch.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "ddp/common/error.h"
#include "ddp/worker/distributed_sampler.h"

namespace ddp {
namespace {

struct Case {
  std::size_t n;
  int replicas;
  int rank;
  bool shuffle;
  std::uint64_t seed;
  std::uint64_t epoch;
  bool drop_last;
};

bool torch_available() {
  if (!std::filesystem::exists("/usr/bin/python3")) return false;
  return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
}

// Runs the reference script on every case; one line of indices per case.
std::vector<std::string> torch_reference(const std::vector<Case>& cases) {
  auto dir =
      std::filesystem::temp_directory_path() / fmt::format("ddp_sampler_test_{}", ::getpid());
  std::filesystem::create_directories(dir);
  auto in_path = dir / "cases.txt";
  auto out_path = dir / "out.txt";
  {
    std::ofstream in(in_path);
    for (const auto& c : cases) {
      in << c.n << ' ' << c.replicas << ' ' << c.rank << ' ' << c.shuffle << ' ' << c.seed << ' '
         << c.epoch << ' ' << c.drop_last << '\n';
    }
  }
  auto command = fmt::format("/usr/bin/python3 {}/sampler_reference.py < {} > {}",
                             DDP_TEST_SOURCE_DIR, in_path.string(), out_path.string());
  int rc = std::system(command.c_str());
  std::vector<std::string> lines;
  std::ifstream out(out_path);
  for (std::string line; std::getline(out, line);) lines.push_back(line);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(rc, 0) << command;
  return lines;
}

std::string join(const std::vector<std::int64_t>& v) {
  if (v.empty()) return "-";
  std::string s;
  for (auto x : v) {
    if (!s.empty()) s += ' ';
    s += std::to_string(x);
  }
  return s;
}

TEST(DistributedSampler, MatchesPyTorch) {
  if (!torch_available()) GTEST_SKIP() << "torch is not importable from /usr/bin/python3";
  std::vector<Case> cases;
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> seed_epochs = {
      {0, 0}, {0, 1}, {42, 3}, {(1ull << 33) + 5, 2}};
  for (std::size_t n : {1, 2, 7, 10, 101, 1000, 4099}) {
    for (int replicas : {1, 2, 3, 4, 7}) {
      for (bool drop_last : {false, true}) {
        for (auto [seed, epoch] : seed_epochs) {
          for (int rank = 0; rank < replicas; ++rank) {
            cases.push_back({n, replicas, rank, true, seed, epoch, drop_last});
          }
        }
        cases.push_back({n, replicas, replicas - 1, false, 0, 0, drop_last});
      }
    }
  }
  cases.push_back({250000, 4, 3, true, 7, 11, false});
  auto expected = torch_reference(cases);
  ASSERT_EQ(expected.size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    DistributedSampler sampler(c.n, c.replicas, c.rank, c.shuffle, c.seed, c.drop_last);
    sampler.set_epoch(c.epoch);
    auto got = sampler.indices();
    ASSERT_EQ(got.size(), sampler.size());
    ASSERT_EQ(join(got), expected[i])
        << fmt::format("n={} replicas={} rank={} shuffle={} seed={} epoch={} drop_last={}", c.n,
                       c.replicas, c.rank, c.shuffle, c.seed, c.epoch, c.drop_last);
  }
}

TEST(DistributedSampler, RanksPartitionThePaddedPermutation) {
  const std::size_t n = 103;
  const int replicas = 4;
  std::multiset<std::int64_t> seen;
  for (int r = 0; r < replicas; ++r) {
    DistributedSampler s(n, replicas, r, true, 5);
    s.set_epoch(2);
    auto idx = s.indices();
    EXPECT_EQ(idx.size(), 26u);
    seen.insert(idx.begin(), idx.end());
  }
  EXPECT_EQ(seen.size(), 104u);  // 103 + 1 padded
  for (std::size_t i = 0; i < n; ++i) EXPECT_GE(seen.count(static_cast<std::int64_t>(i)), 1u);
}

TEST(DistributedSampler, DropLastAndEpochs) {
  DistributedSampler s(103, 4, 0, true, 0, /*drop_last=*/true);
  EXPECT_EQ(s.size(), 25u);
  EXPECT_EQ(s.total_size(), 100u);
  auto e0 = s.indices();
  s.set_epoch(1);
  EXPECT_NE(s.indices(), e0);
  s.set_epoch(0);
  EXPECT_EQ(s.indices(), e0);
  DistributedSampler tiny(2, 3, 2, true, 0, true);
  EXPECT_EQ(tiny.size(), 0u);
  EXPECT_TRUE(tiny.indices().empty());
}

TEST(DistributedSampler, TorchRandpermKnownPrefix) {
  // torch.randperm(10, generator=torch.Generator().manual_seed(0)) in torch 1.13.
  EXPECT_EQ(torch_randperm(10, 0), (std::vector<std::int64_t>{4, 1, 7, 5, 3, 9, 0, 8, 6, 2}));
}

// The epoch's order as the sampler sees it (before padding).
std::vector<std::int64_t> epoch_order(std::size_t n, bool shuffle, std::uint64_t seed,
                                      std::uint64_t epoch) {
  if (shuffle) return torch_randperm(static_cast<std::int64_t>(n), seed + epoch);
  std::vector<std::int64_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::int64_t>(i);
  return order;
}

TEST(DistributedSampler, PositionZeroIsTheTorchSplit) {
  for (bool drop_last : {false, true}) {
    for (int r = 0; r < 3; ++r) {
      DistributedSampler plain(101, 3, r, true, 9, drop_last);
      plain.set_epoch(4);
      DistributedSampler moved = plain;
      moved.set_position(17);
      moved.set_position(0);
      EXPECT_EQ(moved.indices(), plain.indices());
      EXPECT_EQ(moved.size(), plain.size());
      EXPECT_EQ(moved.total_size(), plain.total_size());
    }
  }
}

// A run of W ranks takes B samples per rank for S steps, then goes on with W'
// ranks from the global position S*B*W. Together with the consumed prefix, the
// new ranks' indices cover the epoch's order exactly once, plus the documented
// padding (the remainder's beginning) or minus the documented cut (its tail).
TEST(DistributedSampler, ResizedRunReadsEveryRemainingSampleOnce) {
  struct Resize {
    int from, to;
  };
  for (auto [from, to] : {Resize{3, 2}, Resize{2, 3}, Resize{3, 4}, Resize{4, 1}}) {
    for (bool shuffle : {false, true}) {
      for (bool drop_last : {false, true}) {
        for (std::size_t n : {std::size_t{100}, std::size_t{103}, std::size_t{7}}) {
          for (std::size_t batch : {std::size_t{1}, std::size_t{4}}) {
            const std::uint64_t seed = 11, epoch = 3;
            const std::string what = fmt::format("W={} -> W'={} shuffle={} drop_last={} n={} B={}",
                                                 from, to, shuffle, drop_last, n, batch);
            const auto order = epoch_order(n, shuffle, seed, epoch);
            // The old world's steps that read no padding.
            DistributedSampler probe(n, from, 0, shuffle, seed, drop_last);
            const std::size_t steps = std::min(n / (batch * from), probe.size() / batch);
            for (std::size_t s = 0; s <= steps; s += std::max<std::size_t>(1, steps / 3)) {
              std::vector<std::int64_t> consumed;
              for (int r = 0; r < from; ++r) {
                DistributedSampler old(n, from, r, shuffle, seed, drop_last);
                old.set_epoch(epoch);
                auto idx = old.indices();
                ASSERT_GE(idx.size(), s * batch) << what;
                consumed.insert(consumed.end(), idx.begin(),
                                idx.begin() + static_cast<std::ptrdiff_t>(s * batch));
              }
              const std::size_t c = s * batch * static_cast<std::size_t>(from);
              ASSERT_EQ(consumed.size(), c) << what;
              // The consumed samples are the order's first c entries.
              std::multiset<std::int64_t> prefix(order.begin(),
                                                 order.begin() + static_cast<std::ptrdiff_t>(c));
              ASSERT_EQ(std::multiset<std::int64_t>(consumed.begin(), consumed.end()), prefix)
                  << what << " s=" << s;

              const std::size_t remaining = n - c;
              std::vector<std::int64_t> fresh;
              std::size_t per_rank = 0;
              for (int r = 0; r < to; ++r) {
                DistributedSampler now(n, to, r, shuffle, seed, drop_last);
                now.set_epoch(epoch);
                now.set_position(c);
                EXPECT_EQ(now.position(), c);
                auto idx = now.indices();
                ASSERT_EQ(idx.size(), now.size()) << what;
                EXPECT_EQ(now.total_size(), now.size() * static_cast<std::size_t>(to));
                if (r == 0) per_rank = idx.size();
                ASSERT_EQ(idx.size(), per_rank) << what << " rank " << r;
                fresh.insert(fresh.end(), idx.begin(), idx.end());
              }
              const std::size_t total = per_rank * static_cast<std::size_t>(to);
              std::multiset<std::int64_t> expected_all(consumed.begin(), consumed.end());
              if (drop_last) {
                // torch's cut of a data set of `remaining`: the largest multiple of W'.
                EXPECT_EQ(total, remaining - remaining % static_cast<std::size_t>(to)) << what;
                expected_all.insert(order.begin() + static_cast<std::ptrdiff_t>(c),
                                    order.begin() + static_cast<std::ptrdiff_t>(c + total));
              } else {
                const std::size_t to_n = static_cast<std::size_t>(to);
                EXPECT_EQ(total, (remaining + to_n - 1) / to_n * to_n) << what;
                expected_all.insert(order.begin() + static_cast<std::ptrdiff_t>(c), order.end());
                for (std::size_t k = 0; k < total - remaining; ++k) {
                  expected_all.insert(order[c + k % remaining]);  // the remainder's beginning
                }
              }
              std::multiset<std::int64_t> got_all(consumed.begin(), consumed.end());
              got_all.insert(fresh.begin(), fresh.end());
              EXPECT_EQ(got_all, expected_all) << what << " s=" << s;
              if (total == remaining) {
                // No padding and no cut: every sample of the epoch exactly once.
                std::multiset<std::int64_t> once(order.begin(), order.end());
                EXPECT_EQ(got_all, once) << what << " s=" << s;
              }
              // Rank r' takes every W'-th entry of the remainder from r'.
              for (int r = 0; r < to; ++r) {
                DistributedSampler now(n, to, r, shuffle, seed, drop_last);
                now.set_epoch(epoch);
                now.set_position(c);
                auto idx = now.indices();
                for (std::size_t k = 0; k < idx.size(); ++k) {
                  const std::size_t at =
                      static_cast<std::size_t>(r) + k * static_cast<std::size_t>(to);
                  ASSERT_EQ(idx[k], order[c + at % std::max<std::size_t>(remaining, 1)]) << what;
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(DistributedSampler, SetEpochResetsThePosition) {
  DistributedSampler s(50, 2, 1, true, 3);
  s.set_epoch(1);
  s.set_position(20);
  EXPECT_EQ(s.size(), 15u);
  EXPECT_EQ(s.total_size(), 30u);
  s.set_epoch(2);
  EXPECT_EQ(s.position(), 0u);
  EXPECT_EQ(s.size(), 25u);
  DistributedSampler fresh(50, 2, 1, true, 3);
  fresh.set_epoch(2);
  EXPECT_EQ(s.indices(), fresh.indices());
}

TEST(DistributedSampler, PositionAtTheEndAndBeyond) {
  DistributedSampler s(10, 3, 2, false, 0, false);
  s.set_position(10);
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.total_size(), 0u);
  EXPECT_TRUE(s.indices().empty());
  EXPECT_THROW(s.set_position(11), InvalidArgument);
  EXPECT_EQ(s.position(), 10u);
  // One sample left for three ranks: padded to three copies, or cut to none.
  s.set_position(9);
  EXPECT_EQ(s.indices(), (std::vector<std::int64_t>{9}));
  DistributedSampler cut(10, 3, 0, false, 0, true);
  cut.set_position(9);
  EXPECT_EQ(cut.size(), 0u);
  EXPECT_TRUE(cut.indices().empty());
}

TEST(DistributedSampler, RejectsBadArguments) {
  EXPECT_THROW(DistributedSampler(10, 0, 0), InvalidArgument);
  EXPECT_THROW(DistributedSampler(10, 2, 2), InvalidArgument);
  EXPECT_THROW(DistributedSampler(10, 2, -1), InvalidArgument);
}

}  // namespace
}  // namespace ddp
