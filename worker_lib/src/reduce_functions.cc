#include "reduce_functions.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <fmt/format.h>

#include "ddp/common/error.h"
#include "half_convert.h"

namespace ddp::detail {

namespace {

struct Sum {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(a + b);
  }
};
struct Prod {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(a * b);
  }
};
struct Min {
  template <typename T>
  static T apply(T a, T b) {
    return std::min(a, b);
  }
};
struct Max {
  template <typename T>
  static T apply(T a, T b) {
    return std::max(a, b);
  }
};

struct Band {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(a & b);
  }
};
struct Bor {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(a | b);
  }
};
struct Bxor {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(a ^ b);
  }
};

template <typename T, typename Op>
void kernel(void* out_, const void* a_, const void* b_, std::size_t n) {
  auto* out = static_cast<T*>(out_);
  const auto* a = static_cast<const T*>(a_);
  const auto* b = static_cast<const T*>(b_);
  for (std::size_t i = 0; i < n; ++i) out[i] = Op::apply(a[i], b[i]);
}

// 16-bit floats reduce in float and round once, like PyTorch's CPU kernels:
// blocks are widened, combined in float and narrowed (half_convert.h).
template <DType kDtype, typename Op>
void kernel16(void* out_, const void* a_, const void* b_, std::size_t n) {
  auto* out = static_cast<std::uint16_t*>(out_);
  const auto* a = static_cast<const std::uint16_t*>(a_);
  const auto* b = static_cast<const std::uint16_t*>(b_);
  constexpr std::size_t kBlock = 256;
  float fa[kBlock];
  float fb[kBlock];
  for (std::size_t i = 0; i < n; i += kBlock) {
    const std::size_t m = std::min(kBlock, n - i);
    floats_from_16(kDtype, a + i, fa, m);
    floats_from_16(kDtype, b + i, fb, m);
    for (std::size_t j = 0; j < m; ++j) fa[j] = Op::apply(fa[j], fb[j]);
    floats_to_16(kDtype, fa, out + i, m);  // out may alias a or b: block i is fully read
  }
}

template <typename Op>
ReduceFn for_dtype(DType dtype) {
  switch (dtype) {
    case DType::kInt8:
      return &kernel<std::int8_t, Op>;
    case DType::kBool:
      return &kernel<std::uint8_t, Op>;  // min/max on 0/1 (also and/or/xor)
    case DType::kFloat32:
      return &kernel<float, Op>;
    case DType::kFloat64:
      return &kernel<double, Op>;
    case DType::kInt32:
      return &kernel<std::int32_t, Op>;
    case DType::kInt64:
      return &kernel<std::int64_t, Op>;
    case DType::kUInt8:
      return &kernel<std::uint8_t, Op>;
    case DType::kFloat16:
      return &kernel16<DType::kFloat16, Op>;
    case DType::kBFloat16:
      return &kernel16<DType::kBFloat16, Op>;
  }
  throw InvalidArgument("reduce_function",
                        fmt::format("unknown dtype {}", static_cast<int>(dtype)));
}

// Integer SUM/PRODUCT wrap (as in PyTorch); computed in unsigned arithmetic so
// overflow is defined behaviour.
template <typename T>
void wrap_sum(void* out_, const void* a_, const void* b_, std::size_t n) {
  using U = std::make_unsigned_t<T>;
  auto* out = static_cast<T*>(out_);
  const auto* a = static_cast<const T*>(a_);
  const auto* b = static_cast<const T*>(b_);
  for (std::size_t i = 0; i < n; ++i)
    out[i] = static_cast<T>(static_cast<U>(a[i]) + static_cast<U>(b[i]));
}
template <typename T>
void wrap_prod(void* out_, const void* a_, const void* b_, std::size_t n) {
  using U = std::make_unsigned_t<T>;
  auto* out = static_cast<T*>(out_);
  const auto* a = static_cast<const T*>(a_);
  const auto* b = static_cast<const T*>(b_);
  for (std::size_t i = 0; i < n; ++i) {
    // uint8 promotes to int; widen to a type where the product cannot overflow int.
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    out[i] = static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a[i])) *
                                           static_cast<W>(static_cast<U>(b[i]))));
  }
}

// The integer kernels of the bitwise ops (bool included: 0/1 stay 0/1).
template <typename Op>
ReduceFn bitwise_for_dtype(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kInt32:
      return &kernel<std::int32_t, Op>;
    case DType::kInt64:
      return &kernel<std::int64_t, Op>;
    case DType::kUInt8:
    case DType::kBool:
      return &kernel<std::uint8_t, Op>;
    case DType::kInt8:
      return &kernel<std::int8_t, Op>;
    default:
      throw InvalidArgument("reduce_function",
                            fmt::format("reduce op {} takes integer or bool buffers, not {}",
                                        to_string(op), to_string(dtype)));
  }
}

// torch's bool semantics: sum is logical or, product logical and (min and max
// are the same on 0/1); the average has no meaning.
ReduceFn bool_function(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kBor:
      return &kernel<std::uint8_t, Bor>;
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kBand:
      return &kernel<std::uint8_t, Band>;
    case ReduceOp::kBxor:
      return &kernel<std::uint8_t, Bxor>;
    case ReduceOp::kAvg:
      break;
  }
  throw InvalidArgument("reduce_function",
                        fmt::format("reduce op {} is not defined for bool", to_string(op)));
}

}  // namespace

ReduceFn reduce_function(DType dtype, ReduceOp op) {
  if (dtype == DType::kBool) return bool_function(op);
  const bool integral = dtype == DType::kInt32 || dtype == DType::kInt64 ||
                        dtype == DType::kUInt8 || dtype == DType::kInt8;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      if (integral) {
        if (dtype == DType::kInt32) return &wrap_sum<std::int32_t>;
        if (dtype == DType::kInt64) return &wrap_sum<std::int64_t>;
        if (dtype == DType::kInt8) return &wrap_sum<std::int8_t>;
        return &wrap_sum<std::uint8_t>;
      }
      return for_dtype<Sum>(dtype);
    case ReduceOp::kProduct:
      if (integral) {
        if (dtype == DType::kInt32) return &wrap_prod<std::int32_t>;
        if (dtype == DType::kInt64) return &wrap_prod<std::int64_t>;
        if (dtype == DType::kInt8) return &wrap_prod<std::int8_t>;
        return &wrap_prod<std::uint8_t>;
      }
      return for_dtype<Prod>(dtype);
    case ReduceOp::kMin:
      return for_dtype<Min>(dtype);
    case ReduceOp::kMax:
      return for_dtype<Max>(dtype);
    case ReduceOp::kBand:
      return bitwise_for_dtype<Band>(dtype, op);
    case ReduceOp::kBor:
      return bitwise_for_dtype<Bor>(dtype, op);
    case ReduceOp::kBxor:
      return bitwise_for_dtype<Bxor>(dtype, op);
  }
  throw InvalidArgument("reduce_function",
                        fmt::format("unknown reduce op {}", static_cast<int>(op)));
}

namespace {
template <typename T>
void divide(void* data_, std::size_t n, int divisor) {
  auto* data = static_cast<T*>(data_);
  for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<T>(data[i] / static_cast<T>(divisor));
}
template <typename T>
void divide_copy(void* data_, void* copy_, std::size_t n, int divisor) {
  auto* data = static_cast<T*>(data_);
  auto* copy = static_cast<T*>(copy_);
  for (std::size_t i = 0; i < n; ++i) {
    const T v = static_cast<T>(data[i] / static_cast<T>(divisor));
    data[i] = v;
    copy[i] = v;
  }
}
void divide16(DType dtype, void* data_, std::size_t n, int divisor) {
  auto* data = static_cast<std::uint16_t*>(data_);
  constexpr std::size_t kBlock = 256;
  float f[kBlock];
  for (std::size_t i = 0; i < n; i += kBlock) {
    const std::size_t m = std::min(kBlock, n - i);
    floats_from_16(dtype, data + i, f, m);
    for (std::size_t j = 0; j < m; ++j) f[j] /= static_cast<float>(divisor);
    floats_to_16(dtype, f, data + i, m);
  }
}
}  // namespace

void divide_by(void* data, std::size_t count, DType dtype, int divisor) {
  switch (dtype) {
    case DType::kFloat32:
      return divide<float>(data, count, divisor);
    case DType::kFloat64:
      return divide<double>(data, count, divisor);
    case DType::kInt32:
      return divide<std::int32_t>(data, count, divisor);
    case DType::kInt64:
      return divide<std::int64_t>(data, count, divisor);
    case DType::kUInt8:
    case DType::kBool:  // not reached: bool has no average
      return divide<std::uint8_t>(data, count, divisor);
    case DType::kInt8:
      return divide<std::int8_t>(data, count, divisor);
    case DType::kFloat16:
    case DType::kBFloat16:
      return divide16(dtype, data, count, divisor);
  }
}

void divide_and_copy(void* data, void* copy, std::size_t count, DType dtype, int divisor) {
  switch (dtype) {
    case DType::kFloat32:
      return divide_copy<float>(data, copy, count, divisor);
    case DType::kFloat64:
      return divide_copy<double>(data, copy, count, divisor);
    default:
      divide_by(data, count, dtype, divisor);
      std::memcpy(copy, data, count * element_size(dtype));
      return;
  }
}

}  // namespace ddp::detail
