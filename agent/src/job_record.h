// The job's record: what an agent leaves on disk for after the job, when its
// live view (--status_port) is gone. Beside the printer and the live view it
// is the third AgentEvents of the agent's fan-out, and writes two things into
// the agent's run folder (<log_dir>/<run_id>_<random>/, the agent's own):
//
//  - events.jsonl: every event, one JSON object a line, appended as it
//    happens with one write(2) per line and no buffer in the process, so an
//    agent killed at any moment (SIGKILL) leaves every line it finished
//    writing (the page cache keeps them; a power loss may not). A line holds
//    "time" (UTC, ISO 8601 with milliseconds), "host", "node" (this node's
//    group rank in the round then, null before the first round), "round"
//    (null before the first), "kind" (one of kRecordKinds, named after the
//    AgentEvents method) and the event's fields (docs/using.md, "The job's
//    record"). Bounded: when a line would take the file past
//    Limits::events_bytes, the file is renamed to events.jsonl.1 (replacing
//    an older one) and a fresh events.jsonl begins with a "rotated" line; so
//    the newest events are kept, at most twice the limit on disk.
//  - status.json: the final /status document (job_status.h's status_json,
//    the live view's JSON), written when the job ends (job_ended: done,
//    failed or signalled) to status.json.tmp, synced, then renamed: a reader
//    sees the whole document or none. Bounded by Limits::status_bytes: a
//    longer document loses its "ranks", then "members", then "events"
//    (each emptied, and counted under "omitted").
//
// Ownership: borrows the board (it must outlive the record); owns its
// file. Blocking: each event writes one line to a local file (no fsync); the
// end writes, syncs and renames status.json. Thread-safety: the agent's
// thread only (AgentEvents' contract). Errors: never thrown and never stop
// the job; the first failure to write (an unwritable folder, a full disk)
// calls `warn` once with the path and the reason, and the events file is
// given up from then on.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "ddp/agent/agent_events.h"
#include "job_status.h"

namespace ddp::agent {

// Every "kind" a line of events.jsonl may have.
inline constexpr std::array<std::string_view, 16> kRecordKinds = {
    "notice",          "report",           "joining",    "round_formed",
    "workers_running", "workers_stopping", "node_lost",  "node_joined",
    "worker_exited",   "worker_failed",    "restarting", "hang",
    "recovering",      "recovered",        "job_ended",  "rotated"};

class JobRecord final : public AgentEvents {
 public:
  struct Limits {
    // One events file; with its one rotated copy, twice this on disk (a
    // single line longer than this, impossible with these defaults since
    // fields are cut, would still be written whole).
    std::size_t events_bytes = std::size_t{4} << 20;
    std::size_t status_bytes = std::size_t{1} << 20;
    // A string field of an event (a report, a hang's text) longer than this
    // is cut, ending in "... [N bytes cut]".
    std::size_t field_bytes = std::size_t{64} << 10;
  };

  static constexpr const char* kEventsFile = "events.jsonl";
  static constexpr const char* kRotatedEventsFile = "events.jsonl.1";
  static constexpr const char* kStatusFile = "status.json";

  // Writes into `dir` (created when missing; the files are never opened
  // through a symbolic link); an empty `dir` writes nothing at all. `board`
  // is the live view's: its snapshot becomes status.json at job_ended, so
  // the record must follow the live view in the fan-out. `host` goes on
  // every line.
  JobRecord(std::string dir, std::string host, const JobBoard& board,
            std::function<void(const std::string&)> warn, Limits limits);
  JobRecord(std::string dir, std::string host, const JobBoard& board,
            std::function<void(const std::string&)> warn)
      : JobRecord(std::move(dir), std::move(host), board, std::move(warn), Limits{}) {}
  ~JobRecord() override;
  JobRecord(const JobRecord&) = delete;
  JobRecord& operator=(const JobRecord&) = delete;

  void notice(const std::string& line) override;
  void report(const std::string& text) override;
  void joining() override;
  void round_formed(const RoundFormed& round) override;
  void workers_running() override;
  void workers_stopping() override;
  void membership_changed(const MembershipChange& change) override;
  void worker_exited(const WorkerExit& exit) override;
  void worker_failed(const WorkerExit& exit) override;
  void restarting(const Restart& restart) override;
  void hang(const HangReport& hang) override;
  void recovering(const std::string& why) override;
  void recovered(const std::string& line) override;
  // The last line, then status.json.
  void job_ended(int exit_code) override;

 private:
  class Lines;
  void write_status();
  void failed(const std::string& path, const std::string& reason);

  std::string dir_;
  const JobBoard& board_;
  std::function<void(const std::string&)> warn_;
  Limits limits_;
  std::unique_ptr<Lines> lines_;
  bool warned_ = false;
};

}  // namespace ddp::agent
