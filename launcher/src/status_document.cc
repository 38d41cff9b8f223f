#include "status_document.h"

#include <limits>
#include <nlohmann/json.hpp>

#include "ddp/common/json.h"
#include "ddp/common/text.h"

namespace ddp::launcher::status {

namespace {

using nlohmann::json;

// The member `key` of `object`, or nullptr when `object` is not an object or
// has no such member.
const json* member(const json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

std::string text(const json& object, const char* key) {
  const json* v = member(object, key);
  return v && v->is_string() ? printable(v->get<std::string>()) : std::string();
}

std::optional<double> number(const json& object, const char* key) {
  const json* v = member(object, key);
  if (!v || !v->is_number()) return std::nullopt;
  return v->get<double>();
}

// An integer that fits T; absent when missing, fractional or out of range.
template <typename T>
std::optional<T> integer(const json& object, const char* key) {
  const json* v = member(object, key);
  if (!v || !v->is_number_integer()) return std::nullopt;
  if (v->is_number_unsigned()) {
    const auto u = v->get<unsigned long long>();
    if (u > static_cast<unsigned long long>(std::numeric_limits<T>::max())) return std::nullopt;
    return static_cast<T>(u);
  }
  const auto i = v->get<long long>();
  if (i < std::numeric_limits<T>::min() || i > std::numeric_limits<T>::max()) return std::nullopt;
  return static_cast<T>(i);
}

template <typename T>
T integer_or(const json& object, const char* key, T otherwise) {
  return integer<T>(object, key).value_or(otherwise);
}

bool flag(const json& object, const char* key) {
  const json* v = member(object, key);
  return v && v->is_boolean() && v->get<bool>();
}

std::vector<int> integers(const json& object, const char* key) {
  std::vector<int> out;
  const json* v = member(object, key);
  if (!v || !v->is_array()) return out;
  for (const auto& item : *v) {
    if (item.is_number_integer() && item.get<long long>() >= std::numeric_limits<int>::min() &&
        item.get<long long>() <= std::numeric_limits<int>::max()) {
      out.push_back(item.get<int>());
    }
  }
  return out;
}

// The objects of the array `key` (other elements are skipped).
std::vector<const json*> objects(const json& object, const char* key) {
  std::vector<const json*> out;
  const json* v = member(object, key);
  if (!v || !v->is_array()) return out;
  for (const auto& item : *v) {
    if (item.is_object()) out.push_back(&item);
  }
  return out;
}

MemberRow member_row(const json& m) {
  MemberRow row;
  row.node = integer_or(m, "node", -1);
  row.host = text(m, "host");
  row.addr = text(m, "addr");
  row.ranks = integers(m, "ranks");
  row.state = text(m, "state");
  row.last_heard_s = number(m, "last_heard_s");
  row.keep_alive_age_s = number(m, "keep_alive_age_s");
  row.lost_after_s = number(m, "lost_after_s");
  return row;
}

RankRow rank_row(const json& r) {
  RankRow row;
  row.rank = integer_or(r, "rank", -1);
  row.local_rank = integer_or(r, "local_rank", -1);
  row.node = integer_or(r, "node", -1);
  row.host = text(r, "host");
  row.pid = integer_or(r, "pid", 0L);
  row.state = text(r, "state");
  row.steps = integer_or(r, "steps", 0L);
  row.step_time_s = number(r, "step_time_s");
  row.compute_s = number(r, "compute_s");
  row.straggler_score = number(r, "straggler_score");
  row.straggler = flag(r, "straggler");
  row.last_progress_s = number(r, "last_progress_s");
  row.where = text(r, "where");
  row.stale = flag(r, "stale");
  return row;
}

EventRow event_row(const json& e) {
  EventRow row;
  row.time = text(e, "time");
  row.age_s = number(e, "age_s").value_or(0);
  row.round = integer_or(e, "round", -1);
  row.kind = text(e, "kind");
  row.text = text(e, "text");
  return row;
}

std::optional<IncidentRow> incident_row(const json& doc) {
  const json* i = member(doc, "incident");
  if (!i || !i->is_object()) return std::nullopt;
  IncidentRow row;
  row.hang_kind = text(*i, "hang_kind");
  row.summary = text(*i, "summary");
  row.culprits = integers(*i, "culprits");
  row.node = integer_or(*i, "node", -1);
  row.time = text(*i, "time");
  row.file = text(*i, "file");
  return row;
}

std::optional<RoundRow> round_row(const json& doc) {
  const json* r = member(doc, "round");
  if (!r || !r->is_object()) return std::nullopt;
  RoundRow row;
  row.number = integer_or(*r, "number", -1);
  row.attempt = integer_or(*r, "attempt", 0);
  row.world_size = integer_or(*r, "world_size", 0);
  row.group_world_size = integer_or(*r, "group_world_size", 0);
  row.base_rank = integer_or(*r, "base_rank", 0);
  row.formed_s_ago = number(*r, "formed_s_ago").value_or(0);
  return row;
}

AgentStatus agent_status(const json& doc) {
  AgentStatus a;
  a.run_id = text(doc, "run_id");
  a.backend = text(doc, "backend");
  a.time = text(doc, "time");
  a.uptime_s = number(doc, "uptime_s").value_or(0);
  a.state = text(doc, "state");
  a.state_s = number(doc, "state_s").value_or(0);
  a.ready = flag(doc, "ready");
  a.ready_reason = text(doc, "ready_reason");
  if (const json* node = member(doc, "node")) {
    a.host = text(*node, "host");
    a.addr = text(*node, "addr");
    a.group_rank = integer<int>(*node, "group_rank");
    a.pid = integer_or(*node, "pid", 0L);
  }
  if (const json* nnodes = member(doc, "nnodes")) {
    a.min_nodes = integer_or(*nnodes, "min", 0);
    a.max_nodes = integer_or(*nnodes, "max", 0);
  }
  a.nproc_per_node = integer_or(doc, "nproc_per_node", 0);
  a.round = round_row(doc);
  if (const json* restarts = member(doc, "restarts")) {
    a.restarts_spent = integer_or(*restarts, "spent", 0);
    a.max_restarts = integer_or(*restarts, "max", 0);
    a.membership_changes = integer_or(*restarts, "membership_changes", 0);
    if (const json* causes = member(*restarts, "by_cause"); causes && causes->is_object()) {
      for (const auto& [cause, count] : causes->items()) {
        if (count.is_number_integer()) a.restarts_by_cause[printable(cause)] = count.get<long>();
      }
    }
  }
  for (const json* m : objects(doc, "members")) a.members.push_back(member_row(*m));
  for (const json* r : objects(doc, "ranks")) a.ranks.push_back(rank_row(*r));
  for (const json* e : objects(doc, "events")) a.events.push_back(event_row(*e));
  a.incident = incident_row(doc);
  return a;
}

DaemonStatus daemon_status(const json& doc) {
  DaemonStatus d;
  d.address = text(doc, "address");
  d.state = text(doc, "state");
  d.uptime_s = number(doc, "uptime_s").value_or(0);
  d.ready = flag(doc, "ready");
  d.clients = integer_or(doc, "clients", 0L);
  d.max_clients = integer_or(doc, "max_clients", 0L);
  d.keys = integer_or(doc, "keys", 0L);
  return d;
}

}  // namespace

ParsedDocument parse_status_document(std::string_view body) {
  ParsedDocument out;
  const ddp::json::Parsed parsed = ddp::json::parse_bounded(body);
  if (!parsed.valid) {
    out.error = "answered something that is not JSON";
    return out;
  }
  const json& doc = parsed.value;
  if (!doc.is_object()) {
    out.error = "answered JSON that is not a live view's document (not an object)";
    return out;
  }
  const std::string kind = text(doc, "kind");
  if (kind == "agent") {
    out.document = agent_status(doc);
  } else if (kind == "daemon") {
    out.document = daemon_status(doc);
  } else {
    out.error = kind.empty() ? "answered JSON that is not a live view's document (no 'kind')"
                             : "answered a document of kind '" + kind +
                                   "', neither an agent's nor the daemon's";
  }
  return out;
}

}  // namespace ddp::launcher::status
