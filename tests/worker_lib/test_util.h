// Helpers for multi-rank tests: ranks as threads over one in-process store.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/store/memory_store.h"
#include "ddp/store/prefix_store.h"
#include "ddp/worker/half.h"
#include "ddp/worker/process_group.h"
#include "ddp/worker/process_group_gloo.h"

namespace ddp::test {

// Runs fn(rank) on `n` threads; rethrows the first exception after all joined.
inline void run_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::exception_ptr first;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// Creates a Gloo group per rank (in parallel, as real ranks do) over `store`.
inline std::vector<std::shared_ptr<ProcessGroup>> make_groups(int n, std::shared_ptr<Store> store,
                                                              GlooOptions options = {}) {
  if (options.hostname.empty() && options.iface.empty()) options.hostname = "127.0.0.1";
  std::vector<std::shared_ptr<ProcessGroup>> groups(n);
  run_threads(n, [&](int r) { groups[r] = make_gloo_process_group(store, r, n, options); });
  return groups;
}

// A typed buffer whose elements are set and read as doubles.
struct TypedBuffer {
  DType dtype;
  std::vector<std::uint8_t> bytes;

  TypedBuffer(DType dtype, std::size_t count) : dtype(dtype), bytes(count * element_size(dtype)) {}
  std::size_t count() const { return bytes.size() / element_size(dtype); }
  Buffer view() { return Buffer{bytes.data(), count(), dtype, Device::cpu()}; }

  void set(std::size_t i, double v) {
    void* p = bytes.data() + i * element_size(dtype);
    switch (dtype) {
      case DType::kFloat32: {
        float x = static_cast<float>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::kFloat64:
        std::memcpy(p, &v, 8);
        break;
      case DType::kFloat16: {
        auto x = Half::from_float(static_cast<float>(v));
        std::memcpy(p, &x, 2);
        break;
      }
      case DType::kBFloat16: {
        auto x = BFloat16::from_float(static_cast<float>(v));
        std::memcpy(p, &x, 2);
        break;
      }
      case DType::kInt32: {
        auto x = static_cast<std::int32_t>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::kInt64: {
        auto x = static_cast<std::int64_t>(v);
        std::memcpy(p, &x, 8);
        break;
      }
      case DType::kUInt8: {
        auto x = static_cast<std::uint8_t>(static_cast<std::int64_t>(v));
        std::memcpy(p, &x, 1);
        break;
      }
      case DType::kInt8: {
        auto x = static_cast<std::int8_t>(static_cast<std::int64_t>(v));
        std::memcpy(p, &x, 1);
        break;
      }
      case DType::kBool: {
        std::uint8_t x = v != 0 ? 1 : 0;
        std::memcpy(p, &x, 1);
        break;
      }
    }
  }
  double get(std::size_t i) const {
    const void* p = bytes.data() + i * element_size(dtype);
    switch (dtype) {
      case DType::kFloat32: {
        float x;
        std::memcpy(&x, p, 4);
        return x;
      }
      case DType::kFloat64: {
        double x;
        std::memcpy(&x, p, 8);
        return x;
      }
      case DType::kFloat16: {
        std::uint16_t x;
        std::memcpy(&x, p, 2);
        return Half::to_float(x);
      }
      case DType::kBFloat16: {
        std::uint16_t x;
        std::memcpy(&x, p, 2);
        return BFloat16::to_float(x);
      }
      case DType::kInt32: {
        std::int32_t x;
        std::memcpy(&x, p, 4);
        return x;
      }
      case DType::kInt64: {
        std::int64_t x;
        std::memcpy(&x, p, 8);
        return static_cast<double>(x);
      }
      case DType::kUInt8:
      case DType::kBool: {
        std::uint8_t x;
        std::memcpy(&x, p, 1);
        return x;
      }
      case DType::kInt8: {
        std::int8_t x;
        std::memcpy(&x, p, 1);
        return x;
      }
    }
    return NAN;
  }
};

inline const std::vector<DType>& all_dtypes() {
  // Every dtype but kBool, whose reductions are logical (gloo_bitwise_bool_test).
  static const std::vector<DType> kAll = {DType::kFloat32,  DType::kFloat64, DType::kFloat16,
                                          DType::kBFloat16, DType::kInt32,   DType::kInt64,
                                          DType::kUInt8,    DType::kInt8};
  return kAll;
}
inline const std::vector<ReduceOp>& all_ops() {
  static const std::vector<ReduceOp> kAll = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kProduct};
  return kAll;
}

inline bool is_signed(DType d) { return d != DType::kUInt8; }
inline bool is_integral(DType d) {
  return d == DType::kInt32 || d == DType::kInt64 || d == DType::kUInt8 || d == DType::kInt8;
}

// `a op b` as the references compute it, in doubles (exact for the small
// integers the tests use): kAvg gives the sum; the bitwise ops act on integers.
inline double combine(ReduceOp op, double a, double b) {
  const auto ia = static_cast<std::int64_t>(a);
  const auto ib = static_cast<std::int64_t>(b);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kBand:
      return static_cast<double>(ia & ib);
    case ReduceOp::kBor:
      return static_cast<double>(ia | ib);
    case ReduceOp::kBxor:
      return static_cast<double>(ia ^ ib);
  }
  return NAN;
}

// The text of the error `work` failed with, or "" when it succeeded.
inline std::string error_text(const WorkPtr& work) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Input of `rank` at element i for `op`: small integers so that every dtype
// represents every partial result exactly, whatever order the backend reduces in.
inline double input_value(ReduceOp op, DType dtype, int rank, std::size_t i) {
  auto k = static_cast<int>((static_cast<std::size_t>(rank) * 7 + i * 3) % 11);
  if (op == ReduceOp::kProduct) return 1 + k % 3;  // 1..3: product of 4 ranks <= 81
  if (op == ReduceOp::kMin || op == ReduceOp::kMax) {
    return is_signed(dtype) ? k - 5 : k;  // negatives where the dtype has them
  }
  return k + 1;  // 1..11: sum of 4 ranks <= 44
}

// The reference result at element i, computed here independently of the library.
inline double expected_value(ReduceOp op, DType dtype, int world, std::size_t i) {
  double acc = input_value(op, dtype, 0, i);
  for (int r = 1; r < world; ++r) acc = combine(op, acc, input_value(op, dtype, r, i));
  if (op != ReduceOp::kAvg) return acc;
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<float>(acc) / static_cast<float>(world);
    case DType::kFloat64:
      return acc / world;
    case DType::kFloat16:
      return Half::to_float(Half::from_float(static_cast<float>(acc) / static_cast<float>(world)));
    case DType::kBFloat16:
      return BFloat16::to_float(
          BFloat16::from_float(static_cast<float>(acc) / static_cast<float>(world)));
    default:
      return std::trunc(acc / world);
  }
}

}  // namespace ddp::test
