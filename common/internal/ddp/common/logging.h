// Logging setup. Every component logs through spdlog to stderr; the level comes
// from DDP_LOG_LEVEL (trace, debug, info, warn, error, critical, off).
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace ddp::log {

// Creates (once per name) a stderr logger named `name`, with the level of
// DDP_LOG_LEVEL or `default_level` when unset, and makes it spdlog's default.
// Throws InvalidArgument when DDP_LOG_LEVEL is not a level name.
// Thread-safe; later calls with the same name return the same logger.
std::shared_ptr<spdlog::logger> init(const std::string& name,
                                     spdlog::level::level_enum default_level = spdlog::level::warn);

// The logger named `name`, created with init(name) when it does not exist yet.
std::shared_ptr<spdlog::logger> get(const std::string& name);

// Parses a level name; throws InvalidArgument naming `what` when it is not one.
spdlog::level::level_enum parse_level(const std::string& text, const std::string& what);

}  // namespace ddp::log
