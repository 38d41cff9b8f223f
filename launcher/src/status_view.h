// The terminal view of `ddprun status`: what one or more agents' /status
// documents say of the job, as lines of text no wider than the terminal.
//
//   render_status_view  a pure function of what each URL answered (a parsed
//                       document, or why there is none) and the terminal's
//                       size: the same input gives the same lines.
//
// The job is shown as the most advanced agent sees it (the highest round; the
// first URL among equals), with each rank's figures from its own node's agent
// when that agent answered in the same round, and the keep-alive ages, which
// each agent has only for the node it judges, gathered from every agent of that
// round. An agent that does not answer is listed as such with the node it was
// last seen as.
//
// Thread-safety: pure. Errors: none thrown but std::bad_alloc.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "status_document.h"

namespace ddp::launcher::status {

// What one URL answered this time.
struct AgentAnswer {
  std::string url;
  std::optional<StatusDocument> document;  // absent: `error` says why
  std::string error;
  // What it was last seen as, when it answered before (kept by --watch).
  std::optional<int> last_node;
  std::string last_host;
};

struct ViewSize {
  int width = 100;  // columns; at least 20 are used
  int height = 0;   // rows; 0: as many as the view needs (events and ranks are cut to fit)
};

// The lines of the view, each at most `size.width` columns, without line breaks.
std::vector<std::string> render_status_view(const std::vector<AgentAnswer>& answers,
                                            const ViewSize& size);

// "0.041s", "4.25s", "12.3s", "4m05s", "2h03m"; "-" for none.
std::string duration_text(std::optional<double> seconds);

}  // namespace ddp::launcher::status
