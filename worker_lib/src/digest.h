// A 64-bit FNV-1a digest of a list of integers (each taken as its 8 bytes,
// least significant first): what ranks compare to tell whether their lists
// (parameter shapes, registrations) agree without sending the lists.
// Pure; never throws.
#pragma once

#include <cstdint>
#include <vector>

namespace ddp::detail {

inline std::int64_t fnv1a(const std::vector<std::int64_t>& values) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a's 64-bit offset basis
  for (auto v : values) {
    const auto u = static_cast<std::uint64_t>(v);
    for (int b = 0; b < 8; ++b) {
      h ^= (u >> (8 * b)) & 0xffu;
      h *= 1099511628211ull;  // and its prime
    }
  }
  return static_cast<std::int64_t>(h);
}

}  // namespace ddp::detail
