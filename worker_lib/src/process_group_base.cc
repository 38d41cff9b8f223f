#include "process_group_base.h"

#include <fmt/format.h>

#include "ddp/common/error.h"

namespace ddp::detail {

GroupAbort::GroupAbort(std::string backend, std::string group)
    : backend_(std::move(backend)), group_(std::move(group)) {}

bool GroupAbort::set(const std::string& reason) {
  if (aborted_.load(std::memory_order_relaxed)) return false;
  reason_ = reason;
  aborted_.store(true, std::memory_order_release);
  return true;
}

std::exception_ptr GroupAbort::error(const std::string& op, std::uint64_t seq) const {
  return std::make_exception_ptr(GroupChanged(
      fmt::format("{}::{}", backend_, op),
      fmt::format("{}: {} #{} failed: the group was aborted: {}", group_, op, seq, reason_)));
}

void check_group_arguments(const char* backend, const Store* store, int rank, int size,
                           std::chrono::milliseconds timeout) {
  if (store == nullptr) throw InvalidArgument(backend, "store is null");
  if (size < 1) throw InvalidArgument(backend, fmt::format("world size {} must be >= 1", size));
  if (rank < 0 || rank >= size) {
    throw InvalidArgument(backend, fmt::format("rank {} is outside [0, {})", rank, size));
  }
  if (timeout.count() <= 0) {
    throw InvalidArgument(backend, fmt::format("timeout {} ms must be positive", timeout.count()));
  }
}

}  // namespace ddp::detail
