#include "dynamic_keys.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "ddp/common/error.h"
#include "ddp/store/store_capabilities.h"

namespace ddp::rendezvous_detail {
namespace {

// Records read with one multi_get.
constexpr std::size_t kRecordBatch = 1024;

std::string arrivals_key(const std::string& r) { return r + "/arrivals"; }

}  // namespace

std::optional<std::string> try_get(Store& store, const std::string& key) {
  try {
    return store.get(key, Duration(0));
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
}

std::int64_t take_arrival_index(Store& store, const std::string& r) {
  // Tickets never race (a thousand nodes arriving at once on etcd).
  if (auto* tickets = store.tickets()) return tickets->take_ticket(arrivals_key(r));
  return store.add(arrivals_key(r), 1) - 1;
}

std::int64_t count_arrivals(Store& store, const std::string& r) {
  if (auto* tickets = store.tickets()) return tickets->tickets_taken(arrivals_key(r));
  // A read, not add(key, 0): a look at a round must not create its counter.
  const std::string key = arrivals_key(r);
  const auto text = try_get(store, key);
  return text ? parse_integer(*text, key, "arrival counter",
                              std::numeric_limits<std::int64_t>::min(),
                              std::numeric_limits<std::int64_t>::max())
              : 0;
}

std::vector<std::optional<Arrival>> read_records(Store& store, const std::string& r,
                                                 const std::vector<int>& indices) {
  std::vector<std::optional<Arrival>> records(indices.size());
  for (std::size_t begin = 0; begin < indices.size(); begin += kRecordBatch) {
    const std::size_t end = std::min(indices.size(), begin + kRecordBatch);
    std::vector<std::string> keys;
    for (std::size_t k = begin; k < end; ++k) keys.push_back(RunKeys::record(r, indices[k]));
    std::vector<std::optional<std::string>> values(keys.size());
    try {
      auto all = store.multi_get(keys, Duration(0));  // one round trip when every record is there
      for (std::size_t k = 0; k < keys.size(); ++k) values[k] = std::move(all[k]);
    } catch (const TimeoutError&) {
      for (std::size_t k = 0; k < keys.size(); ++k) values[k] = try_get(store, keys[k]);
    }
    for (std::size_t k = 0; k < keys.size(); ++k) {
      if (values[k]) records[begin + k] = parse_arrival(*values[k], keys[k]);
    }
  }
  return records;
}

std::optional<Current> read_current(Store& store, const RunKeys& keys) {
  auto text = try_get(store, keys.current());
  if (!text) return std::nullopt;
  return parse_current(*text, keys.current());
}

std::optional<Decision> read_decision(Store& store, const std::string& r) {
  auto text = try_get(store, RunKeys::closed(r));
  if (!text) return std::nullopt;
  return parse_decision(*text, RunKeys::closed(r));
}

std::optional<RoundEnd> read_end(Store& store, const std::string& r) {
  auto text = try_get(store, RunKeys::end(r));
  return text ? parse_round_end(*text) : std::nullopt;
}

Lineage read_lineage(Store& store, const RunKeys& keys, int round) {
  Lineage lineage;
  if (round < 0) return lineage;
  const std::string r = keys.round(round);
  const auto decision = read_decision(store, r);
  if (!decision) return lineage;
  const std::string members_key = RunKeys::members(r, decision->decider);
  if (auto members = try_get(store, members_key))
    lineage.members = parse_members(*members, members_key);
  if (auto end = read_end(store, r); end && end->kind == RoundEnd::Kind::kNodeLost)
    lineage.lost = end->member;
  return lineage;
}

bool publish(Store& store, const std::string& r, const Publication& p) {
  const int decider = p.decision.decider;
  std::vector<std::string> keys, values;
  for (std::size_t i = 0; i < p.assignments.size(); ++i) {
    keys.push_back(RunKeys::assignment(r, decider, static_cast<std::int64_t>(i)));
    values.push_back(encode_assignment(p.assignments[i]));
  }
  keys.push_back(RunKeys::members(r, decider));
  values.push_back(encode_members(p.members));
  store.multi_set(keys, values);
  const std::string decision = encode_decision(p.decision);
  return store.compare_set(RunKeys::closed(r), "", decision) == decision;
}

std::string end_round_once(Store& store, const std::string& r, const RoundEnd& end) {
  return store.compare_set(RunKeys::end(r), "", encode_round_end(end));
}

void leave_job(Store& store, const RunKeys& keys, int last_round, int nodes) {
  if (last_round < 0) return;
  const std::string last = keys.round(last_round);
  if (store.add(last + "/left", 1) < nodes) return;
  if (last_round >= 1) delete_round_keys(store, keys.round(last_round - 1));
  delete_round_keys(store, last);
  store.delete_key(keys.current());
  store.delete_key(keys.config());
  store.delete_key(keys.counts());
}

void delete_round_keys(Store& store, const std::string& r) {
  const auto decision = read_decision(store, r);
  const int arrived = considered_arrivals(count_arrivals(store, r));
  std::vector<std::string> keys = {RunKeys::end(r), r + "/exit_barrier", r + "/left"};
  for (int i = 0; i < arrived; ++i) keys.push_back(RunKeys::record(r, i));
  if (decision) {
    keys.push_back(RunKeys::members(r, decision->decider));
    for (int i = 0; i < decision->considered; ++i) {
      keys.push_back(RunKeys::assignment(r, decision->decider, i));
      keys.push_back(round_area_key(r, i));  // group ranks are below the arrivals considered
    }
    keys.push_back(RunKeys::closed(r));
  }
  for (const auto& key : keys) store.delete_key(key);
  if (auto* tickets = store.tickets()) {
    tickets->delete_tickets(arrivals_key(r));
  } else {
    store.delete_key(arrivals_key(r));
  }
}

}  // namespace ddp::rendezvous_detail
