// The bulk 16-bit conversions (worker_lib/src/half_convert.h) against the scalar
// reference in ddp/worker/half.h, bit for bit: every binary16/bfloat16 value
// widened, and floats across the whole range (subnormals, rounding ties,
// overflow, infinities) narrowed, at lengths that exercise the vector tails.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ddp/worker/half.h"
#include "half_convert.h"

namespace ddp::test {
namespace {

template <typename T16>
void expect_widen_matches(DType dtype) {
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  std::vector<float> out(all.size());
  detail::floats_from_16(dtype, all.data(), out.data(), all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    const float expected = T16::to_float(all[i]);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(out[i])) << std::hex << i;
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(out[i]), std::bit_cast<std::uint32_t>(expected))
          << std::hex << i;
    }
  }
}

std::vector<float> interesting_floats() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          65519.9f,
                          65520.0f,
                          1e30f,
                          -1e30f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          6.0e-8f,
                          5.9e-8f,
                          2.98e-8f,
                          3.0e-8f,
                          6.1e-5f,
                          6.2e-5f,
                          1e-40f,
                          std::numeric_limits<float>::quiet_NaN()};
  // Every rounding boundary of the 16-bit formats: floats with each low-bit pattern.
  for (std::uint32_t e = 100; e < 150; ++e) {
    for (std::uint32_t low :
         {0x0u, 0xfffu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7fffu, 0x8000u, 0x8001u, 0x18000u}) {
      v.push_back(std::bit_cast<float>((e << 23) | low));
      v.push_back(std::bit_cast<float>(0x80000000u | (e << 23) | low));
    }
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 100000; ++i) {
    const float f = std::bit_cast<float>(bits(rng));
    if (!std::isnan(f)) v.push_back(f);
  }
  return v;
}

template <typename T16>
void expect_narrow_matches(DType dtype, float factor) {
  const auto input = interesting_floats();
  for (std::size_t n :
       {std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{9}, input.size()}) {
    std::vector<std::uint16_t> out(n);
    detail::floats_to_16(dtype, input.data(), out.data(), n, factor);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t expected = T16::from_float(input[i] * factor);
      if (std::isnan(input[i] * factor)) {
        ASSERT_TRUE(std::isnan(T16::to_float(out[i]))) << i;
      } else {
        ASSERT_EQ(out[i], expected) << "input " << input[i] << " factor " << factor << " at " << i;
      }
    }
  }
}

TEST(HalfConvert, WideningEveryBinary16ValueMatchesTheScalarReference) {
  expect_widen_matches<Half>(DType::kFloat16);
}
TEST(HalfConvert, WideningEveryBFloat16ValueMatchesTheScalarReference) {
  expect_widen_matches<BFloat16>(DType::kBFloat16);
}
TEST(HalfConvert, NarrowingToBinary16MatchesTheScalarReference) {
  expect_narrow_matches<Half>(DType::kFloat16, 1.0f);
  expect_narrow_matches<Half>(DType::kFloat16, 0.5f);
}
TEST(HalfConvert, NarrowingToBFloat16MatchesTheScalarReference) {
  expect_narrow_matches<BFloat16>(DType::kBFloat16, 1.0f);
  expect_narrow_matches<BFloat16>(DType::kBFloat16, 0.25f);
}

}  // namespace
}  // namespace ddp::test
