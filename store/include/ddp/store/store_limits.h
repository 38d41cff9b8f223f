// The built-in store's size limits: the defaults of the server's options
// (StoreServerOptions), of its request handler and of the wire codec's
// limits, which a client learns from the server's hello reply
// (store/PROTOCOL.md, "Limits"). Defined once, here.
#pragma once

#include <cstdint>

namespace ddp::store_limits {

// The largest key, in bytes.
inline constexpr std::uint32_t kMaxKeySize = 64 * 1024;
// The largest value, in bytes (also what append may grow a value to).
inline constexpr std::uint32_t kMaxValueSize = 256 * 1024 * 1024;
// The largest frame, in bytes, either way (so also the largest reply).
inline constexpr std::uint32_t kMaxFrameSize = 512 * 1024 * 1024;
// Keys plus values (plus the handler's per-key overhead) the store holds in all.
inline constexpr std::uint64_t kMaxStoreBytes = 1ull << 30;

}  // namespace ddp::store_limits
