// ReplicaState::sync over real Gloo groups (ranks as threads over a
// MemoryStore): which rank's state wins (rank 0 at a fresh start, the lowest
// live rank after a re-form), that buffers of every kind and the counters
// travel, and that registrations that differ fail on every rank without moving
// anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/worker/replica_state.h"
#include "test_util.h"

namespace ddp::test {
namespace {

// One replica's memory: parameters (float32), optimizer state (float64), a
// uint8 buffer, an empty buffer, and two counters. Not movable once registered.
struct Replica {
  std::vector<float> w;
  std::vector<double> m;
  std::vector<std::uint8_t> flags;
  std::vector<float> empty;
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  ReplicaState state;

  explicit Replica(int v) { fill(v); }
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  void fill(int v) {
    w.assign(1000, static_cast<float>(v) + 0.5f);
    m.assign(37, 2.0 * v);
    flags.assign(3, static_cast<std::uint8_t>(v));
    step = 10 * v;
    epoch = v;
  }
  bool holds(int v) const {
    for (float x : w)
      if (x != static_cast<float>(v) + 0.5f) return false;
    for (double x : m)
      if (x != 2.0 * v) return false;
    for (auto x : flags)
      if (x != static_cast<std::uint8_t>(v)) return false;
    return step == 10 * v && epoch == v;
  }
  void register_all() {
    state.add("w", Buffer::of(w));
    state.add("m", Buffer::of(m));
    state.add("flags", Buffer::of(flags));
    state.add("empty", Buffer::of(empty));
    state.add("step", &step);
    state.add("epoch", &epoch);
  }
};

constexpr std::size_t kReplicaBytes = 1000 * 4 + 37 * 8 + 3 + 0 + 2 * 8;

std::vector<std::unique_ptr<Replica>> make_replicas(const std::vector<int>& values) {
  std::vector<std::unique_ptr<Replica>> out;
  for (int v : values) {
    out.push_back(std::make_unique<Replica>(v));
    out.back()->register_all();
  }
  return out;
}

std::vector<std::shared_ptr<ProcessGroup>> groups_of(int n) {
  return make_groups(n, std::make_shared<MemoryStore>());
}

TEST(ReplicaState, FreshStartTakesRankZero) {
  auto groups = groups_of(3);
  auto replicas = make_replicas({1, 2, 3});
  EXPECT_EQ(replicas[0]->state.bytes(), kReplicaBytes);
  EXPECT_EQ(replicas[0]->state.size(), 6u);
  std::vector<SyncResult> results(3);
  run_threads(3, [&](int r) {
    EXPECT_FALSE(replicas[r]->state.live());
    results[r] = replicas[r]->state.sync(*groups[r]);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(replicas[r]->holds(1)) << "rank " << r;
    EXPECT_TRUE(replicas[r]->state.live());
    EXPECT_EQ(results[r].root, 0);
    EXPECT_EQ(results[r].received, r != 0);
    EXPECT_EQ(results[r].bytes, kReplicaBytes);
    EXPECT_GE(results[r].seconds, 0.0);
  }
}

TEST(ReplicaState, NewcomerAtRankZeroReceivesTheLowestLiveRanksState) {
  // The old world: the future survivors sync once (they become live), then
  // train on, and diverge (rank 2 of the old world got one step further).
  auto old_groups = groups_of(2);
  auto survivors = make_replicas({5, 6});
  run_threads(2, [&](int r) { survivors[r]->state.sync(*old_groups[r]); });
  survivors[0]->fill(7);
  survivors[1]->fill(8);

  // The new world: a newcomer at rank 0, the survivors at ranks 1 and 2.
  auto newcomer = make_replicas({-1});
  std::vector<Replica*> world = {newcomer[0].get(), survivors[0].get(), survivors[1].get()};
  auto groups = groups_of(3);
  std::vector<SyncResult> results(3);
  run_threads(3, [&](int r) { results[r] = world[r]->state.sync(*groups[r]); });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(world[r]->holds(7)) << "rank " << r;
    EXPECT_TRUE(world[r]->state.live());
    EXPECT_EQ(results[r].root, 1);
    EXPECT_EQ(results[r].received, r != 1);
    EXPECT_EQ(results[r].bytes, kReplicaBytes);
  }
}

// A program that registers its state anew for each sync (ddp_torch.sync_state)
// carries its liveness over with set_live: fresh ReplicaStates on ranks 1 and 2
// told they are live make rank 1 the root, not the fresh rank 0.
TEST(ReplicaState, SetLiveCarriesLivenessToANewRegistration) {
  auto groups = groups_of(3);
  auto replicas = make_replicas({4, 5, 6});
  replicas[1]->state.set_live(true);
  replicas[2]->state.set_live(true);
  std::vector<SyncResult> results(3);
  run_threads(3, [&](int r) { results[r] = replicas[r]->state.sync(*groups[r]); });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(replicas[r]->holds(5)) << "rank " << r;
    EXPECT_EQ(results[r].root, 1);
    EXPECT_TRUE(results[r].from_live);
    EXPECT_TRUE(replicas[r]->state.live());
  }
  replicas[1]->state.set_live(false);
  EXPECT_FALSE(replicas[1]->state.live());
}

// sync_agreed: the transfer alone from the root the caller names, even one
// that is neither live nor rank 0; the table's liveness plays no part.
TEST(ReplicaState, SyncAgreedMovesTheNamedRootsState) {
  auto groups = groups_of(3);
  auto replicas = make_replicas({4, 5, 6});
  replicas[0]->state.set_live(true);
  std::vector<SyncResult> results(3);
  run_threads(3, [&](int r) { results[r] = replicas[r]->state.sync_agreed(*groups[r], 2, false); });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(replicas[r]->holds(6)) << "rank " << r;
    EXPECT_EQ(results[r].root, 2);
    EXPECT_EQ(results[r].received, r != 2);
    EXPECT_FALSE(results[r].from_live);
    EXPECT_EQ(results[r].bytes, kReplicaBytes);
    EXPECT_TRUE(replicas[r]->state.live());
  }
  EXPECT_THROW(replicas[0]->state.sync_agreed(*groups[0], 3, true), InvalidArgument);
  EXPECT_THROW(replicas[0]->state.sync_agreed(*groups[0], -1, true), InvalidArgument);
}

TEST(ReplicaState, StagingAndInPlaceSizes) {
  ReplicaState state;
  EXPECT_EQ(state.staging_bytes(), std::size_t{64} << 20);
  EXPECT_EQ(state.in_place_bytes(), std::size_t{1} << 20);
  EXPECT_THROW(state.set_staging_bytes(0), InvalidArgument);
  EXPECT_THROW(state.set_staging_bytes(12), InvalidArgument);
  state.set_staging_bytes(16);
  EXPECT_EQ(state.staging_bytes(), 16u);
}

TEST(ReplicaState, AllLiveRankZeroWinsAndIsLeftUntouched) {
  auto groups = groups_of(3);
  auto replicas = make_replicas({1, 2, 3});
  run_threads(3, [&](int r) { replicas[r]->state.sync(*groups[r]); });
  for (int r = 0; r < 3; ++r) replicas[r]->fill(20 + r);
  const float* w0 = replicas[0]->w.data();
  std::vector<SyncResult> results(3);
  run_threads(3, [&](int r) { results[r] = replicas[r]->state.sync(*groups[r]); });
  EXPECT_EQ(replicas[0]->w.data(), w0);
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(replicas[r]->holds(20)) << "rank " << r;
    EXPECT_EQ(results[r].root, 0);
    EXPECT_EQ(results[r].received, r != 0);
  }
}

TEST(ReplicaState, GroupOfOneMovesNothing) {
  auto groups = groups_of(1);
  auto replicas = make_replicas({4});
  SyncResult result = replicas[0]->state.sync(*groups[0]);
  EXPECT_EQ(result.root, 0);
  EXPECT_FALSE(result.received);
  EXPECT_EQ(result.bytes, 0u);
  EXPECT_TRUE(replicas[0]->holds(4));
  EXPECT_TRUE(replicas[0]->state.live());
}

TEST(ReplicaState, AddRejectsBadRegistrations) {
  ReplicaState state;
  std::vector<float> v(4);
  std::int64_t counter = 0;
  state.add("v", Buffer::of(v));
  EXPECT_THROW(state.add("", Buffer::of(v)), InvalidArgument);
  EXPECT_THROW(state.add("v", &counter), InvalidArgument);  // duplicate name
  EXPECT_THROW(state.add("c", static_cast<std::int64_t*>(nullptr)), InvalidArgument);
  EXPECT_THROW(state.add("null", Buffer{nullptr, 3, DType::kFloat32, Device::cpu()}),
               InvalidArgument);
  EXPECT_EQ(state.size(), 1u);
  state.add("c", &counter);
  EXPECT_EQ(state.bytes(), 4 * 4 + 8u);
}

struct MismatchCase {
  std::string name;
  int odd_rank;
  // Registers the odd rank's state.
  void (*register_odd)(Replica&);
  std::string expected;  // part of every rank's message
};

void register_short_w(Replica& x) {
  x.state.add("w", Buffer::of(x.w.data(), 999));
  x.state.add("m", Buffer::of(x.m));
  x.state.add("flags", Buffer::of(x.flags));
  x.state.add("empty", Buffer::of(x.empty));
  x.state.add("step", &x.step);
  x.state.add("epoch", &x.epoch);
}
void register_float_m(Replica& x) {
  x.state.add("w", Buffer::of(x.w));
  x.state.add("m", Buffer{x.m.data(), x.m.size(), DType::kFloat32, Device::cpu()});
  x.state.add("flags", Buffer::of(x.flags));
  x.state.add("empty", Buffer::of(x.empty));
  x.state.add("step", &x.step);
  x.state.add("epoch", &x.epoch);
}
void register_renamed_w(Replica& x) {
  x.state.add("weights", Buffer::of(x.w));
  x.state.add("m", Buffer::of(x.m));
  x.state.add("flags", Buffer::of(x.flags));
  x.state.add("empty", Buffer::of(x.empty));
  x.state.add("step", &x.step);
  x.state.add("epoch", &x.epoch);
}
void register_extra(Replica& x) {
  x.register_all();
  static thread_local std::int64_t extra = 0;
  x.state.add("extra", &extra);
}
void register_without_epoch(Replica& x) {
  x.state.add("w", Buffer::of(x.w));
  x.state.add("m", Buffer::of(x.m));
  x.state.add("flags", Buffer::of(x.flags));
  x.state.add("empty", Buffer::of(x.empty));
  x.state.add("step", &x.step);
}

TEST(ReplicaState, DifferentRegistrationsThrowOnEveryRankAndMoveNothing) {
  const std::vector<MismatchCase> cases = {
      {"count", 2, register_short_w,
       "rank(s) 2 registered state that differs from rank 0's (the fresh start's rank 0): entry 0 "
       "is 'w' (float32 x 999, cpu) on rank 2 but 'w' (float32 x 1000, cpu) on rank 0"},
      {"dtype", 1, register_float_m,
       "entry 1 is 'm' (float32 x 37, cpu) on rank 1 but 'm' (float64 x 37, cpu) on rank 0"},
      {"name", 0, register_renamed_w,
       "rank(s) 1, 2 registered state that differs from rank 0's (the fresh start's rank 0): "
       "entry 0 is 'w' (float32 x 1000, cpu) on rank 1 but 'weights' (float32 x 1000, cpu) on "
       "rank 0; entry 0 is 'w' (float32 x 1000, cpu) on rank 2"},
      {"extra", 2, register_extra,
       "rank 2 registered 7 entries, rank 0 6: rank 2 has an extra entry 6 'extra' (counter)"},
      {"missing", 1, register_without_epoch,
       "rank 1 registered 5 entries, rank 0 6: rank 1 lacks entry 5 'epoch' (counter)"},
  };
  auto groups = groups_of(3);
  for (const auto& c : cases) {
    std::vector<std::unique_ptr<Replica>> replicas;
    for (int r = 0; r < 3; ++r) {
      replicas.push_back(std::make_unique<Replica>(r + 1));
      if (r == c.odd_rank) {
        c.register_odd(*replicas.back());
      } else {
        replicas.back()->register_all();
      }
    }
    std::vector<std::string> messages(3);
    run_threads(3, [&](int r) {
      try {
        replicas[r]->state.sync(*groups[r]);
      } catch (const InvalidArgument& e) {
        messages[r] = e.what();
      }
    });
    for (int r = 0; r < 3; ++r) {
      EXPECT_NE(messages[r].find(c.expected), std::string::npos)
          << c.name << ": rank " << r << " threw '" << messages[r] << "'";
      EXPECT_EQ(messages[r], messages[0]) << c.name << ": every rank says the same";
      EXPECT_TRUE(replicas[r]->holds(r + 1)) << c.name << ": rank " << r << " was written";
      EXPECT_FALSE(replicas[r]->state.live()) << c.name;
    }
  }
  // Every rank made the same collectives: the groups still agree.
  auto replicas = make_replicas({9, 8, 7});
  run_threads(3, [&](int r) { replicas[r]->state.sync(*groups[r]); });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(replicas[r]->holds(9));
}

TEST(ReplicaState, MismatchIsMeasuredAgainstTheLiveRoot) {
  auto groups = groups_of(3);
  auto replicas = make_replicas({1, 2, 3});
  run_threads(3, [&](int r) { replicas[r]->state.sync(*groups[r]); });
  // A newcomer at rank 0 whose program registers one entry fewer.
  auto newcomer = std::make_unique<Replica>(-1);
  register_without_epoch(*newcomer);
  std::vector<Replica*> world = {newcomer.get(), replicas[1].get(), replicas[2].get()};
  for (int r = 1; r < 3; ++r) world[r]->fill(5);
  std::vector<std::string> messages(3);
  run_threads(3, [&](int r) {
    try {
      world[r]->state.sync(*groups[r]);
    } catch (const InvalidArgument& e) {
      messages[r] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(messages[r].find("rank(s) 0 registered state that differs from rank 1's (the lowest "
                               "live rank): rank 0 registered 5 entries, rank 1 6: rank 0 lacks "
                               "entry 5 'epoch' (counter)"),
              std::string::npos)
        << "rank " << r << ": " << messages[r];
  }
  EXPECT_TRUE(world[0]->holds(-1));
  EXPECT_FALSE(world[0]->state.live());
  EXPECT_TRUE(world[1]->state.live());
  EXPECT_TRUE(world[2]->state.live());
}

}  // namespace
}  // namespace ddp::test

namespace ddp::test {
namespace {

// The transfer runs through all-reduces in which the receivers add negative
// zeros: every bit of the root's values must arrive, negative zeros, NaNs,
// infinities and the half types' odd values included, in every algorithm.
TEST(ReplicaState, EveryBitOfTheRootsValuesArrives) {
  for (auto algorithm : {AllreduceAlgorithm::kSharedMemory, AllreduceAlgorithm::kRing,
                         AllreduceAlgorithm::kDirect}) {
    GlooOptions options;
    options.allreduce_algorithm = algorithm;
    options.shared_memory = algorithm == AllreduceAlgorithm::kSharedMemory;
    auto groups = make_groups(3, std::make_shared<MemoryStore>(), options);
    struct Bits {
      std::vector<std::uint32_t> f32;
      std::vector<std::uint64_t> f64;
      std::vector<std::uint16_t> f16, bf16;
      std::vector<std::int32_t> i32;
    };
    auto pattern = [](bool root) {
      Bits b;
      b.f32 = {0x80000000u, 0x7fc00001u, 0xff800000u, 0x00000001u, 0x3f800000u};
      b.f64 = {0x8000000000000000ull, 0x7ff8000000000001ull, 0xc000000000000000ull};
      b.f16 = {0x8000, 0x7c00, 0x0001, 0x3c00, 0xfbff};
      b.bf16 = {0x8000, 0x7f80, 0x0001, 0x3f80, 0xff7f};
      b.i32 = {-1, 0, 2147483647, -2147483647 - 1};
      if (!root) {  // something else entirely
        for (auto& x : b.f32) x = 0x12345678u;
        for (auto& x : b.f64) x = 0x1234567812345678ull;
        for (auto& x : b.f16) x = 0x1234;
        for (auto& x : b.bf16) x = 0x1234;
        for (auto& x : b.i32) x = 7;
      }
      return b;
    };
    std::vector<Bits> bits = {pattern(true), pattern(false), pattern(false)};
    run_threads(3, [&](int r) {
      Bits& b = bits[static_cast<std::size_t>(r)];
      ReplicaState state;
      state.add("f32", Buffer{b.f32.data(), b.f32.size(), DType::kFloat32, Device::cpu()});
      state.add("f64", Buffer{b.f64.data(), b.f64.size(), DType::kFloat64, Device::cpu()});
      state.add("f16", Buffer{b.f16.data(), b.f16.size(), DType::kFloat16, Device::cpu()});
      state.add("bf16", Buffer{b.bf16.data(), b.bf16.size(), DType::kBFloat16, Device::cpu()});
      state.add("i32", Buffer::of(b.i32));
      state.sync(*groups[static_cast<std::size_t>(r)]);
    });
    const Bits want = pattern(true);
    for (int r = 0; r < 3; ++r) {
      const Bits& got = bits[static_cast<std::size_t>(r)];
      EXPECT_EQ(got.f32, want.f32) << "rank " << r << ", " << to_string(algorithm);
      EXPECT_EQ(got.f64, want.f64) << "rank " << r << ", " << to_string(algorithm);
      EXPECT_EQ(got.f16, want.f16) << "rank " << r << ", " << to_string(algorithm);
      EXPECT_EQ(got.bf16, want.bf16) << "rank " << r << ", " << to_string(algorithm);
      EXPECT_EQ(got.i32, want.i32) << "rank " << r << ", " << to_string(algorithm);
    }
  }
}

}  // namespace
}  // namespace ddp::test

namespace ddp::test {
namespace {

// Buffers of every path of the transfer: at least 1 MiB in place (as int64,
// int32 and, unaligned, uint8 words), smaller ones and counters staged through
// a staging area far smaller than they are (many slices), odd sizes
// everywhere. The root's bytes are pseudo-random (NaN payloads, -0.0 and
// the rest); the others' differ. Every byte must arrive, over shared memory
// and over TCP.
TEST(ReplicaState, LargeSmallAndOddBuffersArriveByteForByte) {
  struct Memory {
    std::vector<double> f64 = std::vector<double>(200'000);  // 1.6 MB: int64 words
    std::vector<float> f32 = std::vector<float>(300'001);    // 1.2 MB: int32 words
    std::vector<std::uint8_t> raw = std::vector<std::uint8_t>((1 << 20) + 20);  // unaligned view
    std::vector<std::uint16_t> f16 = std::vector<std::uint16_t>(100'001);       // staged
    std::vector<std::uint8_t> u8 = std::vector<std::uint8_t>(77'777);           // staged
    std::vector<std::int32_t> i32 = std::vector<std::int32_t>(5);               // staged
    std::int64_t counter = 0;
  };
  auto fill = [](Memory& m, std::uint32_t seed) {
    std::uint32_t x = seed;
    auto next = [&x] { return x = x * 1664525u + 1013904223u; };
    auto bytes = [&](void* data, std::size_t n) {
      auto* p = static_cast<std::uint8_t*>(data);
      for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(next() >> 24);
    };
    bytes(m.f64.data(), m.f64.size() * 8);
    bytes(m.f32.data(), m.f32.size() * 4);
    bytes(m.raw.data(), m.raw.size());
    bytes(m.f16.data(), m.f16.size() * 2);
    bytes(m.u8.data(), m.u8.size());
    bytes(m.i32.data(), m.i32.size() * 4);
    m.counter = static_cast<std::int64_t>(next());
  };
  // Every buffer staged too (in_place_bytes above them all), as the torch
  // backend's checked groups have it.
  const std::vector<std::pair<AllreduceAlgorithm, std::size_t>> cases = {
      {AllreduceAlgorithm::kSharedMemory, 0},
      {AllreduceAlgorithm::kRing, 0},
      {AllreduceAlgorithm::kSharedMemory, std::size_t{16} << 20}};
  for (const auto& [algorithm, bytes] : cases) {
    const std::size_t in_place_bytes = bytes;  // a lambda may not capture a binding (clang 14)
    GlooOptions options;
    options.allreduce_algorithm = algorithm;
    options.shared_memory = algorithm == AllreduceAlgorithm::kSharedMemory;
    auto groups = make_groups(3, std::make_shared<MemoryStore>(), options);
    std::vector<Memory> memory(3);
    for (std::uint32_t r = 0; r < 3; ++r) fill(memory[r], 11 + r);
    Memory want;
    fill(want, 11);
    run_threads(3, [&](int r) {
      Memory& m = memory[static_cast<std::size_t>(r)];
      ReplicaState state;
      state.set_staging_bytes(96 * 1024);
      if (in_place_bytes > 0) state.set_in_place_bytes(in_place_bytes);
      state.add("f64", Buffer::of(m.f64));
      state.add("f32", Buffer::of(m.f32));
      state.add("raw", Buffer{m.raw.data() + 3, m.raw.size() - 3, DType::kUInt8, Device::cpu()});
      state.add("f16", Buffer{m.f16.data(), m.f16.size(), DType::kFloat16, Device::cpu()});
      state.add("u8", Buffer::of(m.u8));
      state.add("i32", Buffer::of(m.i32));
      state.add("counter", &m.counter);
      state.sync(*groups[static_cast<std::size_t>(r)]);
    });
    for (int r = 0; r < 3; ++r) {
      const Memory& got = memory[static_cast<std::size_t>(r)];
      const std::string where = "rank " + std::to_string(r) + ", " + to_string(algorithm) +
                                ", in place from " + std::to_string(in_place_bytes);
      EXPECT_EQ(std::memcmp(got.f64.data(), want.f64.data(), want.f64.size() * 8), 0) << where;
      EXPECT_EQ(std::memcmp(got.f32.data(), want.f32.data(), want.f32.size() * 4), 0) << where;
      EXPECT_TRUE(std::equal(got.raw.begin() + 3, got.raw.end(), want.raw.begin() + 3)) << where;
      EXPECT_EQ(got.f16, want.f16) << where;
      EXPECT_EQ(got.u8, want.u8) << where;
      EXPECT_EQ(got.i32, want.i32) << where;
      EXPECT_EQ(got.counter, want.counter) << where;
    }
    // The bytes before the unaligned view are its owner's: left as they were.
    Memory rank1;
    fill(rank1, 12);
    EXPECT_TRUE(std::equal(memory[1].raw.begin(), memory[1].raw.begin() + 3, rank1.raw.begin()));
  }
}

}  // namespace
}  // namespace ddp::test
