// 16-bit floating point storage types: IEEE 754 binary16 (Half) and bfloat16
// (BFloat16). Conversions to and from float round to nearest even; NaN stays
// NaN and overflow goes to infinity. Arithmetic happens in float.
#pragma once

#include <bit>
#include <cstdint>

namespace ddp {

struct Half {
  std::uint16_t bits = 0;

  Half() = default;
  explicit Half(float value) : bits(from_float(value)) {}
  explicit operator float() const { return to_float(bits); }

  static std::uint16_t from_float(float value) {
    std::uint32_t f = std::bit_cast<std::uint32_t>(value);
    std::uint32_t sign = (f >> 16) & 0x8000u;
    std::uint32_t abs = f & 0x7fffffffu;
    if (abs >= 0x7f800000u) {  // inf or NaN
      return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    }
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow
    if (abs < 0x38800000u) {  // subnormal half (or zero): value * 2^24 rounded to integer
      float magnitude = std::bit_cast<float>(abs);
      // Adding 0.5f (2^-1) aligns the mantissa so the FPU rounds to nearest even.
      float shifted = magnitude + 0.5f;
      std::uint32_t r = std::bit_cast<std::uint32_t>(shifted) - 0x3f000000u;
      return static_cast<std::uint16_t>(sign | r);
    }
    std::uint32_t mantissa_odd = (abs >> 13) & 1u;
    abs += 0xc8000fffu + mantissa_odd;  // rebias exponent (-112 << 23) and round to nearest even
    return static_cast<std::uint16_t>(sign | (abs >> 13));
  }

  static float to_float(std::uint16_t h) {
    std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    std::uint32_t exponent = (h >> 10) & 0x1fu;
    std::uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1f) {
      return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
    }
    if (exponent == 0) {
      // subnormal or zero: mantissa * 2^-24
      float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
      return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
    }
    return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }
};

struct BFloat16 {
  std::uint16_t bits = 0;

  BFloat16() = default;
  explicit BFloat16(float value) : bits(from_float(value)) {}
  explicit operator float() const { return to_float(bits); }

  static std::uint16_t from_float(float value) {
    std::uint32_t f = std::bit_cast<std::uint32_t>(value);
    if ((f & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((f >> 16) | 0x40u);
    f += 0x7fffu + ((f >> 16) & 1u);  // round to nearest even
    return static_cast<std::uint16_t>(f >> 16);
  }

  static float to_float(std::uint16_t b) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
  }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

}  // namespace ddp
