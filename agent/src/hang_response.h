// What the agent does about a hang its progress watch found (the verdict):
// every node reports it (the incident report, and its file below the
// attempt's log directory); the culprits' node collects their native stacks
// and ends them (SIGABRT for Python, so that faulthandler prints their
// tracebacks; SIGKILL otherwise). Their exits are then failures like any
// other: --on_hang=restart spends a restart, fail ends the job.
//
// Ownership: borrows the options, the worker group and the events (they must
// outlive it). Blocking: respond() collects stacks (up to
// WatchOptions::stack_timeout per culprit) and writes the incident file.
// Thread-safety: the agent's thread only. Errors: none thrown (a file that
// cannot be written is reported as such).
#pragma once

#include <string>
#include <vector>

#include "ddp/agent/agent_events.h"
#include "ddp/agent/worker_spec.h"
#include "incident.h"
#include "progress_watch.h"
#include "worker_group.h"

namespace ddp::agent {

class HangResponse {
 public:
  HangResponse(const AgentOptions& options, const ProgressWatch& watch, WorkerGroup& group,
               AgentEvents& events);

  // With an explicit --hang_timeout and Python workers (they write no progress
  // pages): says which hangs can be seen and which cannot.
  void say_what_hangs_are_seen() const;

  // A round begins: nothing of the last one's hang is kept.
  void begin_round();

  // Reports the hang and ends this node's culprits (unless report-only).
  void respond(const ProgressWatch::Verdict& verdict);

  // The summary of the hang found in this round; empty: none.
  const std::string& last_hang() const { return last_hang_; }
  // This node ended hung workers in this round (its end of the round says so).
  bool ended_hung_workers() const { return ended_hung_workers_; }
  // Some node was unreachable when this node found the hang it acted on.
  bool saw_unreachable() const { return saw_unreachable_; }
  // A hang under --on_hang=fail: the next failure ends the job.
  bool fail_without_restart() const { return fail_without_restart_; }
  // Every incident file written.
  const std::vector<std::string>& incident_files() const { return incident_files_; }

 private:
  Incident incident_of(const ProgressWatch::Verdict& verdict,
                       const std::vector<Worker*>& culprits) const;
  std::string action_of(const ProgressWatch::Verdict& verdict,
                        const std::vector<Worker*>& culprits) const;
  std::string report_incident(const Incident& incident);
  void note_incident(const ProgressWatch::Verdict& verdict, const std::string& path,
                     std::string text);

  const AgentOptions& options_;
  const ProgressWatch& watch_;
  WorkerGroup& group_;
  AgentEvents& events_;
  std::string last_hang_;
  bool ended_hung_workers_ = false;
  bool saw_unreachable_ = false;
  bool fail_without_restart_ = false;
  std::vector<std::string> incident_files_;
};

}  // namespace ddp::agent
