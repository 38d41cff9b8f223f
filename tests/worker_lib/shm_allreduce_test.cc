// The Gloo backend's same-host shared-memory all-reduce (worker_lib/src/shm_allreduce.h):
// bit-identical results on every rank, setup that falls back to TCP on every
// rank alike, no segment left in /dev/shm, timeouts and option errors that name
// what was wrong. Ranks are threads; the dead-peer case runs real processes in
// launch_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utime.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>

#include "ddp/common/error.h"
#include "ddp/common/time.h"
#include "shm/shm_allreduce.h"
#include "test_util.h"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;
using detail::ShmAllreduce;
using ::testing::HasSubstr;

// Segments of this process in /dev/shm (names carry the creator's pid).
std::vector<std::string> own_segments() {
  std::vector<std::string> out;
  const std::string prefix = fmt::format("ddp-shm-{}-", ::getpid());
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const auto name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

std::vector<std::unique_ptr<ShmAllreduce>> make_shm(int world, std::size_t slot_bytes,
                                                    std::shared_ptr<Store> store = nullptr) {
  if (!store) store = std::make_shared<MemoryStore>();
  std::vector<std::unique_ptr<ShmAllreduce>> out(static_cast<std::size_t>(world));
  ShmAllreduce::Options options;
  options.slot_bytes = slot_bytes;
  options.timeout = 10s;
  run_threads(world, [&](int r) {
    out[static_cast<std::size_t>(r)] = ShmAllreduce::create(*store, r, world, options);
  });
  return out;
}

TEST(ShmAllreduce, EveryRankEndsWithIdenticalBitsOfTheSum) {
  // Random floats: rounding depends on the order of the additions, so equal bits
  // on every rank show that each element was reduced once, in one order.
  for (int world : {2, 3, 5}) {
    auto shm = make_shm(world, 64 * 1024);
    for (std::size_t count : {std::size_t{1}, std::size_t{5000}, std::size_t{100003}}) {
      std::vector<std::vector<float>> data(static_cast<std::size_t>(world));
      for (int r = 0; r < world; ++r) {
        std::mt19937 rng(static_cast<unsigned>(r * 1000 + count));
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        for (std::size_t i = 0; i < count; ++i)
          data[static_cast<std::size_t>(r)].push_back(dist(rng));
      }
      std::vector<double> reference(count, 0.0);
      for (const auto& d : data)
        for (std::size_t i = 0; i < count; ++i) reference[i] += d[i];
      run_threads(world, [&](int r) {
        auto& mine = data[static_cast<std::size_t>(r)];
        shm[static_cast<std::size_t>(r)]->allreduce(
            mine.data(), count, DType::kFloat32,
            detail::reduce_function(DType::kFloat32, ReduceOp::kSum), 1, Deadline(10s));
      });
      for (int r = 1; r < world; ++r) {
        ASSERT_EQ(0,
                  std::memcmp(data[0].data(), data[static_cast<std::size_t>(r)].data(), count * 4))
            << "world " << world << " count " << count << " rank " << r;
      }
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_NEAR(data[0][i], reference[i], 1e-5)
            << "world " << world << " count " << count << " i " << i;
      }
    }
  }
}

TEST(ShmAllreduce, AverageIsTakenInsideTheReduction) {
  const int world = 3;
  auto shm = make_shm(world, 64 * 1024);
  for (std::size_t count : {std::size_t{10}, std::size_t{50000}}) {
    run_threads(world, [&](int r) {
      std::vector<double> v(count, 3.0 * (r + 1));  // 3, 6, 9: mean 6
      shm[static_cast<std::size_t>(r)]->allreduce(
          v.data(), count, DType::kFloat64,
          detail::reduce_function(DType::kFloat64, ReduceOp::kSum), world, Deadline(10s));
      for (std::size_t i = 0; i < count; ++i)
        ASSERT_EQ(v[i], 6.0) << "count " << count << " i " << i;
    });
  }
}

TEST(ShmAllreduce, AverageHasTheBitsOfTheSumInRankOrderDividedByTheWorld) {
  // The division is fused with the copy of each rank's share; the result must
  // stay exactly what summing in rank order and dividing gives, on every rank.
  for (int world : {2, 3}) {
    auto shm = make_shm(world, 64 * 1024);
    const std::size_t count = 70001;  // several chunks, the last one short
    std::vector<std::vector<float>> data(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) {
      std::mt19937 rng(static_cast<unsigned>(r + 7));
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      for (std::size_t i = 0; i < count; ++i)
        data[static_cast<std::size_t>(r)].push_back(dist(rng));
    }
    std::vector<float> expected(count);
    for (std::size_t i = 0; i < count; ++i) {
      float sum = data[0][i] + data[1][i];
      for (int r = 2; r < world; ++r) sum += data[static_cast<std::size_t>(r)][i];
      expected[i] = sum / static_cast<float>(world);
    }
    run_threads(world, [&](int r) {
      auto& mine = data[static_cast<std::size_t>(r)];
      shm[static_cast<std::size_t>(r)]->allreduce(
          mine.data(), count, DType::kFloat32,
          detail::reduce_function(DType::kFloat32, ReduceOp::kAvg), world, Deadline(10s));
    });
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(0, std::memcmp(expected.data(), data[static_cast<std::size_t>(r)].data(),
                               count * sizeof(float)))
          << "world " << world << " rank " << r;
    }
  }
}

TEST(ReduceFunctions, DivideAndCopyGivesTheBitsOfDivideThenCopy) {
  auto check = [](DType dtype, std::size_t esize) {
    const std::size_t count = 1001;
    std::vector<std::uint8_t> a(count * esize), copy(count * esize, 0xAB);
    std::mt19937 rng(5);
    for (auto& byte : a) byte = static_cast<std::uint8_t>(rng() & 0x3F);  // finite values
    std::vector<std::uint8_t> b = a;
    detail::divide_by(b.data(), count, dtype, 3);
    detail::divide_and_copy(a.data(), copy.data(), count, dtype, 3);
    EXPECT_EQ(a, b) << to_string(dtype);
    EXPECT_EQ(copy, b) << to_string(dtype);
  };
  check(DType::kFloat32, 4);
  check(DType::kFloat64, 8);
  check(DType::kFloat16, 2);
  check(DType::kInt32, 4);
}

TEST(ShmAllreduce, ManyBackToBackCallsReuseTheSlotsSafely) {
  // Alternating sizes on both paths, thousands of rounds through both slot sets.
  const int world = 3;
  auto shm = make_shm(world, 8192);
  run_threads(world, [&](int r) {
    for (int round = 0; round < 2000; ++round) {
      const std::size_t count = round % 3 == 0 ? 5000 : 17;
      std::vector<std::int64_t> v(count);
      for (std::size_t i = 0; i < count; ++i) v[i] = round * 10 + r + static_cast<std::int64_t>(i);
      shm[static_cast<std::size_t>(r)]->allreduce(
          v.data(), count, DType::kInt64, detail::reduce_function(DType::kInt64, ReduceOp::kSum), 1,
          Deadline(10s));
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_EQ(v[i], 3 * (round * 10 + static_cast<std::int64_t>(i)) + 3)
            << "round " << round << " i " << i;
      }
    }
  });
}

TEST(ShmAllreduce, NothingIsLeftInDevShm) {
  {
    auto shm = make_shm(2, 4096);
    ASSERT_NE(shm[0], nullptr);
    // Unlinked as soon as every rank mapped it: a crash later leaks nothing.
    EXPECT_THAT(own_segments(), ::testing::IsEmpty());
  }
  EXPECT_THAT(own_segments(), ::testing::IsEmpty());
}

TEST(ShmAllreduce, RankThatCannotMapTheSegmentMakesEveryRankFallBack) {
  // Rank 1 plays a rank on another host: it reads the name, cannot open it, and
  // says so. Rank 0 must give up too, and remove the segment.
  auto store = std::make_shared<MemoryStore>();
  std::unique_ptr<ShmAllreduce> rank0;
  std::thread other([&] {
    store->get("shm/segment", 10s);
    store->set("shm/ok/1", "0 shm_open: No such file or directory (another host?)");
  });
  ShmAllreduce::Options options;
  options.slot_bytes = 4096;
  options.timeout = 10s;
  rank0 = ShmAllreduce::create(*store, 0, 2, options);
  other.join();
  EXPECT_EQ(rank0, nullptr);
  EXPECT_THAT(own_segments(), ::testing::IsEmpty());
}

TEST(ShmAllreduce, RankThatCannotOpenTheNameReportsWhy) {
  auto store = std::make_shared<MemoryStore>();
  store->set("shm/segment", "/ddp-shm-0-doesnotexist 0000000000000001");
  store->set("shm/ok/0", "1");
  ShmAllreduce::Options options;
  options.slot_bytes = 4096;
  options.timeout = 10s;
  EXPECT_EQ(ShmAllreduce::create(*store, 1, 2, options), nullptr);
  EXPECT_THAT(store->get("shm/ok/1", 1s), HasSubstr("shm_open"));
}

TEST(ShmAllreduce, StaleSegmentOfADeadCreatorIsRemoved) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // a pid that no longer runs
  const std::string name = fmt::format("ddp-shm-{}-00000000deadbeef", child);
  const int fd = ::shm_open(("/" + name).c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  const std::string path = "/dev/shm/" + name;
  utimbuf old_times{::time(nullptr) - 3600, ::time(nullptr) - 3600};
  ASSERT_EQ(::utime(path.c_str(), &old_times), 0);
  auto shm = make_shm(2, 4096);  // rank 0 sweeps before creating its own
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(ShmAllreduce, RankThatNeverCallsGivesTimeoutNamingIt) {
  auto shm = make_shm(2, 4096);
  std::vector<float> v(100, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  try {
    shm[0]->allreduce(v.data(), v.size(), DType::kFloat32,
                      detail::reduce_function(DType::kFloat32, ReduceOp::kSum), 1, Deadline(300ms));
    FAIL() << "allreduce without rank 1 returned";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("waiting for rank 1"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(ShmAllreduce, BadSlotSizeIsNamed) {
  MemoryStore store;
  ShmAllreduce::Options options;
  options.slot_bytes = 1000;
  try {
    ShmAllreduce::create(store, 0, 2, options);
    FAIL() << "slot_bytes 1000 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("slot_bytes 1000"));
  }
}

TEST(GlooSharedMemory, BadSlotSizeOptionIsNamedBeforeConnecting) {
  GlooOptions options;
  options.shm_slot_bytes = 5000;  // not a multiple of 64
  try {
    make_groups(2, std::make_shared<MemoryStore>(), options);
    FAIL() << "shm_slot_bytes 5000 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("shm_slot_bytes 5000"));
  }
}

TEST(GlooSharedMemory, ExplicitAlgorithmWithSharedMemoryOffIsRejected) {
  GlooOptions options;
  options.allreduce_algorithm = AllreduceAlgorithm::kSharedMemory;
  options.shared_memory = false;
  try {
    make_groups(2, std::make_shared<MemoryStore>(), options);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("needs shared_memory on"));
  }
}

TEST(GlooSharedMemory, RanksConfiguredDifferentlyFallBackTogetherWithoutWaiting) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::shared_ptr<ProcessGroup>> groups(2);
  const auto start = std::chrono::steady_clock::now();
  run_threads(2, [&](int r) {
    GlooOptions options;
    options.hostname = "127.0.0.1";
    options.shared_memory = r == 0;  // rank 1 has it off
    groups[static_cast<std::size_t>(r)] = make_gloo_process_group(store, r, 2, options);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  run_threads(2, [&](int r) {
    std::vector<float> v(100000, static_cast<float>(r + 1));
    groups[static_cast<std::size_t>(r)]->allreduce(Buffer::of(v))->wait();  // over TCP on both
    EXPECT_EQ(v[99999], 3.0f);
  });
}

TEST(GlooSharedMemory, ExplicitAlgorithmNamesTheRankThatCannotTakePart) {
  auto store = std::make_shared<MemoryStore>();
  std::string error;
  run_threads(2, [&](int r) {
    GlooOptions options;
    options.hostname = "127.0.0.1";
    options.timeout = 20s;
    if (r == 0) options.allreduce_algorithm = AllreduceAlgorithm::kSharedMemory;
    if (r == 1) options.shared_memory = false;
    try {
      auto group = make_gloo_process_group(store, r, 2, options);
    } catch (const BackendError& e) {
      error = e.what();
    }
  });
  EXPECT_THAT(error, HasSubstr("allreduce_algorithm shm, but the ranks cannot share memory"));
  EXPECT_THAT(error, HasSubstr("rank 1: shared memory is off on this rank"));
}

TEST(GlooSharedMemory, DisabledByEnvironmentLikeNcclShmDisable) {
  ::setenv("DDP_SHM_DISABLE", "1", 1);
  GlooOptions options;
  options.allreduce_algorithm = AllreduceAlgorithm::kSharedMemory;
  try {
    make_groups(2, std::make_shared<MemoryStore>(), options);
    ::unsetenv("DDP_SHM_DISABLE");
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    ::unsetenv("DDP_SHM_DISABLE");
    EXPECT_THAT(e.what(), HasSubstr("DDP_SHM_DISABLE"));
  }
  // Without the variable the same options work.
  auto groups = make_groups(2, std::make_shared<MemoryStore>(), options);
  run_threads(2, [&](int r) {
    std::vector<float> v(10, static_cast<float>(r + 1));
    groups[static_cast<std::size_t>(r)]->allreduce(Buffer::of(v), ReduceOp::kAvg)->wait();
    EXPECT_EQ(v[9], 1.5f);
  });
}

TEST(GlooSharedMemory, EnvironmentFlagIsABooleanAndABadValueIsNamed) {
  GlooOptions options;
  options.allreduce_algorithm = AllreduceAlgorithm::kSharedMemory;
  ::setenv("DDP_SHM_DISABLE", "false", 1);  // off means on: the group gets its segment
  EXPECT_NO_THROW(make_groups(2, std::make_shared<MemoryStore>(), options));
  ::setenv("DDP_SHM_DISABLE", "maybe", 1);
  try {
    make_groups(2, std::make_shared<MemoryStore>(), options);
    ::unsetenv("DDP_SHM_DISABLE");
    FAIL() << "DDP_SHM_DISABLE=maybe accepted";
  } catch (const InvalidArgument& e) {
    ::unsetenv("DDP_SHM_DISABLE");
    EXPECT_THAT(e.what(), HasSubstr("DDP_SHM_DISABLE"));
    EXPECT_THAT(e.what(), HasSubstr("'maybe'"));
  }
}

}  // namespace
}  // namespace ddp::test
