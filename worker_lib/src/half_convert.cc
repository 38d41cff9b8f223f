#include "half_convert.h"

#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "ddp/worker/half.h"

namespace ddp::detail {

namespace {

void half_from_floats_scalar(const float* src, std::uint16_t* dst, std::size_t n, float factor) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = Half::from_float(src[i] * factor);
}
void half_to_floats_scalar(const std::uint16_t* src, float* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = Half::to_float(src[i]);
}

#if defined(__x86_64__)
// vcvtps2ph with round-to-nearest-even gives the same bits as Half::from_float,
// including subnormals, overflow to infinity and quiet NaNs.
__attribute__((target("avx,f16c"))) void half_from_floats_f16c(const float* src, std::uint16_t* dst,
                                                               std::size_t n, float factor) {
  const __m256 f = _mm256_set1_ps(factor);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(src + i), f);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  half_from_floats_scalar(src + i, dst + i, n - i, factor);
}
__attribute__((target("avx,f16c"))) void half_to_floats_f16c(const std::uint16_t* src, float* dst,
                                                             std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  half_to_floats_scalar(src + i, dst + i, n - i);
}
// F16C from CPUID leaf 1 (clang has no "f16c" for __builtin_cpu_supports);
// "avx" also checks that the system saves the AVX registers.
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("avx") && cpu_has_f16c();
  return yes;
}
#endif

// BFloat16::from_float without the early return, so the loop vectorizes.
void bf16_from_floats(const float* src, std::uint16_t* dst, std::size_t n, float factor) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t f;
    const float v = src[i] * factor;
    std::memcpy(&f, &v, 4);
    const std::uint32_t rounded = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
    const std::uint32_t nan = (f >> 16) | 0x40u;
    dst[i] = static_cast<std::uint16_t>((f & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}
void bf16_to_floats(const std::uint16_t* src, float* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t f = static_cast<std::uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &f, 4);
  }
}

}  // namespace

void floats_to_16(DType dtype, const float* src, std::uint16_t* dst, std::size_t n, float factor) {
  if (dtype == DType::kBFloat16) return bf16_from_floats(src, dst, n, factor);
#if defined(__x86_64__)
  if (has_f16c()) return half_from_floats_f16c(src, dst, n, factor);
#endif
  half_from_floats_scalar(src, dst, n, factor);
}

void floats_from_16(DType dtype, const std::uint16_t* src, float* dst, std::size_t n) {
  if (dtype == DType::kBFloat16) return bf16_to_floats(src, dst, n);
#if defined(__x86_64__)
  if (has_f16c()) return half_to_floats_f16c(src, dst, n);
#endif
  half_to_floats_scalar(src, dst, n);
}

}  // namespace ddp::detail
