#include "ddp/rendezvous/job_counts.h"

#include <charconv>
#include <string_view>
#include <vector>

#include "ddp/common/error.h"
#include "job_counts_store.h"
#include "records.h"

namespace ddp {
namespace {

// A count: decimal digits only, up to a billion.
std::optional<int> parse_count(std::string_view text) {
  int value = 0;
  if (text.empty() || text.size() > 9) return std::nullopt;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

}  // namespace

JobCounts counted(JobCounts counts, int round, const RoundEndCount& how) {
  if (how.kind == RoundEndCount::Kind::kRestart) {
    ++counts.restarts;
    if (!how.progressed) ++counts.restarts_without_progress;
  } else {
    ++counts.membership_changes;
  }
  if (how.progressed) counts.restarts_without_progress = 0;
  counts.last_counted_round = round;
  return counts;
}

std::string encode_job_counts(const JobCounts& counts) {
  return std::to_string(counts.restarts) + " " + std::to_string(counts.membership_changes) + " " +
         std::to_string(counts.restarts_without_progress) + " " +
         std::to_string(counts.last_counted_round);
}

std::optional<JobCounts> decode_job_counts(const std::string& text) {
  std::vector<std::string_view> parts;
  std::string_view rest(text);
  for (auto space = rest.find(' '); space != std::string_view::npos; space = rest.find(' ')) {
    parts.push_back(rest.substr(0, space));
    rest.remove_prefix(space + 1);
  }
  parts.push_back(rest);
  if (parts.size() != 4) return std::nullopt;
  const auto restarts = parse_count(parts[0]);
  const auto changes = parse_count(parts[1]);
  const auto in_a_row = parse_count(parts[2]);
  const auto round = parse_count(parts[3]);
  // More restarts in a row than in all is no count.
  if (!restarts || !changes || !in_a_row || !round || *in_a_row > *restarts) return std::nullopt;
  return JobCounts{*restarts, *changes, *in_a_row, *round};
}

namespace rendezvous_detail {
namespace {

JobCounts decode_or_throw(const std::string& text, const std::string& key) {
  auto counts = decode_job_counts(text);
  if (!counts) {
    throw ProtocolError("rendezvous",
                        "store key " + key + " holds '" + shown_value(text) +
                            "', not the job's counts ('<restarts> <membership changes> "
                            "<restarts without progress> <last round counted>')");
  }
  return *counts;
}

}  // namespace

JobCounts read_job_counts(Store& store, const std::string& key) {
  if (!store.check({key})) return {};
  return decode_or_throw(store.get(key), key);
}

JobCounts count_round_end(Store& store, const std::string& key, int round,
                          const RoundEndCount& how) {
  // The missing key holds zero counts (compare_set's empty expected value).
  std::string current = store.check({key}) ? store.get(key) : "";
  // Each lost race means another round's end or this one was counted: a few
  // tries are plenty; past them the store is not behaving.
  for (int attempt = 0; attempt < 64; ++attempt) {
    const JobCounts seen = current.empty() ? JobCounts{} : decode_or_throw(current, key);
    if (seen.last_counted_round >= round) return seen;  // counted by another agent
    const std::string mine = encode_job_counts(counted(seen, round, how));
    const std::string after = store.compare_set(key, current, mine);
    if (after == mine) return counted(seen, round, how);
    // The key went (the job's last agent deleted it) or changed: read again.
    if (after == current) return counted(seen, round, how);
    current = after;
  }
  throw ProtocolError("rendezvous", "store key " + key +
                                        " changed under every one of 64 tries to count the end "
                                        "of round " +
                                        std::to_string(round));
}

}  // namespace rendezvous_detail
}  // namespace ddp
