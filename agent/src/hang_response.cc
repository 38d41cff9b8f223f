#include "hang_response.h"

#include <csignal>
#include <cstdio>

#include <fmt/format.h>

#include "stack_dump.h"

namespace ddp::agent {

HangResponse::HangResponse(const AgentOptions& options, const ProgressWatch& watch,
                           WorkerGroup& group, AgentEvents& events)
    : options_(options), watch_(watch), group_(group), events_(events) {}

// A Python program writes progress pages only on the backend "ddp" (import
// ddp_torch): with an explicit --hang_timeout, says which hangs can be seen
// on another backend. (The default, auto, ends no rank that writes no page:
// see respond.)
void HangResponse::say_what_hangs_are_seen() const {
  const auto& timeout = options_.watch.hang_timeout;
  if (!group_.python() || !timeout || timeout->count() <= 0) return;
  const double s = timeout->count() / 1000.0;
  events_.notice(fmt::format(
      "--hang_timeout={:g}: Python workers write progress pages only on the backend \"ddp\" "
      "(import ddp_torch); on another backend the only hang ddprun can see is a rank still "
      "running {:g} s after every other rank exited 0 (it is ended); a collective that never "
      "completes and a rank stuck in its own code are not seen (torch's collective timeouts "
      "and TORCHELASTIC_ENABLE_FILE_TIMER cover those)",
      s, s));
}

void HangResponse::begin_round() {
  last_hang_.clear();
  ended_hung_workers_ = false;
  saw_unreachable_ = false;
}

void HangResponse::respond(const ProgressWatch::Verdict& verdict) {
  last_hang_ = verdict.hang.summary;
  std::vector<Worker*> culprits;
  for (int local_rank : verdict.report_only ? std::vector<int>{} : verdict.local_culprits) {
    for (auto& w : group_.workers()) {
      if (w.local_rank == local_rank && w.running) culprits.push_back(&w);
    }
  }
  const Incident incident = incident_of(verdict, culprits);
  const std::string path = report_incident(incident);
  std::string text = format_incident(incident);
  if (!path.empty()) text += "ddprun: incident written to " + path + "\n";
  note_incident(verdict, path, std::move(text));
  if (culprits.empty()) return;
  ended_hung_workers_ = true;
  saw_unreachable_ = !verdict.unreachable.empty();
  if (options_.watch.on_hang == WatchOptions::OnHang::kFail) fail_without_restart_ = true;
  for (Worker* w : culprits) {
    w->ended_by_agent = "ended by ddprun after a hang: " + verdict.hang.summary +
                        (path.empty() ? std::string() : " (incident: " + path + ")");
    group_.signal(*w, group_.python() ? SIGABRT : SIGKILL);
  }
}

// The incident as this node sees it, with the stacks of its culprits.
Incident HangResponse::incident_of(const ProgressWatch::Verdict& verdict,
                                   const std::vector<Worker*>& culprits) const {
  Incident incident;
  incident.hang = verdict.hang;
  incident.timeout = verdict.timeout;
  incident.node = group_.round_info().group_rank;
  incident.host = options_.hostname;
  incident.round = group_.round_info().round;
  incident.attempt = group_.attempt();
  incident.ranks = watch_.ranks();
  incident.unreachable = verdict.unreachable;
  for (const auto& line : verdict.disputed) incident.notes.push_back("not ended: " + line);
  incident.action = action_of(verdict, culprits);
  for (const Worker* w : culprits) {
    StackDump dump = collect_native_stacks(w->pid, options_.watch.stack_timeout);
    incident.stacks[w->rank] = Incident::Stacks{dump.tool, dump.text, dump.error};
    if (group_.python()) {
      incident.notes.push_back("rank " + std::to_string(w->rank) +
                               " is a Python worker: ended with SIGABRT, its faulthandler "
                               "prints every thread's Python traceback into its log");
    }
  }
  return incident;
}

// What this node does about the hang, as the incident says it.
std::string HangResponse::action_of(const ProgressWatch::Verdict& verdict,
                                    const std::vector<Worker*>& culprits) const {
  if (verdict.report_only) {
    return fmt::format(
        "none: reported only ({} may still be working, and the default --hang_timeout=auto "
        "ends no such rank; give --hang_timeout=SECONDS to end it)",
        verdict.hang.kind == Hang::Kind::kNotExiting ? "a rank that does not exit"
                                                     : "ranks that are all in their own code");
  }
  if (culprits.empty()) {
    return verdict.hang.culprits.empty() ? "none: no culprit could be named"
           : !verdict.disputed.empty()   ? "none: this node's own records do not confirm the hang"
                                         : "none on this node: the culprit's node ends it";
  }
  if (options_.watch.on_hang == WatchOptions::OnHang::kFail) return "fail (--on_hang=fail)";
  return group_.job_restarts() < options_.spec.max_restarts
             ? "restart (--on_hang=restart)"
             : "fail (--on_hang=restart, but no restarts are left)";
}

// Writes the incident file; returns its path (empty when it could not be
// written).
std::string HangResponse::report_incident(const Incident& incident) {
  const std::string path =
      write_incident(options_.run_log_dir + "/" + group_.attempt_subdir_name(), incident);
  if (!path.empty()) incident_files_.push_back(path);
  return path;
}

// Tells the events: the printer prints `text`, the live view keeps the incident.
void HangResponse::note_incident(const ProgressWatch::Verdict& verdict, const std::string& path,
                                 std::string text) {
  HangReport hang;
  hang.hang_kind = to_string(verdict.hang.kind);
  hang.summary = verdict.hang.summary;
  hang.culprits = verdict.hang.culprits;
  hang.node = verdict.hang.found_by;
  hang.wall = std::chrono::system_clock::to_time_t(options_.runtime->wall_now());
  hang.file = path;
  hang.text = std::move(text);
  events_.hang(hang);
}

}  // namespace ddp::agent
