// Reading the process environment, parsed and validated once. A variable that is
// set but malformed is an error naming the variable, never silently ignored.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace ddp::env {

// The value of `name`, or nullopt when unset. An empty value counts as set.
std::optional<std::string> get(const char* name);

// The value of `name`, or `fallback` when unset or empty.
std::string get_or(const char* name, const std::string& fallback);

// The integer value of `name`, or nullopt when unset or empty.
// Throws InvalidArgument naming the variable when it is not an integer.
std::optional<std::int64_t> get_int(const char* name);

// true for 1/true/yes/on, false for 0/false/no/off (any case), nullopt when unset.
// Throws InvalidArgument for anything else.
std::optional<bool> get_bool(const char* name);

// Parses an integer from `text`; throws InvalidArgument naming `what` otherwise.
std::int64_t parse_int(const std::string& text, const std::string& what);

// Parses a duration in seconds ("30", "0.5"); throws InvalidArgument naming `what`.
std::chrono::milliseconds parse_seconds(const std::string& text, const std::string& what);

}  // namespace ddp::env
