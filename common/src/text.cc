#include "ddp/common/text.h"

namespace ddp {

std::string printable(std::string_view text) {
  std::string shown(text);
  for (char& c : shown) {
    if (!is_printable(c)) c = '?';
  }
  return shown;
}

}  // namespace ddp
