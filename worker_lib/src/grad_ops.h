// Element-wise helpers over CPU Buffers of floating dtypes, shared by the
// Reducer and the comm hooks. Internal.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ddp/worker/half.h"
#include "ddp/worker/process_group.h"
#include "half_convert.h"

namespace ddp::grad_ops {

inline bool is_floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16;
}

inline void zero(const Buffer& b) {
  if (b.count != 0) std::memset(b.data, 0, b.nbytes());
}

// dst and src have the same dtype and count.
inline void copy(const Buffer& dst, const Buffer& src) {
  if (dst.count != 0 && dst.data != src.data) std::memcpy(dst.data, src.data, dst.nbytes());
}

template <typename T16>
constexpr DType dtype_of() {
  return std::is_same_v<T16, Half> ? DType::kFloat16 : DType::kBFloat16;
}

// Block size of the widen-compute-narrow loops over 16-bit buffers.
constexpr std::size_t kBlock = 256;

template <typename T16>
void scale_16(std::uint16_t* p, std::size_t n, float factor) {
  float f[kBlock];
  for (std::size_t i = 0; i < n; i += kBlock) {
    const std::size_t m = std::min(kBlock, n - i);
    detail::floats_from_16(dtype_of<T16>(), p + i, f, m);
    detail::floats_to_16(dtype_of<T16>(), f, p + i, m, factor);
  }
}

// b *= factor, element-wise.
inline void scale(const Buffer& b, double factor) {
  switch (b.dtype) {
    case DType::kFloat32: {
      auto* p = static_cast<float*>(b.data);
      const auto f = static_cast<float>(factor);
      for (std::size_t i = 0; i < b.count; ++i) p[i] *= f;
      break;
    }
    case DType::kFloat64: {
      auto* p = static_cast<double*>(b.data);
      for (std::size_t i = 0; i < b.count; ++i) p[i] *= factor;
      break;
    }
    case DType::kFloat16:
      scale_16<Half>(static_cast<std::uint16_t*>(b.data), b.count, static_cast<float>(factor));
      break;
    case DType::kBFloat16:
      scale_16<BFloat16>(static_cast<std::uint16_t*>(b.data), b.count, static_cast<float>(factor));
      break;
    default:
      break;  // callers only pass floating dtypes
  }
}

// dst[i] = T16(src[i] * factor) for a float32 or float64 source.
template <typename T16>
void compress(const Buffer& src, std::uint16_t* dst, float factor) {
  if (src.dtype == DType::kFloat32) {
    detail::floats_to_16(dtype_of<T16>(), static_cast<const float*>(src.data), dst, src.count,
                         factor);
  } else {
    const auto* p = static_cast<const double*>(src.data);
    for (std::size_t i = 0; i < src.count; ++i)
      dst[i] = T16::from_float(static_cast<float>(p[i] * factor));
  }
}

// dst[i] = float(src[i]) into a float32 or float64 destination.
template <typename T16>
void decompress(const std::uint16_t* src, const Buffer& dst) {
  if (dst.dtype == DType::kFloat32) {
    detail::floats_from_16(dtype_of<T16>(), src, static_cast<float*>(dst.data), dst.count);
  } else {
    auto* p = static_cast<double*>(dst.data);
    for (std::size_t i = 0; i < dst.count; ++i) p[i] = T16::to_float(src[i]);
  }
}

}  // namespace ddp::grad_ops
