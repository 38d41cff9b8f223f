// What `ddprun status` reads: the live view's /status document (docs/using.md,
// "The live view"), parsed into a model the terminal view renders. An agent's
// document (kind "agent") becomes an AgentStatus; the ddp-rendezvous daemon's
// (kind "daemon") a DaemonStatus.
//
// The document comes from another process, perhaps another host: nothing in it
// is trusted. Every string of the model has been through ddp::printable() (no
// escape sequence reaches the terminal), nesting is bounded (ddp/common/json.h),
// and a field that is missing or of another type reads as absent (a newer or
// older agent's document still shows what it has). Only a document that is not
// JSON, not an object, or whose `kind` is neither "agent" nor "daemon" is
// refused.
//
// Pure functions; thread-safe. Errors: parse_status_document returns them,
// never throws but std::bad_alloc.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ddp::launcher::status {

struct MemberRow {
  int node = 0;  // group rank in the round the agent reports
  std::string host;
  std::string addr;
  std::vector<int> ranks;
  std::string state;  // self, alive, unreachable, silent, lost
  std::optional<double> last_heard_s;
  std::optional<double> keep_alive_age_s;  // only the node its agent judges
  std::optional<double> lost_after_s;
};

struct RankRow {
  int rank = 0;
  int local_rank = 0;
  int node = 0;
  std::string host;
  long pid = 0;
  std::string state;
  long steps = 0;
  std::optional<double> step_time_s;
  std::optional<double> compute_s;
  std::optional<double> straggler_score;
  bool straggler = false;
  std::optional<double> last_progress_s;
  std::string where;
  bool stale = false;
};

struct EventRow {
  std::string time;  // ISO 8601, the agent's clock
  double age_s = 0;
  int round = -1;
  std::string kind;
  std::string text;
};

struct IncidentRow {
  std::string hang_kind;
  std::string summary;
  std::vector<int> culprits;
  int node = 0;
  std::string time;
  std::string file;
};

struct RoundRow {
  int number = -1;
  int attempt = 0;
  int world_size = 0;
  int group_world_size = 0;
  int base_rank = 0;
  double formed_s_ago = 0;
};

// An agent's view of the job.
struct AgentStatus {
  std::string run_id;
  std::string backend;
  std::string time;
  double uptime_s = 0;
  std::string state;  // rendezvous, running, stopping, restarting, succeeded, failed
  double state_s = 0;
  bool ready = false;
  std::string ready_reason;
  std::string host;
  std::string addr;
  std::optional<int> group_rank;  // absent before the first round
  long pid = 0;
  int min_nodes = 0;
  int max_nodes = 0;
  int nproc_per_node = 0;
  std::optional<RoundRow> round;
  int restarts_spent = 0;
  int max_restarts = 0;
  int membership_changes = 0;  // the job's re-formations for a node lost or admitted
  std::map<std::string, long> restarts_by_cause;
  std::vector<MemberRow> members;
  std::vector<RankRow> ranks;
  std::vector<EventRow> events;  // oldest first
  std::optional<IncidentRow> incident;
};

// The rendezvous daemon's view of its store.
struct DaemonStatus {
  std::string address;
  std::string state;
  double uptime_s = 0;
  bool ready = false;
  long clients = 0;
  long max_clients = 0;
  long keys = 0;
};

using StatusDocument = std::variant<AgentStatus, DaemonStatus>;

struct ParsedDocument {
  std::optional<StatusDocument> document;
  std::string error;  // why there is none: "not JSON", "a JSON document of kind 'x'", ...
};

// Parses the body of a /status reply.
ParsedDocument parse_status_document(std::string_view body);

}  // namespace ddp::launcher::status
