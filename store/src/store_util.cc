#include "ddp/store/store_util.h"

#include <charconv>

#include <fmt/format.h>

#include "ddp/common/error.h"

namespace ddp::store_util {

std::int64_t add_to_decimal(const std::string* current, std::int64_t delta,
                            const std::string& origin, const std::string& key) {
  std::int64_t value = 0;
  if (current != nullptr) {
    const char* end = current->data() + current->size();
    auto [ptr, ec] = std::from_chars(current->data(), end, value);
    if (current->empty() || ec != std::errc() || ptr != end) {
      throw InvalidArgument(origin,
                            fmt::format("key '{}' holds a value that is not an integer", key));
    }
  }
  std::int64_t result = 0;
  if (__builtin_add_overflow(value, delta, &result)) {
    throw InvalidArgument(origin, fmt::format("add on key '{}' overflows int64", key));
  }
  return result;
}

void check_multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values,
                     const std::string& origin) {
  if (keys.size() != values.size()) {
    throw InvalidArgument(origin, fmt::format("{} keys but {} values", keys.size(), values.size()));
  }
}

std::string timeout_message(const std::vector<std::string_view>& missing,
                            std::chrono::milliseconds timeout) {
  std::string named;
  for (std::size_t i = 0; i < missing.size() && i < kNamedMissingKeys; ++i) {
    if (i > 0) named += ", ";
    std::string_view key = missing[i];
    named.append(key.substr(0, kNamedKeyBytes));
    if (key.size() > kNamedKeyBytes) named += "...";
  }
  if (missing.size() > kNamedMissingKeys) {
    named += fmt::format(" (and {} more)", missing.size() - kNamedMissingKeys);
  }
  return fmt::format("timed out after {:.3f} s waiting for key(s): {}",
                     static_cast<double>(timeout.count()) / 1000.0, named);
}

std::string timeout_message(const std::vector<std::string>& missing,
                            std::chrono::milliseconds timeout) {
  return timeout_message(std::vector<std::string_view>(missing.begin(), missing.end()), timeout);
}

}  // namespace ddp::store_util
