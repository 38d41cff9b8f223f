// The worker library's rank logger: an spdlog logger whose lines carry
// "[rank N]" once init_process_group() has joined (before that, "[ddp]"), at
// the level DDP_LOG_LEVEL names (default info). The one public header of the
// worker library that includes spdlog: a program that logs some other way
// does not need it, nor spdlog's headers.
//
// Thread-safety: logger() may be called from any thread; spdlog's loggers
// are thread-safe. Ownership: shared; the logger outlives the group.
#pragma once

#include <memory>

#include <spdlog/logger.h>

namespace ddp {

std::shared_ptr<spdlog::logger> logger();

}  // namespace ddp
