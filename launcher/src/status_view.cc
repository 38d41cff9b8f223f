#include "status_view.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace ddp::launcher::status {

namespace {

constexpr int kMinWidth = 20;
// Events shown when the height leaves room (and always, at most).
constexpr std::size_t kMaxEvents = 8;
// Rows a --watch view keeps for the events when the ranks would fill it.
constexpr std::size_t kMinEventRows = 3;

// Columns padded to their widest cell but the last, which takes what is left;
// every line is cut at the width.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::size_t size() const { return rows_.size() - 1; }

  std::vector<std::string> lines(std::size_t width) const {
    std::vector<std::size_t> widths;
    for (const auto& row : rows_) {
      if (widths.size() < row.size()) widths.resize(row.size(), 0);
      for (std::size_t c = 0; c + 1 < row.size(); ++c) {
        widths[c] = std::max(widths[c], row[c].size());
      }
    }
    std::vector<std::string> out;
    for (const auto& row : rows_) {
      std::string line = "  ";
      for (std::size_t c = 0; c < row.size(); ++c) {
        line += row[c];
        if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out.push_back(line.substr(0, width));
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string fixed(double value, int digits) { return fmt::format("{:.{}f}", value, digits); }

// "0-3,6,8-9".
std::string rank_list(std::vector<int> ranks) {
  if (ranks.empty()) return "-";
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? std::to_string(ranks[i])
                  : std::to_string(ranks[i]) + "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

const AgentStatus* agent_of(const AgentAnswer& answer) {
  return answer.document ? std::get_if<AgentStatus>(&*answer.document) : nullptr;
}

int round_of(const AgentStatus& a) { return a.round ? a.round->number : -1; }

bool same_round(const AgentStatus& a, const AgentStatus& b) {
  return a.run_id == b.run_id && a.round && b.round && a.round->number == b.round->number;
}

// The agent whose view the job is shown in: the highest round, the first URL
// among equals; nullptr when no agent answered.
const AgentStatus* primary_agent(const std::vector<AgentAnswer>& answers) {
  const AgentStatus* best = nullptr;
  for (const auto& answer : answers) {
    const AgentStatus* a = agent_of(answer);
    if (a && (!best || round_of(*a) > round_of(*best))) best = a;
  }
  return best;
}

// The other agents of the primary's round.
std::vector<const AgentStatus*> round_peers(const std::vector<AgentAnswer>& answers,
                                            const AgentStatus& primary) {
  std::vector<const AgentStatus*> peers;
  for (const auto& answer : answers) {
    const AgentStatus* a = agent_of(answer);
    if (a && a != &primary && same_round(*a, primary)) peers.push_back(a);
  }
  return peers;
}

std::string node_name(std::optional<int> node) {
  return node ? "node " + std::to_string(*node) : std::string("no round yet");
}

std::string yes_no(bool value) { return value ? "yes" : "no"; }

// ---- sections ---------------------------------------------------------------------------

std::string title_line(const std::vector<AgentAnswer>& answers, const AgentStatus* primary) {
  std::set<std::string> runs;
  for (const auto& answer : answers) {
    if (const AgentStatus* a = agent_of(answer)) runs.insert(a->run_id);
  }
  std::string line = "ddprun status";
  if (primary && !primary->time.empty()) line += " " + primary->time;
  if (primary) {
    line += " | run " + primary->run_id;
    if (runs.size() > 1) line += fmt::format(" (and {} other runs!)", runs.size() - 1);
    line += " (" + primary->backend + ")";
    line += fmt::format(" | nnodes {}:{}, nproc_per_node {}", primary->min_nodes,
                        primary->max_nodes, primary->nproc_per_node);
    if (primary->round) {
      const RoundRow& r = *primary->round;
      line += fmt::format(" | round {}: {} node{}, {} rank{}", r.number, r.group_world_size,
                          r.group_world_size == 1 ? "" : "s", r.world_size,
                          r.world_size == 1 ? "" : "s");
    }
    line += fmt::format(" | restarts {}/{}, re-forms {}", primary->restarts_spent,
                        primary->max_restarts, primary->membership_changes);
  }
  return line;
}

// What needs the operator first: agents that do not answer, nodes lost or
// unreachable, a hang, a failed job; "ok" otherwise.
std::string banner_line(const std::vector<AgentAnswer>& answers, const AgentStatus* primary) {
  std::vector<std::string> problems;
  for (const auto& answer : answers) {
    if (!answer.document) {
      problems.push_back("agent " + answer.url +
                         (answer.last_node ? " (" + node_name(answer.last_node) + ")" : "") +
                         " does not answer");
    }
  }
  if (primary) {
    for (const auto& m : primary->members) {
      if (m.state == "lost" || m.state == "unreachable") {
        problems.push_back(fmt::format("node {} ({}) {}", m.node, m.host, m.state));
      }
    }
    if (primary->incident) problems.push_back("hang: " + primary->incident->summary);
    if (primary->state == "failed") problems.push_back("the job failed");
  }
  if (problems.empty()) {
    if (!primary) return "OK";
    return primary->state == "succeeded"
               ? "OK: the job succeeded"
               : fmt::format("OK: every node answers ({} in the round)", primary->members.size());
  }
  std::string line = "PROBLEM: ";
  for (std::size_t i = 0; i < problems.size(); ++i) line += (i ? "; " : "") + problems[i];
  return line;
}

Table agents_table(const std::vector<AgentAnswer>& answers) {
  Table t({"AGENT", "NODE", "HOST", "STATE", "ROUND", "READY", "UP"});
  for (const auto& answer : answers) {
    if (!answer.document) {
      const std::string was =
          answer.last_node ? fmt::format("{} (last seen as)", *answer.last_node) : "-";
      t.add({answer.url, was, answer.last_host.empty() ? "-" : answer.last_host,
             "UNREACHABLE: " + answer.error});
    } else if (const AgentStatus* a = agent_of(answer)) {
      t.add({answer.url, a->group_rank ? std::to_string(*a->group_rank) : "-", a->host, a->state,
             a->round ? std::to_string(a->round->number) : "-",
             a->ready ? "yes" : "no: " + a->ready_reason, duration_text(a->uptime_s)});
    } else {
      const auto& d = std::get<DaemonStatus>(*answer.document);
      t.add({answer.url, "-", d.address, "store daemon: " + d.state,
             fmt::format("{}/{} clients, {} keys", d.clients, d.max_clients, d.keys),
             yes_no(d.ready), duration_text(d.uptime_s)});
    }
  }
  return t;
}

std::string keep_alive_text(const MemberRow& m) {
  if (!m.keep_alive_age_s) return "-";
  return duration_text(m.keep_alive_age_s) +
         (m.lost_after_s ? " of " + duration_text(m.lost_after_s) : "");
}

Table nodes_table(const AgentStatus& primary, const std::vector<const AgentStatus*>& peers) {
  Table t({"NODE", "HOST", "ADDR", "RANKS", "STATE", "HEARD", "KEEP-ALIVE"});
  for (const auto& m : primary.members) {
    MemberRow row = m;
    // The keep-alive age is known to the node that judges this one.
    for (const AgentStatus* peer : peers) {
      if (row.keep_alive_age_s || row.state == "lost") break;
      for (const auto& pm : peer->members) {
        if (pm.node == m.node && pm.keep_alive_age_s) {
          row.keep_alive_age_s = pm.keep_alive_age_s;
          row.lost_after_s = pm.lost_after_s;
        }
      }
    }
    std::string state = row.state;
    if (state == "lost" || state == "unreachable") {
      std::transform(state.begin(), state.end(), state.begin(), ::toupper);
    }
    t.add({std::to_string(row.node), row.host, row.addr, rank_list(row.ranks), state,
           duration_text(row.last_heard_s), keep_alive_text(row)});
  }
  return t;
}

// Each rank as its own node's agent sees it when that agent answered in the
// same round, else as the primary sees it.
std::vector<RankRow> merged_ranks(const AgentStatus& primary,
                                  const std::vector<const AgentStatus*>& peers) {
  std::vector<RankRow> ranks = primary.ranks;
  for (auto& r : ranks) {
    for (const AgentStatus* peer : peers) {
      if (!peer->group_rank || *peer->group_rank != r.node) continue;
      for (const auto& own : peer->ranks) {
        if (own.rank == r.rank) r = own;
      }
    }
  }
  std::sort(ranks.begin(), ranks.end(),
            [](const RankRow& a, const RankRow& b) { return a.rank < b.rank; });
  return ranks;
}

Table ranks_table(const std::vector<RankRow>& ranks, std::size_t rows) {
  Table t({"RANK", "NODE", "LOCAL", "PID", "STATE", "STEPS", "STEP", "COMPUTE", "SCORE", "LAST",
           "WHERE"});
  for (std::size_t i = 0; i < ranks.size() && i < rows; ++i) {
    const RankRow& r = ranks[i];
    std::string score = r.straggler_score ? fixed(*r.straggler_score, 2) : "-";
    if (r.straggler) score += " STRAGGLER";
    t.add({std::to_string(r.rank), std::to_string(r.node), std::to_string(r.local_rank),
           std::to_string(r.pid), r.state + (r.stale ? " (stale)" : ""), std::to_string(r.steps),
           duration_text(r.step_time_s), duration_text(r.compute_s), score,
           duration_text(r.last_progress_s), r.where.empty() ? "-" : r.where});
  }
  return t;
}

struct TaggedEvent {
  const EventRow* event;
  std::optional<int> node;
};

// Every answering agent's events, oldest first, each once (two nodes report
// the same round's forming in the same words).
std::vector<TaggedEvent> merged_events(const std::vector<AgentAnswer>& answers) {
  std::vector<TaggedEvent> events;
  std::set<std::tuple<int, std::string, std::string>> seen;
  for (const auto& answer : answers) {
    const AgentStatus* a = agent_of(answer);
    if (!a) continue;
    for (const auto& e : a->events) {
      if (seen.insert({e.round, e.kind, e.text}).second) events.push_back({&e, a->group_rank});
    }
  }
  std::stable_sort(events.begin(), events.end(), [](const TaggedEvent& x, const TaggedEvent& y) {
    return x.event->age_s > y.event->age_s;
  });
  return events;
}

// "2026-11-28T04:31:02Z" -> "04:31:02".
std::string clock_of(const std::string& iso) {
  const auto t = iso.find('T');
  return t == std::string::npos ? iso : iso.substr(t + 1, 8);
}

Table events_table(const std::vector<TaggedEvent>& events, std::size_t rows) {
  Table t({"TIME", "AGO", "SEEN BY", "ROUND", "KIND", "WHAT"});
  const std::size_t first = events.size() > rows ? events.size() - rows : 0;
  for (std::size_t i = first; i < events.size(); ++i) {
    const EventRow& e = *events[i].event;
    t.add({clock_of(e.time), duration_text(e.age_s), node_name(events[i].node),
           std::to_string(e.round), e.kind, e.text});
  }
  return t;
}

std::vector<std::string> incident_lines(const std::vector<AgentAnswer>& answers) {
  const IncidentRow* last = nullptr;
  for (const auto& answer : answers) {
    const AgentStatus* a = agent_of(answer);
    if (a && a->incident && (!last || a->incident->time > last->time)) last = &*a->incident;
  }
  if (!last) return {"  none"};
  std::vector<int> culprits = last->culprits;
  std::vector<std::string> out = {
      fmt::format("  {} {} found by node {}: {}", last->time, last->hang_kind, last->node,
                  last->summary),
      "  culprit ranks " + rank_list(culprits) +
          (last->file.empty() ? std::string() : "; report " + last->file)};
  return out;
}

void append(std::vector<std::string>& out, const std::vector<std::string>& lines) {
  out.insert(out.end(), lines.begin(), lines.end());
}

}  // namespace

std::string duration_text(std::optional<double> seconds) {
  if (!seconds || !std::isfinite(*seconds)) return "-";
  const double s = std::max(0.0, *seconds);
  if (s < 1) return fixed(s, 3) + "s";
  if (s < 10) return fixed(s, 2) + "s";
  if (s < 60) return fixed(s, 1) + "s";
  const auto whole = static_cast<long long>(s);
  if (whole < 3600) return fmt::format("{}m{:02}s", whole / 60, whole % 60);
  return fmt::format("{}h{:02}m", whole / 3600, whole % 3600 / 60);
}

std::vector<std::string> render_status_view(const std::vector<AgentAnswer>& answers,
                                            const ViewSize& size) {
  const auto width = static_cast<std::size_t>(std::max(size.width, kMinWidth));
  const AgentStatus* primary = primary_agent(answers);
  std::vector<std::string> out;
  out.push_back(title_line(answers, primary).substr(0, width));
  out.push_back(banner_line(answers, primary).substr(0, width));
  out.push_back("");
  append(out, agents_table(answers).lines(width));
  if (!primary) return out;

  const std::vector<const AgentStatus*> peers = round_peers(answers, *primary);
  out.push_back("");
  std::string seen_by = fmt::format("NODES, as {} sees them", node_name(primary->group_rank));
  out.push_back(seen_by.substr(0, width));
  append(out, nodes_table(*primary, peers).lines(width));

  const std::vector<RankRow> ranks = merged_ranks(*primary, peers);
  const std::vector<TaggedEvent> events = merged_events(answers);
  const std::vector<std::string> incident = incident_lines(answers);
  // What is left for the rank and event rows: the section titles, the tables'
  // headers, blank lines and the incident take 8 more lines.
  std::size_t rank_rows = ranks.size();
  std::size_t event_rows = std::min(events.size(), kMaxEvents);
  if (size.height > 0) {
    const std::size_t fixed_lines = out.size() + 8 + incident.size();
    const std::size_t room = static_cast<std::size_t>(size.height) > fixed_lines
                                 ? static_cast<std::size_t>(size.height) - fixed_lines
                                 : 0;
    event_rows = std::min(event_rows, std::max(std::min(room, kMinEventRows),
                                               room > rank_rows ? room - rank_rows : 0));
    rank_rows = std::min(rank_rows, room > event_rows ? room - event_rows : 0);
  }
  out.push_back("");
  std::string ranks_title = "RANKS";
  if (rank_rows < ranks.size()) {
    ranks_title +=
        fmt::format(" ({} of {}; a taller terminal shows more)", rank_rows, ranks.size());
  }
  out.push_back(ranks_title.substr(0, width));
  append(out, ranks_table(ranks, rank_rows).lines(width));
  out.push_back("");
  out.push_back(
      fmt::format("EVENTS, the last {} of {}", event_rows, events.size()).substr(0, width));
  append(out, events_table(events, event_rows).lines(width));
  out.push_back("");
  out.push_back("LAST INCIDENT");
  for (const auto& line : incident) out.push_back(line.substr(0, width));
  return out;
}

}  // namespace ddp::launcher::status
