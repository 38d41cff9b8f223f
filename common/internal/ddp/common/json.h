// Parsing JSON that someone else wrote (etcd's replies, a worker's error
// file) without trusting its shape. nlohmann's parser itself is iterative, but
// copying, comparing and dumping a document recurse once per level: a
// document nested 100,000 levels deep (2 MB of brackets) overflows the stack
// of whatever touches it next. So nesting is bounded here, at parse time.
//
// Header-only; include it only where nlohmann/json is available (the
// components that parse JSON link nlohmann_json::nlohmann_json).
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

namespace ddp::json {

// Deep enough for every document ddprun reads (etcd nests about 6 levels, an
// error file 3), shallow enough for any stack.
inline constexpr int kMaxDepth = 64;

struct Parsed {
  // The document, less every element nested deeper than `max_depth` levels
  // (dropped from its container, which keeps the rest). Discarded when not
  // `valid`.
  nlohmann::json value;
  // The text is well-formed JSON (whatever its depth).
  bool valid = false;
  // Some value was nested deeper than the limit and dropped.
  bool too_deep = false;
};

// Never throws for bad input.
inline Parsed parse_bounded(std::string_view text, int max_depth = kMaxDepth) {
  Parsed parsed;
  // `depth` is the element's level (the root is 0, its members 1, ...), the
  // same at a container's start and end events; dropping a container at its
  // start drops everything in it without building it.
  auto keep = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth <= max_depth) return true;
    parsed.too_deep = true;
    return false;
  };
  parsed.value = nlohmann::json::parse(text.begin(), text.end(), keep, /*allow_exceptions=*/false);
  parsed.valid = !parsed.value.is_discarded();
  return parsed;
}

}  // namespace ddp::json
