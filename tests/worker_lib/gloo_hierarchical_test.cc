// The Gloo group's hierarchical all-reduce: ranks are threads, and their hosts
// are faked with GlooOptions::host_id (the seam: ranks with the same id share a
// host). Results are compared with the flat ring's on the same inputs: integers
// bit for bit, floats within a tolerance; and the algorithm chosen is checked
// through last_allreduce_algorithm().
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>

#include <fmt/format.h>

#include "ddp/common/error.h"
#include "test_util.h"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;

// One group per rank, rank r on host hosts[r], over a fresh store.
std::vector<std::shared_ptr<ProcessGroup>> make_on_hosts(const std::vector<std::string>& hosts,
                                                         GlooOptions options = {}) {
  auto store = std::make_shared<MemoryStore>();
  options.hostname = "127.0.0.1";
  const int n = static_cast<int>(hosts.size());
  std::vector<std::shared_ptr<ProcessGroup>> groups(static_cast<std::size_t>(n));
  run_threads(n, [&](int r) {
    GlooOptions mine = options;
    mine.host_id = hosts[static_cast<std::size_t>(r)];
    groups[static_cast<std::size_t>(r)] = make_gloo_process_group(store, r, n, mine);
  });
  return groups;
}

// The algorithm each rank ran for one all-reduce of `count` int32 elements.
std::vector<AllreduceAlgorithm> algorithms_of(std::vector<std::shared_ptr<ProcessGroup>>& groups,
                                              std::size_t count = 1024) {
  const int n = static_cast<int>(groups.size());
  std::vector<AllreduceAlgorithm> out(static_cast<std::size_t>(n));
  run_threads(n, [&](int r) {
    std::vector<std::int32_t> data(count, r);
    auto& group = *groups[static_cast<std::size_t>(r)];
    group.allreduce(Buffer::of(data))->wait();
    EXPECT_EQ(data.empty() ? 0 : data[0], n * (n - 1) / 2)
        << "rank " << r << " last " << data.back();
    out[static_cast<std::size_t>(r)] = last_allreduce_algorithm(group);
  });
  return out;
}

std::vector<AllreduceAlgorithm> all(AllreduceAlgorithm a, std::size_t n) {
  return std::vector<AllreduceAlgorithm>(n, a);
}

TEST(GlooHierarchical, ChosenWhenRanksShareSomeOfSeveralHosts) {
  auto two_by_two = make_on_hosts({"a", "a", "b", "b"});
  EXPECT_EQ(algorithms_of(two_by_two), all(AllreduceAlgorithm::kHierarchical, 4));
  // Ranks of a host need not be adjacent, nor hosts equal in size.
  auto uneven = make_on_hosts({"a", "b", "a", "c", "c", "c"});
  EXPECT_EQ(algorithms_of(uneven), all(AllreduceAlgorithm::kHierarchical, 6));
  auto lone = make_on_hosts({"a", "b", "b"});
  EXPECT_EQ(algorithms_of(lone), all(AllreduceAlgorithm::kHierarchical, 3));
}

TEST(GlooHierarchical, FlatWithOneRankPerHost) {
  auto groups = make_on_hosts({"a", "b", "c", "d"});
  EXPECT_EQ(algorithms_of(groups, 16), all(AllreduceAlgorithm::kDirect, 4));
  EXPECT_EQ(algorithms_of(groups, 1 << 20), all(AllreduceAlgorithm::kRing, 4));
}

TEST(GlooHierarchical, SharedMemoryOnlyWhenEveryRankIsOnOneHost) {
  auto groups = make_on_hosts({"a", "a", "a"});
  EXPECT_EQ(algorithms_of(groups), all(AllreduceAlgorithm::kSharedMemory, 3));
  EXPECT_TRUE(groups[0]->broadcast_is_fast());
}

TEST(GlooHierarchical, FlatWhenTurnedOffByOptionOrEnvironmentOnAnyRank) {
  GlooOptions off;
  off.hierarchical = false;
  auto by_option = make_on_hosts({"a", "a", "b", "b"}, off);
  EXPECT_EQ(algorithms_of(by_option, 1 << 20), all(AllreduceAlgorithm::kRing, 4));
  EXPECT_FALSE(by_option[0]->broadcast_is_fast());  // no group-wide segment across hosts

  ::setenv("DDP_HIERARCHICAL_ALLREDUCE", "0", 1);
  auto by_env = make_on_hosts({"a", "a", "b", "b"});
  ::unsetenv("DDP_HIERARCHICAL_ALLREDUCE");
  EXPECT_EQ(algorithms_of(by_env, 16), all(AllreduceAlgorithm::kDirect, 4));

  // One rank that turns it off turns it off for all (none waits for the others).
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::shared_ptr<ProcessGroup>> mixed(4);
  run_threads(4, [&](int r) {
    GlooOptions options;
    options.hostname = "127.0.0.1";
    options.host_id = r < 2 ? "a" : "b";
    if (r == 3) options.hierarchical = false;
    mixed[static_cast<std::size_t>(r)] = make_gloo_process_group(store, r, 4, options);
  });
  EXPECT_EQ(algorithms_of(mixed, 16), all(AllreduceAlgorithm::kDirect, 4));

  GlooOptions no_shm;
  no_shm.shared_memory = false;
  auto without_shm = make_on_hosts({"a", "a", "b", "b"}, no_shm);
  EXPECT_EQ(algorithms_of(without_shm, 16), all(AllreduceAlgorithm::kDirect, 4));
}

TEST(GlooHierarchical, AskedForWhereItDoesNotApplyFailsOnEveryRank) {
  GlooOptions options;
  options.allreduce_algorithm = AllreduceAlgorithm::kHierarchical;
  std::atomic<int> refused{0};
  auto store = std::make_shared<MemoryStore>();
  run_threads(4, [&](int r) {
    GlooOptions mine = options;
    mine.hostname = "127.0.0.1";
    mine.host_id = fmt::format("host{}", r);
    try {
      make_gloo_process_group(store, r, 4, mine);
    } catch (const BackendError& e) {
      EXPECT_NE(std::string(e.what()).find("one rank per host"), std::string::npos) << e.what();
      ++refused;
    }
  });
  EXPECT_EQ(refused.load(), 4);
  GlooOptions bad;
  bad.host_id = "a,b";
  EXPECT_THROW(make_gloo_process_group(std::make_shared<MemoryStore>(), 0, 2, bad),
               InvalidArgument);
}

// Deterministic inputs of rank r for one case.
void fill(TypedBuffer& buffer, int rank, std::uint32_t seed, ReduceOp op) {
  std::mt19937 gen(seed * 131u + static_cast<std::uint32_t>(rank));
  const bool is_float = buffer.dtype == DType::kFloat32 || buffer.dtype == DType::kFloat64 ||
                        buffer.dtype == DType::kFloat16 || buffer.dtype == DType::kBFloat16;
  for (std::size_t i = 0; i < buffer.count(); ++i) {
    if (is_float) {
      std::uniform_real_distribution<double> d(op == ReduceOp::kProduct ? 0.5 : -4.0,
                                               op == ReduceOp::kProduct ? 1.5 : 4.0);
      buffer.set(i, d(gen));
    } else if (buffer.dtype == DType::kBool) {
      buffer.set(i, gen() % 2);
    } else {
      // Raw random bytes: every bit pattern, wrapping sums and products.
      for (std::size_t b = 0; b < element_size(buffer.dtype); ++b) {
        buffer.bytes[i * element_size(buffer.dtype) + b] = static_cast<std::uint8_t>(gen());
      }
    }
  }
}

struct Case {
  DType dtype;
  ReduceOp op;
  std::size_t count;
};

// Runs every case on hierarchical groups and on flat-ring groups of the same
// hosts; check(case, hier, flat) per rank, plus every rank's hierarchical result
// bit-identical to rank 0's.
void compare_with_flat_ring(
    const std::vector<std::string>& hosts, const std::vector<Case>& cases,
    const std::function<void(const Case&, const TypedBuffer&, const TypedBuffer&)>& check) {
  GlooOptions hier_options;
  hier_options.hierarchical_chunk_bytes = 4096;  // many chunks: the pipeline runs
  hier_options.shm_slot_bytes = 4096;            // and the shared memory steps too
  GlooOptions flat_options;
  flat_options.hierarchical = false;
  flat_options.allreduce_algorithm = AllreduceAlgorithm::kRing;
  auto hier = make_on_hosts(hosts, hier_options);
  auto flat = make_on_hosts(hosts, flat_options);
  const int n = static_cast<int>(hosts.size());
  std::vector<std::vector<std::uint8_t>> first(cases.size());
  std::mutex mutex;
  run_threads(n, [&](int r) {
    for (std::size_t c = 0; c < cases.size(); ++c) {
      const Case& k = cases[c];
      TypedBuffer a(k.dtype, k.count), b(k.dtype, k.count);
      fill(a, r, static_cast<std::uint32_t>(c), k.op);
      b.bytes = a.bytes;
      hier[static_cast<std::size_t>(r)]->allreduce(a.view(), k.op)->wait();
      flat[static_cast<std::size_t>(r)]->allreduce(b.view(), k.op)->wait();
      EXPECT_EQ(last_allreduce_algorithm(*hier[static_cast<std::size_t>(r)]),
                AllreduceAlgorithm::kHierarchical);
      EXPECT_EQ(last_allreduce_algorithm(*flat[static_cast<std::size_t>(r)]),
                AllreduceAlgorithm::kRing);
      check(k, a, b);
      std::lock_guard lock(mutex);
      if (first[c].empty()) first[c] = a.bytes;
      EXPECT_TRUE(first[c] == a.bytes)
          << "ranks disagree: " << to_string(k.dtype) << " " << to_string(k.op);
    }
  });
}

const std::vector<std::size_t> kCounts = {0, 1, 3, 7, 1001, 10007};

TEST(GlooHierarchical, IntegersBitIdenticalToTheFlatRing) {
  std::vector<Case> cases;
  for (DType dtype : {DType::kInt32, DType::kInt64, DType::kUInt8, DType::kInt8, DType::kBool}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                        ReduceOp::kProduct, ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
      if (dtype == DType::kBool && op == ReduceOp::kAvg) continue;  // refused, as in PyTorch
      for (std::size_t count : kCounts) cases.push_back({dtype, op, count});
    }
  }
  auto same_bits = [](const Case& k, const TypedBuffer& hier, const TypedBuffer& flat) {
    EXPECT_TRUE(hier.bytes == flat.bytes)
        << to_string(k.dtype) << " " << to_string(k.op) << " count " << k.count;
  };
  compare_with_flat_ring({"a", "a", "b", "b"}, cases, same_bits);
  compare_with_flat_ring({"a", "b", "b", "a", "c"}, cases, same_bits);
}

TEST(GlooHierarchical, FloatsWithinToleranceOfTheFlatRing) {
  std::vector<Case> cases;
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      for (std::size_t count : kCounts) cases.push_back({dtype, op, count});
    }
  }
  compare_with_flat_ring(
      {"a", "a", "b", "b"}, cases,
      [](const Case& k, const TypedBuffer& hier, const TypedBuffer& flat) {
        // Sums of 4 values in [-4, 4], rounded at each step in another order:
        // a few units in the last place of 16.
        const double tolerance = k.dtype == DType::kFloat64   ? 1e-12
                                 : k.dtype == DType::kFloat32 ? 1e-5
                                 : k.dtype == DType::kFloat16 ? 0.05
                                                              : 0.25;
        for (std::size_t i = 0; i < k.count; ++i) {
          const double x = hier.get(i), y = flat.get(i);
          if (k.op == ReduceOp::kMin || k.op == ReduceOp::kMax) {
            ASSERT_EQ(x, y) << to_string(k.dtype) << " " << to_string(k.op) << " [" << i << "]";
          } else {
            ASSERT_NEAR(x, y, tolerance * std::max(1.0, std::abs(y)))
                << to_string(k.dtype) << " " << to_string(k.op) << " [" << i << "]";
          }
        }
      });
}

TEST(GlooHierarchical, AbortWakesEveryRankAndANewGroupWorks) {
  GlooOptions options;
  options.timeout = 60s;
  options.hierarchical_chunk_bytes = 4096;
  auto groups = make_on_hosts({"a", "a", "b", "b"}, options);
  // Ranks 0-2 start an all-reduce that rank 3 never joins; then the round ends:
  // ranks 0 and 3 abort (as each rank's agent would have every rank abort).
  std::vector<std::vector<float>> data(3, std::vector<float>(1 << 20, 1.0f));
  std::vector<WorkPtr> works;
  for (int r = 0; r < 3; ++r) {
    works.push_back(groups[static_cast<std::size_t>(r)]->allreduce(
        Buffer::of(data[static_cast<std::size_t>(r)])));
  }
  std::this_thread::sleep_for(100ms);
  groups[0]->abort("test: round ended");
  groups[3]->abort("test: round ended");
  for (int r = 0; r < 3; ++r) {
    auto& work = works[static_cast<std::size_t>(r)];
    // Far below the 60 s timeout: nothing waits it out.
    EXPECT_THROW(work->wait(30s), Error) << "rank " << r;
    EXPECT_TRUE(work->is_completed()) << "rank " << r;
  }
  EXPECT_THROW(groups[0]->allreduce(Buffer::of(data[0]))->wait(), GroupChanged);
  groups.clear();
  auto next = make_on_hosts({"a", "a", "b", "b"}, options);
  EXPECT_EQ(algorithms_of(next, 100000), all(AllreduceAlgorithm::kHierarchical, 4));
}

}  // namespace
}  // namespace ddp::test
