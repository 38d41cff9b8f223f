// Bulk conversions between float and the 16-bit float formats (ddp/worker/half.h),
// for the 16-bit reductions and the fp16/bf16 comm hooks. Results are bit-equal
// to Half/BFloat16::from_float and to_float element by element (round to nearest
// even), except for NaN payloads: a NaN stays a NaN, but with F16C it keeps its
// payload's top bits where the scalar code makes the canonical quiet NaN.
// binary16 uses the CPU's F16C instructions when it has
// them (checked once at run time), bfloat16 is plain integer code the compiler
// vectorizes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddp/worker/process_group.h"

namespace ddp::detail {

// dst[i] = to16(src[i] * factor); dtype is kFloat16 or kBFloat16.
void floats_to_16(DType dtype, const float* src, std::uint16_t* dst, std::size_t n,
                  float factor = 1.0f);
// dst[i] = float(src[i]); dtype is kFloat16 or kBFloat16.
void floats_from_16(DType dtype, const std::uint16_t* src, float* dst, std::size_t n);

}  // namespace ddp::detail
