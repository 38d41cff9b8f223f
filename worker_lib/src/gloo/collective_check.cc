#include "gloo/collective_check.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/common/error.h"

namespace ddp::detail {

namespace {
constexpr std::uint32_t kMagic = 0x44445043;  // "DDPC": catches garbage, not just mismatches

template <typename T>
void put(std::uint8_t* out, std::size_t& at, T value) {
  std::memcpy(out + at, &value, sizeof(T));
  at += sizeof(T);
}
template <typename T>
T take(const std::uint8_t* in, std::size_t& at) {
  T value;
  std::memcpy(&value, in + at, sizeof(T));
  at += sizeof(T);
  return value;
}
}  // namespace

const char* to_string(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllreduce:
      return "allreduce";
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kAllgather:
      return "allgather";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::kReduce:
      return "reduce";
    case CollectiveOp::kBarrier:
      return "barrier";
    case CollectiveOp::kGather:
      return "gather";
    case CollectiveOp::kScatter:
      return "scatter";
    case CollectiveOp::kAlltoall:
      return "alltoall";
  }
  return "unknown";
}

progress::Kind progress_kind(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllreduce:
      return progress::Kind::kAllreduce;
    case CollectiveOp::kBroadcast:
      return progress::Kind::kBroadcast;
    case CollectiveOp::kAllgather:
      return progress::Kind::kAllgather;
    case CollectiveOp::kReduceScatter:
      return progress::Kind::kReduceScatter;
    case CollectiveOp::kReduce:
      return progress::Kind::kReduce;
    case CollectiveOp::kBarrier:
      return progress::Kind::kBarrier;
    case CollectiveOp::kGather:
      return progress::Kind::kGather;
    case CollectiveOp::kScatter:
      return progress::Kind::kScatter;
    case CollectiveOp::kAlltoall:
      return progress::Kind::kAlltoall;
  }
  return progress::Kind::kNone;
}

std::array<std::uint8_t, CollectiveDescriptor::kEncodedSize> CollectiveDescriptor::encode() const {
  std::array<std::uint8_t, kEncodedSize> out{};
  std::size_t at = 0;
  put(out.data(), at, kMagic);
  put(out.data(), at, static_cast<std::uint8_t>(op));
  put(out.data(), at, static_cast<std::uint8_t>(dtype));
  put(out.data(), at, static_cast<std::uint8_t>(reduce_op));
  put(out.data(), at, std::uint8_t{0});
  put(out.data(), at, root);
  put(out.data(), at, seq);
  put(out.data(), at, count);
  return out;
}

CollectiveDescriptor CollectiveDescriptor::decode(const std::uint8_t* bytes) {
  std::size_t at = 0;
  if (take<std::uint32_t>(bytes, at) != kMagic) {
    throw ProtocolError("CollectiveDescriptor::decode", "not a collective descriptor");
  }
  CollectiveDescriptor d;
  d.op = static_cast<CollectiveOp>(take<std::uint8_t>(bytes, at));
  d.dtype = static_cast<DType>(take<std::uint8_t>(bytes, at));
  d.reduce_op = static_cast<ReduceOp>(take<std::uint8_t>(bytes, at));
  (void)take<std::uint8_t>(bytes, at);
  d.root = take<std::int32_t>(bytes, at);
  d.seq = take<std::uint64_t>(bytes, at);
  d.count = take<std::uint64_t>(bytes, at);
  return d;
}

std::string CollectiveDescriptor::describe() const {
  std::string text = fmt::format("{}(seq={}", to_string(op), seq);
  if (op == CollectiveOp::kAlltoall) {
    text += fmt::format(", dtype={}", to_string(dtype));
  } else if (op != CollectiveOp::kBarrier) {
    text += fmt::format(", count={}, dtype={}", count, to_string(dtype));
  }
  if (op == CollectiveOp::kAllreduce || op == CollectiveOp::kReduce ||
      op == CollectiveOp::kReduceScatter) {
    text += fmt::format(", op={}", to_string(reduce_op));
  }
  if (op == CollectiveOp::kBroadcast || op == CollectiveOp::kReduce ||
      op == CollectiveOp::kGather || op == CollectiveOp::kScatter) {
    text += fmt::format(", root={}", root);
  }
  return text + ")";
}

std::string find_mismatch(const std::vector<CollectiveDescriptor>& per_rank) {
  if (per_rank.empty()) return {};
  // What must agree: everything but an all-to-all's count.
  auto compared = [](CollectiveDescriptor d) {
    if (d.op == CollectiveOp::kAlltoall) d.count = 0;
    return d;
  };
  bool same = true;
  for (const auto& d : per_rank) same = same && compared(d) == compared(per_rank.front());
  if (same) return {};
  // Group ranks by the call they made, in order of first appearance.
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    auto text = per_rank[r].describe();
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == text; });
    if (it == groups.end()) {
      groups.push_back({text, {static_cast<int>(r)}});
    } else {
      it->second.push_back(static_cast<int>(r));
    }
  }
  std::string message = "ranks called different collectives:";
  for (const auto& [text, ranks] : groups) {
    message += fmt::format(" ranks [{}] called {};", fmt::join(ranks, ","), text);
  }
  message.pop_back();
  return message;
}

std::vector<std::uint64_t> AlltoallCounts::encode() const {
  std::vector<std::uint64_t> words;
  words.reserve(1 + input.size() + output.size());
  words.push_back(static_cast<std::uint64_t>(dtype));
  words.insert(words.end(), input.begin(), input.end());
  words.insert(words.end(), output.begin(), output.end());
  return words;
}

AlltoallCounts AlltoallCounts::decode(const std::uint64_t* words, std::size_t size) {
  if (words[0] > static_cast<std::uint64_t>(DType::kBool)) {
    throw ProtocolError("AlltoallCounts::decode",
                        fmt::format("{} names no dtype: not all-to-all counts", words[0]));
  }
  AlltoallCounts counts;
  counts.dtype = static_cast<DType>(words[0]);
  counts.input.assign(words + 1, words + 1 + size);
  counts.output.assign(words + 1 + size, words + 1 + 2 * size);
  return counts;
}

std::string find_alltoall_mismatch(const std::vector<AlltoallCounts>& per_rank) {
  std::string message;
  for (std::size_t r = 1; r < per_rank.size(); ++r) {
    if (per_rank[r].dtype != per_rank[0].dtype) {
      message += fmt::format(" rank 0 exchanges {} but rank {} {};", to_string(per_rank[0].dtype),
                             r, to_string(per_rank[r].dtype));
    }
  }
  for (std::size_t from = 0; from < per_rank.size(); ++from) {
    for (std::size_t to = 0; to < per_rank.size(); ++to) {
      const auto sent = per_rank[from].input.at(to);
      const auto expected = per_rank[to].output.at(from);
      if (sent != expected) {
        message += fmt::format(" rank {} sends {} elements to rank {}, which expects {};", from,
                               sent, to, expected);
      }
    }
  }
  if (message.empty()) return {};
  message.pop_back();
  return "ranks disagree on the all-to-all:" + message;
}

}  // namespace ddp::detail
