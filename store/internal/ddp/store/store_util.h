// Semantics shared by every store that holds the data itself (MemoryStore and
// the server's handler), so that add, compare_set and the error texts are
// defined once.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::store_util {

// `current` (nullptr for a missing key) plus `delta`; throws InvalidArgument
// naming `origin` and the key when `current` is not a decimal integer.
std::int64_t add_to_decimal(const std::string* current, std::int64_t delta,
                            const std::string& origin, const std::string& key);

// c10d compare_set on `data` at `it` (data.end() for a missing key); returns
// the value after the call.
template <typename Map>
std::string compare_set(Map& data, typename Map::iterator it, const std::string& key,
                        const std::string& expected, const std::string& desired) {
  if (it == data.end()) {
    if (!expected.empty()) return expected;
    data.emplace(key, desired);
    return desired;
  }
  if (it->second == expected) it->second = desired;
  return it->second;
}

// Throws InvalidArgument when the sizes differ.
void check_multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values,
                     const std::string& origin);

// "timed out after 1.500 s waiting for key(s): a, b". Names at most
// kNamedMissingKeys keys, each cut after kNamedKeyBytes bytes, then "(and N
// more)": a request may wait for thousands of keys, and the message must stay
// small whatever it waited for.
inline constexpr std::size_t kNamedMissingKeys = 16;
inline constexpr std::size_t kNamedKeyBytes = 256;
std::string timeout_message(const std::vector<std::string_view>& missing,
                            std::chrono::milliseconds timeout);
std::string timeout_message(const std::vector<std::string>& missing,
                            std::chrono::milliseconds timeout);

}  // namespace ddp::store_util
