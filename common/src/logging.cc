#include "ddp/common/logging.h"

#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "ddp/common/env.h"
#include "ddp/common/error.h"

namespace ddp::log {

spdlog::level::level_enum parse_level(const std::string& text, const std::string& what) {
  auto level = spdlog::level::from_str(text);
  // from_str maps unknown names to "off"; only the word "off" may mean off.
  if (level == spdlog::level::off && text != "off") {
    throw InvalidArgument("", what + ": unknown log level '" + text +
                                  "' (expected trace, debug, info, warn, error, critical or off)");
  }
  return level;
}

std::shared_ptr<spdlog::logger> init(const std::string& name,
                                     spdlog::level::level_enum default_level) {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  if (auto existing = spdlog::get(name)) return existing;
  auto logger = spdlog::stderr_color_mt(name);
  auto level_text = env::get("DDP_LOG_LEVEL");
  logger->set_level(level_text && !level_text->empty()
                        ? parse_level(*level_text, "environment variable DDP_LOG_LEVEL")
                        : default_level);
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v");
  spdlog::set_default_logger(logger);
  return logger;
}

std::shared_ptr<spdlog::logger> get(const std::string& name) {
  if (auto existing = spdlog::get(name)) return existing;
  return init(name);
}

}  // namespace ddp::log
