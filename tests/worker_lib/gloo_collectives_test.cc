// Every collective of the Gloo backend, for every dtype and reduction, checked
// against a reference computed in the test. Ranks are threads over a MemoryStore.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>

#include <fmt/format.h>

#include "ddp/common/error.h"
#include "test_util.h"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;

struct AlgoCase {
  AllreduceAlgorithm algorithm;
  int world;
  std::size_t shm_slot_bytes = 1024 * 1024;
};

class AllreduceTest : public ::testing::TestWithParam<AlgoCase> {};

TEST_P(AllreduceTest, EveryDtypeAndOpMatchesReference) {
  // Named copies, not a structured binding: the lambda below captures them
  // (clang 14, which the sanitized builds use, cannot capture a binding).
  const AllreduceAlgorithm algorithm = GetParam().algorithm;
  const int world = GetParam().world;
  GlooOptions options;
  options.timeout = 20s;
  options.allreduce_algorithm = algorithm;
  options.max_segment_bytes = 4096;  // several segments per rank even for small buffers
  options.shm_slot_bytes = GetParam().shm_slot_bytes;
  auto groups = make_groups(world, std::make_shared<MemoryStore>(), options);
  for (std::size_t count :
       {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{9001}, std::size_t{30001}}) {
    for (DType dtype : all_dtypes()) {
      for (ReduceOp op : all_ops()) {
        run_threads(world, [&](int r) {
          TypedBuffer buf(dtype, count);
          for (std::size_t i = 0; i < count; ++i) buf.set(i, input_value(op, dtype, r, i));
          auto work = groups[r]->allreduce(buf.view(), op);
          ASSERT_TRUE(work->wait());
          for (std::size_t i = 0; i < count; ++i) {
            ASSERT_EQ(buf.get(i), expected_value(op, dtype, world, i))
                << "rank " << r << " algorithm " << to_string(algorithm) << " dtype "
                << to_string(dtype) << " op " << to_string(op) << " count " << count << " i " << i;
          }
        });
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, AllreduceTest,
    ::testing::Values(
        AlgoCase{AllreduceAlgorithm::kAuto, 3}, AlgoCase{AllreduceAlgorithm::kRing, 3},
        AlgoCase{AllreduceAlgorithm::kDirect, 3}, AlgoCase{AllreduceAlgorithm::kBcube, 4},
        AlgoCase{AllreduceAlgorithm::kRing, 2}, AlgoCase{AllreduceAlgorithm::kAuto, 1},
        // 4 KiB slots: many chunks, all on the one-barrier path
        AlgoCase{AllreduceAlgorithm::kSharedMemory, 3, 4096},
        // 64 KiB slots: split chunks plus a small tail
        AlgoCase{AllreduceAlgorithm::kSharedMemory, 3, 64 * 1024},
        AlgoCase{AllreduceAlgorithm::kSharedMemory, 2, 64 * 1024},
        AlgoCase{AllreduceAlgorithm::kSharedMemory, 4, 48 * 1024}),
    [](const auto& info) {
      return fmt::format("{}_world{}_slot{}k", to_string(info.param.algorithm), info.param.world,
                         info.param.shm_slot_bytes / 1024);
    });

TEST(GlooCollectives, IntegerSumAndProductWrapLikePyTorch) {
  auto groups = make_groups(2, std::make_shared<MemoryStore>());
  run_threads(2, [&](int r) {
    std::vector<std::uint8_t> sum = {200, 255};
    std::vector<std::uint8_t> prod = {16, 3};
    groups[r]->allreduce(Buffer::of(sum), ReduceOp::kSum)->wait();
    groups[r]->allreduce(Buffer::of(prod), ReduceOp::kProduct)->wait();
    EXPECT_EQ(sum[0], static_cast<std::uint8_t>(400 % 256));
    EXPECT_EQ(sum[1], static_cast<std::uint8_t>(510 % 256));
    EXPECT_EQ(prod[0], static_cast<std::uint8_t>(256 % 256));
    EXPECT_EQ(prod[1], 9);
  });
}

TEST(GlooCollectives, BroadcastEveryDtypeFromEveryRoot) {
  const int world = 3;
  auto groups = make_groups(world, std::make_shared<MemoryStore>());
  for (DType dtype : all_dtypes()) {
    for (int root = 0; root < world; ++root) {
      run_threads(world, [&](int r) {
        TypedBuffer buf(dtype, 5000);
        for (std::size_t i = 0; i < buf.count(); ++i)
          buf.set(i, r == root ? (i * 5 + root) % 97 : 0);
        groups[r]->broadcast(buf.view(), root)->wait();
        for (std::size_t i = 0; i < buf.count(); ++i) {
          ASSERT_EQ(buf.get(i), static_cast<double>((i * 5 + root) % 97))
              << to_string(dtype) << " root " << root << " rank " << r;
        }
      });
    }
  }
}

// broadcast_many: buffers of odd sizes (empty ones too) read as one stream,
// from every root, through shared memory with small slots (a chunk of 3 x 4 KiB,
// so that buffers straddle chunks) and over TCP; every byte arrives, the root's
// own bytes stay, and the group says which path is the fast one.
TEST(GlooCollectives, BroadcastManyMovesEveryByteFromEveryRoot) {
  const int world = 3;
  for (bool shm : {true, false}) {
    GlooOptions options;
    options.shared_memory = shm;
    options.shm_slot_bytes = 4096;
    auto groups = make_groups(world, std::make_shared<MemoryStore>(), options);
    EXPECT_EQ(groups[0]->broadcast_is_fast(), shm);
    const std::vector<std::pair<DType, std::size_t>> layout = {
        {DType::kUInt8, 0},     {DType::kUInt8, 1}, {DType::kFloat32, 3001},
        {DType::kUInt8, 12288}, {DType::kInt64, 0}, {DType::kFloat64, 6251},
        {DType::kUInt8, 4095},  {DType::kInt64, 7}};
    for (int root = 0; root < world; ++root) {
      auto pattern = [](int from, std::size_t buffer, std::size_t i) {
        return static_cast<std::uint8_t>((i * 31 + buffer * 7 + static_cast<std::size_t>(from)) %
                                         251);
      };
      run_threads(world, [&](int r) {
        std::vector<std::vector<std::uint8_t>> memory;
        std::vector<Buffer> buffers;
        for (const auto& [dtype, count] : layout) {
          memory.emplace_back(count * element_size(dtype));
          auto& bytes = memory.back();
          for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = pattern(r, memory.size(), i);
          buffers.push_back(Buffer{bytes.data(), count, dtype, Device::cpu()});
        }
        groups[static_cast<std::size_t>(r)]->broadcast_many(buffers, root)->wait();
        for (std::size_t b = 0; b < memory.size(); ++b) {
          for (std::size_t i = 0; i < memory[b].size(); ++i) {
            ASSERT_EQ(memory[b][i], pattern(root, b + 1, i))
                << (shm ? "shm" : "tcp") << " root " << root << " rank " << r << " buffer " << b
                << " byte " << i;
          }
        }
      });
    }
  }
}

// Broadcasts and all-reduces back to back through the same two slot sets: a
// broadcast's chunk never overwrites what a slower rank still reads.
TEST(GlooCollectives, BroadcastManyAndAllreducesShareTheSlotsSafely) {
  const int world = 3;
  GlooOptions options;
  options.shared_memory = true;
  options.shm_slot_bytes = 4096;
  auto groups = make_groups(world, std::make_shared<MemoryStore>(), options);
  run_threads(world, [&](int r) {
    ProcessGroup& group = *groups[static_cast<std::size_t>(r)];
    for (int round = 0; round < 300; ++round) {
      const int root = round % world;
      std::vector<std::int64_t> a(round % 2 == 0 ? 5000 : 3), b(777);
      for (std::size_t i = 0; i < a.size(); ++i)
        a[i] = r == root ? round * 100000 + static_cast<std::int64_t>(i) : -1;
      for (std::size_t i = 0; i < b.size(); ++i)
        b[i] = r == root ? round - static_cast<std::int64_t>(i) : -1;
      const WorkPtr moved = group.broadcast_many({Buffer::of(a), Buffer::of(b)}, root);
      std::vector<std::int64_t> sum(round % 3 == 0 ? 4000 : 9, r + 1);
      group.allreduce(Buffer::of(sum), ReduceOp::kSum)->wait();
      moved->wait();
      for (std::size_t i = 0; i < a.size(); ++i)
        ASSERT_EQ(a[i], round * 100000 + static_cast<std::int64_t>(i)) << "round " << round;
      for (std::size_t i = 0; i < b.size(); ++i)
        ASSERT_EQ(b[i], round - static_cast<std::int64_t>(i)) << "round " << round;
      for (std::int64_t x : sum) ASSERT_EQ(x, 6) << "round " << round;
    }
  });
}

TEST(GlooCollectives, BroadcastManyRejectsABadRootOrACudaBuffer) {
  auto groups = make_groups(1, std::make_shared<MemoryStore>());
  std::vector<float> v(3);
  EXPECT_THROW(groups[0]->broadcast_many({Buffer::of(v)}, 1), InvalidArgument);
  EXPECT_THROW(
      groups[0]->broadcast_many({Buffer{v.data(), v.size(), DType::kFloat32, Device::cuda(0)}}, 0),
      InvalidArgument);
}

TEST(GlooCollectives, AllgatherEveryDtype) {
  const int world = 4;
  auto groups = make_groups(world, std::make_shared<MemoryStore>());
  for (DType dtype : all_dtypes()) {
    run_threads(world, [&](int r) {
      const std::size_t n = 333;
      TypedBuffer in(dtype, n);
      TypedBuffer out(dtype, n * world);
      for (std::size_t i = 0; i < n; ++i) in.set(i, (r * 31 + i) % 100);
      groups[r]->allgather(out.view(), in.view())->wait();
      for (int src = 0; src < world; ++src) {
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_EQ(out.get(src * n + i), static_cast<double>((src * 31 + i) % 100))
              << to_string(dtype) << " rank " << r;
        }
      }
    });
  }
}

TEST(GlooCollectives, ReduceScatterEveryDtypeAndOp) {
  const int world = 3;
  GlooOptions options;
  options.direct_max_bytes = 2048;  // exercise both the direct and the ring path
  auto groups = make_groups(world, std::make_shared<MemoryStore>(), options);
  for (std::size_t chunk : {std::size_t{4}, std::size_t{5000}}) {
    for (DType dtype : all_dtypes()) {
      for (ReduceOp op : all_ops()) {
        run_threads(world, [&](int r) {
          TypedBuffer in(dtype, chunk * world);
          TypedBuffer out(dtype, chunk);
          for (std::size_t i = 0; i < in.count(); ++i) in.set(i, input_value(op, dtype, r, i));
          TypedBuffer before = in;
          groups[r]->reduce_scatter(out.view(), in.view(), op)->wait();
          for (std::size_t i = 0; i < chunk; ++i) {
            ASSERT_EQ(out.get(i), expected_value(op, dtype, world, r * chunk + i))
                << to_string(dtype) << " " << to_string(op) << " rank " << r;
          }
          ASSERT_EQ(in.bytes, before.bytes) << "input must stay untouched";
        });
      }
    }
  }
}

TEST(GlooCollectives, ReduceEveryDtypeAndOpToRoot) {
  const int world = 3;
  const int root = 1;
  auto groups = make_groups(world, std::make_shared<MemoryStore>());
  for (DType dtype : all_dtypes()) {
    for (ReduceOp op : all_ops()) {
      run_threads(world, [&](int r) {
        TypedBuffer buf(dtype, 2500);
        for (std::size_t i = 0; i < buf.count(); ++i) buf.set(i, input_value(op, dtype, r, i));
        groups[r]->reduce(buf.view(), root, op)->wait();
        if (r != root) return;
        for (std::size_t i = 0; i < buf.count(); ++i) {
          ASSERT_EQ(buf.get(i), expected_value(op, dtype, world, i))
              << to_string(dtype) << " " << to_string(op);
        }
      });
    }
  }
}

TEST(GlooCollectives, BarrierWaitsForTheSlowestRank) {
  const int world = 3;
  auto groups = make_groups(world, std::make_shared<MemoryStore>());
  std::atomic<bool> slow_entered{false};
  run_threads(world, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(300ms);
      slow_entered = true;
    }
    groups[r]->barrier()->wait();
    EXPECT_TRUE(slow_entered.load()) << "rank " << r << " left the barrier before rank 2 entered";
  });
}

TEST(GlooCollectives, SendRecvBothWaysWithTags) {
  const int world = 3;
  auto groups = make_groups(world, std::make_shared<MemoryStore>());
  run_threads(world, [&](int r) {
    const int right = (r + 1) % world;
    const int left = (r + world - 1) % world;
    // Everyone sends first, then receives: must not deadlock (sends are async).
    std::vector<std::int64_t> out_a(1000, r * 10 + 1), out_b(10, r * 10 + 2);
    std::vector<std::int64_t> in_a(1000, -1), in_b(10, -1);
    auto s1 = groups[r]->send(Buffer::of(out_a), right, 1);
    auto s2 = groups[r]->send(Buffer::of(out_b), right, 2);
    // Receive tag 2 before tag 1: tags are matched independently.
    auto r2 = groups[r]->recv(Buffer::of(in_b), left, 2);
    auto r1 = groups[r]->recv(Buffer::of(in_a), left, 1);
    for (auto& w : {s1, s2, r1, r2}) ASSERT_TRUE(w->wait());
    for (auto v : in_a) ASSERT_EQ(v, left * 10 + 1);
    for (auto v : in_b) ASSERT_EQ(v, left * 10 + 2);
  });
}

TEST(GlooCollectives, ManyOutstandingWorksCompleteInIssueOrder) {
  const int world = 3;
  const int kOps = 200;
  auto groups = make_groups(world, std::make_shared<MemoryStore>());
  run_threads(world, [&](int r) {
    std::vector<std::vector<float>> bufs(kOps);
    std::vector<WorkPtr> works;
    for (int k = 0; k < kOps; ++k) {
      bufs[k].assign(64 + k * 37, static_cast<float>(r + k));
      works.push_back(
          groups[r]->allreduce(Buffer::of(bufs[k]), k % 2 ? ReduceOp::kMax : ReduceOp::kSum));
    }
    for (int k = kOps - 1; k >= 0; --k) {
      // Waiting on a later Work first: when it is done, all earlier ones are too.
      ASSERT_TRUE(works[k]->wait());
      for (int j = 0; j < k; ++j) ASSERT_TRUE(works[j]->is_completed());
    }
    for (int k = 0; k < kOps; ++k) {
      EXPECT_EQ(works[k]->sequence_number(), static_cast<std::uint64_t>(k));
      EXPECT_EQ(works[k]->exception(), nullptr);
      float expected = k % 2 ? static_cast<float>(world - 1 + k)
                             : static_cast<float>(world * k + world * (world - 1) / 2);
      for (float v : bufs[k]) ASSERT_EQ(v, expected) << "op " << k;
    }
  });
}

TEST(GlooCollectives, CallsReturnBeforeTheCollectiveCompletes) {
  auto groups = make_groups(2, std::make_shared<MemoryStore>());
  std::vector<float> a(10, 1.0f), b(10, 2.0f);
  // Rank 0 issues alone: the call must return while rank 1 has not joined yet.
  auto w0 = groups[0]->allreduce(Buffer::of(a));
  EXPECT_FALSE(w0->is_completed());
  EXPECT_FALSE(w0->wait(100ms));
  auto w1 = groups[1]->allreduce(Buffer::of(b));
  EXPECT_TRUE(w0->wait());
  EXPECT_TRUE(w1->wait());
  EXPECT_EQ(a[0], 3.0f);
  EXPECT_EQ(b[9], 3.0f);
}

TEST(GlooCollectives, TwoGroupsUsedAtOnce) {
  const int world = 3;
  auto base = std::make_shared<MemoryStore>();
  auto g1 = make_groups(world, std::make_shared<PrefixStore>("group1", base));
  auto g2 = make_groups(world, std::make_shared<PrefixStore>("group2", base));
  run_threads(world * 2, [&](int t) {
    int r = t % world;
    auto& group = t < world ? g1[r] : g2[r];
    float scale = t < world ? 1.0f : 100.0f;
    for (int k = 0; k < 50; ++k) {
      std::vector<float> buf(2000 + k, scale * static_cast<float>(r + 1));
      group->allreduce(Buffer::of(buf))->wait();
      for (float v : buf) ASSERT_EQ(v, scale * 6.0f);
    }
  });
}

TEST(GlooCollectives, RejectsBadArguments) {
  auto groups = make_groups(2, std::make_shared<MemoryStore>());
  std::vector<float> small(3), big(7);
  EXPECT_THROW(groups[0]->allgather(Buffer::of(big), Buffer::of(small)), InvalidArgument);
  EXPECT_THROW(groups[0]->reduce_scatter(Buffer::of(small), Buffer::of(big)), InvalidArgument);
  EXPECT_THROW(groups[0]->broadcast(Buffer::of(small), 2), InvalidArgument);
  EXPECT_THROW(groups[0]->send(Buffer::of(small), 0), InvalidArgument);
  Buffer gpu = Buffer::of(small);
  gpu.device = Device::cuda(0);
  EXPECT_THROW(groups[0]->allreduce(gpu), InvalidArgument);
  std::vector<double> other(6);
  EXPECT_THROW(groups[0]->allgather(Buffer::of(other), Buffer::of(small)), InvalidArgument);
  EXPECT_THROW(make_gloo_process_group(std::make_shared<MemoryStore>(), 2, 2), InvalidArgument);
  EXPECT_THROW(make_gloo_process_group(nullptr, 0, 1), InvalidArgument);
}

}  // namespace
}  // namespace ddp::test
