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

TEST(DistributedSampler, RejectsBadArguments) {
  EXPECT_THROW(DistributedSampler(10, 0, 0), InvalidArgument);
  EXPECT_THROW(DistributedSampler(10, 2, 2), InvalidArgument);
  EXPECT_THROW(DistributedSampler(10, 2, -1), InvalidArgument);
}

}  // namespace
}  // namespace ddp
