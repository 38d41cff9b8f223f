#include "ddp/common/text.h"

namespace ddp {

std::string printable(std::string_view text) {
  std::string shown(text);
  for (char& c : shown) {
    if (!is_printable(c)) c = '?';
  }
  return shown;
}

std::string seconds_text(std::chrono::milliseconds duration) {
  const auto ms = duration.count();
  const std::string sign = ms < 0 ? "-" : "";
  // Negated as unsigned: the most negative count has no positive counterpart.
  const auto magnitude =
      ms < 0 ? 0 - static_cast<unsigned long long>(ms) : static_cast<unsigned long long>(ms);
  if (magnitude % 1000 == 0) return sign + std::to_string(magnitude / 1000);
  std::string fraction = std::to_string(1000 + magnitude % 1000).substr(1);
  fraction.erase(fraction.find_last_not_of('0') + 1);
  return sign + std::to_string(magnitude / 1000) + "." + fraction;
}

}  // namespace ddp
