#include "process_group_base.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

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

void check_root(const char* origin, int root, int size) {
  if (root < 0 || root >= size) {
    throw InvalidArgument(origin, fmt::format("root {} is outside [0, {})", root, size));
  }
}

void check_chunks(const char* origin, const Buffer& whole, const Buffer& chunk,
                  const char* whole_name, const char* chunk_name, int size) {
  if (whole.dtype != chunk.dtype) {
    throw InvalidArgument(origin,
                          fmt::format("{} dtype {} differs from {} dtype {}", whole_name,
                                      to_string(whole.dtype), chunk_name, to_string(chunk.dtype)));
  }
  const auto expected = chunk.count * static_cast<std::size_t>(size);
  if (whole.count != expected) {
    throw InvalidArgument(
        origin, fmt::format("{} has {} elements; expected {} count {} x size {} = {}", whole_name,
                            whole.count, chunk_name, chunk.count, size, expected));
  }
}

namespace {

// The element counts per peer of an all-to-all's `buffer` (`which`: "input" or
// "output"): `counts` as given, or an even split when empty.
std::vector<std::uint64_t> split_counts(const char* origin, const char* which, const Buffer& buffer,
                                        const std::vector<std::size_t>& counts, int size) {
  const auto n = static_cast<std::size_t>(size);
  if (counts.empty()) {
    if (buffer.count % n != 0) {
      throw InvalidArgument(origin, fmt::format("{} has {} elements, which {} ranks cannot split "
                                                "evenly; give the counts per rank",
                                                which, buffer.count, size));
    }
    return std::vector<std::uint64_t>(n, buffer.count / n);
  }
  if (counts.size() != n) {
    throw InvalidArgument(origin,
                          fmt::format("{} counts has {} entries; expected one per rank ({})", which,
                                      counts.size(), size));
  }
  std::size_t total = 0;
  for (auto c : counts) total += c;
  if (total != buffer.count) {
    throw InvalidArgument(origin,
                          fmt::format("{} counts [{}] add up to {}, but the {} has {} "
                                      "elements",
                                      which, fmt::join(counts, ", "), total, which, buffer.count));
  }
  return {counts.begin(), counts.end()};
}

}  // namespace

AlltoallSplit split_alltoall(const char* origin, const Buffer& output, const Buffer& input,
                             const std::vector<std::size_t>& output_counts,
                             const std::vector<std::size_t>& input_counts, int rank, int size) {
  if (output.dtype != input.dtype) {
    throw InvalidArgument(origin, fmt::format("output dtype {} differs from input dtype {}",
                                              to_string(output.dtype), to_string(input.dtype)));
  }
  AlltoallSplit split;
  split.input = split_counts(origin, "input", input, input_counts, size);
  split.output = split_counts(origin, "output", output, output_counts, size);
  const auto me = static_cast<std::size_t>(rank);
  if (split.input[me] != split.output[me]) {
    throw InvalidArgument(origin, fmt::format("rank {} sends itself {} elements but expects {}",
                                              rank, split.input[me], split.output[me]));
  }
  return split;
}

}  // namespace ddp::detail
