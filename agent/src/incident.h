// A hang incident: what was found (hang_detector.h), every rank's place, the
// culprits' native stacks, and what the agent did about it. Printed to stderr
// with the failure report and written as JSON to the run's log directory.
//
// Blocking: write_incident writes one file. Thread-safety: values only.
// Errors: write_incident returns an empty path (and logs why) when the file
// cannot be written; nothing else fails.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "hang_detector.h"
#include "rank_status.h"

namespace ddp::agent {

struct Incident {
  Hang hang;
  Millis timeout{0};
  int node = 0;  // the reporting node's group rank
  std::string host;
  int round = 0;
  int attempt = 0;
  std::vector<RankStatus> ranks;
  std::vector<std::string> unreachable;
  // Native stacks of this node's culprits, by rank: the text, or why none.
  struct Stacks {
    std::string tool;
    std::string text;
    std::string error;
  };
  std::map<int, Stacks> stacks;
  // What the agent does: "restart", "fail", or "none on this node (the
  // culprit runs on node 1)".
  std::string action;
  // Python workers: where their tracebacks go (faulthandler on SIGABRT).
  std::vector<std::string> notes;
};

// The report for a person: a banner, the summary, one line per rank, the stacks.
std::string format_incident(const Incident& incident);

// Writes <dir>/hang_<attempt>_node<node>.json (created mode 0644 through a
// temporary file and a rename, never through a symbolic link); returns its path.
std::string write_incident(const std::string& dir, const Incident& incident);

}  // namespace ddp::agent
