#include "incident.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ddp/common/logging.h"
#include "safe_file.h"

namespace ddp::agent {
namespace {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

nlohmann::json rank_json(const RankStatus& r) {
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& g : r.groups) {
    groups.push_back({{"name", g.name},
                      {"size", g.size},
                      {"rank", g.rank},
                      {"issued", g.issued},
                      {"completed", g.completed},
                      {"last_issued_kind", progress::to_string(g.last_kind)},
                      {"last_issued_bytes", g.last_bytes},
                      {"in_collective", g.in_collective()},
                      {"waiting_s", g.waiting.count() / 1000.0},
                      {"since_completed_s", g.since_completed.count() / 1000.0}});
  }
  return {{"rank", r.rank},
          {"local_rank", r.local_rank},
          {"node", r.node},
          {"host", r.host.str()},
          {"pid", r.pid},
          {"state", to_string(r.state)},
          {"progress_page", r.has_page},
          {"steps", r.steps},
          {"no_sync_steps", r.no_sync_steps},
          {"step_compute_s", r.compute.count() / 1000.0},
          {"groups", std::move(groups)},
          {"stale", r.stale},
          {"where", describe_rank(r)}};
}

}  // namespace

std::string format_incident(const Incident& incident) {
  const std::string rule(72, '=');
  std::string text = rule + "\n";
  text += fmt::format("ddprun: HANG ({}) detected by node {} ({}), round {}{}\n",
                      to_string(incident.hang.kind), incident.node, incident.host, incident.round,
                      incident.hang.found_by >= 0 && incident.hang.found_by != incident.node
                          ? fmt::format(" (found first by node {})", incident.hang.found_by)
                          : std::string());
  text += "  " + incident.hang.summary + "\n";
  text += fmt::format("  culprit rank(s): {}; hang timeout {:.1f} s; action: {}\n",
                      incident.hang.culprits.empty()
                          ? std::string("unknown")
                          : fmt::format("{}", fmt::join(incident.hang.culprits, ", ")),
                      incident.timeout.count() / 1000.0, incident.action);
  for (const auto& node : incident.unreachable) text += "  unreachable: " + node + "\n";
  text += "  ranks:\n";
  for (const auto& line : incident.hang.ranks) text += "    " + line + "\n";
  for (const auto& [rank, stacks] : incident.stacks) {
    if (!stacks.error.empty()) {
      text += fmt::format("  native stacks of rank {}: unavailable ({})\n", rank, stacks.error);
      continue;
    }
    text += fmt::format("  native stacks of rank {} ({}):\n", rank, stacks.tool);
    std::size_t start = 0;
    while (start < stacks.text.size()) {
      auto end = stacks.text.find('\n', start);
      if (end == std::string::npos) end = stacks.text.size();
      text += "    " + stacks.text.substr(start, end - start) + "\n";
      start = end + 1;
    }
  }
  for (const auto& note : incident.notes) text += "  " + note + "\n";
  text += rule + "\n";
  return text;
}

std::string write_incident(const std::string& dir, const Incident& incident) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : incident.ranks) ranks.push_back(rank_json(r));
  nlohmann::json stacks = nlohmann::json::object();
  for (const auto& [rank, s] : incident.stacks) {
    stacks[std::to_string(rank)] = {{"tool", s.tool}, {"text", s.text}, {"error", s.error}};
  }
  nlohmann::json doc = {{"kind", "hang"},
                        {"hang_kind", to_string(incident.hang.kind)},
                        {"time", utc_now()},
                        {"summary", incident.hang.summary},
                        {"culprits", incident.hang.culprits},
                        {"group", incident.hang.group},
                        {"collective_seq", incident.hang.seq},
                        {"collective", progress::to_string(incident.hang.collective)},
                        {"stuck_s", incident.hang.duration.count() / 1000.0},
                        {"hang_timeout_s", incident.timeout.count() / 1000.0},
                        {"node", incident.node},
                        {"found_by", incident.hang.found_by},
                        {"host", incident.host},
                        {"round", incident.round},
                        {"attempt", incident.attempt},
                        {"action", incident.action},
                        {"unreachable", incident.unreachable},
                        {"notes", incident.notes},
                        {"ranks", std::move(ranks)},
                        {"stacks", std::move(stacks)}};
  const std::string name = fmt::format("hang_{}_node{}.json", incident.attempt, incident.node);
  const std::string path = dir + "/" + name;
  const std::string temp = path + ".tmp";
  const std::string body = doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const int fd = detail::open_no_symlinks(temp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
  bool ok = fd >= 0;
  if (ok) {
    ok = detail::write_all(fd, body.data(), body.size());
    ok = ::close(fd) == 0 && ok;
  }
  if (!ok || std::rename(temp.c_str(), path.c_str()) != 0) {
    ::unlink(temp.c_str());
    log::get("ddprun")->warn("cannot write the incident file {}", path);
    return "";
  }
  return path;
}

}  // namespace ddp::agent
