// What the agents know about one worker rank's progress: read from a local
// worker's progress page (progress_page.h) or from another node's summary
// (progress_exchange.h). Plain values; times are ages ("how long ago") so that
// nodes never compare their clocks.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "ddp/worker_contract/progress_page.h"

namespace ddp::agent {

using Millis = std::chrono::milliseconds;

// A text many values share, held once: a node's host name, which each of its
// (up to thousands of) ranks names. Immutable; copies share it.
class SharedText {
 public:
  SharedText() = default;
  SharedText(std::string text)  // NOLINT(google-explicit-constructor): a text is a text
      : text_(std::make_shared<const std::string>(std::move(text))) {}
  SharedText(const char* text) : SharedText(std::string(text)) {}  // NOLINT
  const std::string& str() const {
    static const std::string empty;
    return text_ ? *text_ : empty;
  }
  // The object holding the text (the same for every copy), or null when empty.
  const std::string* held() const { return text_.get(); }
  friend bool operator==(const SharedText& a, const SharedText& b) { return a.str() == b.str(); }
  friend std::ostream& operator<<(std::ostream& out, const SharedText& t) { return out << t.str(); }

 private:
  std::shared_ptr<const std::string> text_;
};

struct GroupStatus {
  std::string name;  // the process group's name ("default" for the world group)
  int size = 0;
  int rank = 0;                 // this worker's rank in the group
  std::uint64_t issued = 0;     // collectives issued (the next sequence number)
  std::uint64_t completed = 0;  // collectives completed
  progress::Kind last_kind = progress::Kind::kNone;  // the last issued
  std::uint64_t last_bytes = 0;
  Millis since_issued{0};     // since the last was issued (0 when none)
  Millis since_completed{0};  // since the last completed, or since the worker started
  Millis waiting{0};          // how long the oldest outstanding one waits (0 when none)

  bool in_collective() const { return issued > completed; }
};

struct RankStatus {
  enum class State { kRunning, kSucceeded, kFailed };
  int rank = 0;
  int local_rank = 0;
  int node = 0;     // group rank of its node
  SharedText host;  // its node's, shared by all of them
  int pid = 0;
  State state = State::kRunning;
  Millis since_exit{0};  // when not running
  Millis since_start{0};
  // The progress page: absent for programs that do not link ddp::worker.
  bool has_page = false;
  std::vector<GroupStatus> groups;
  std::uint64_t steps = 0;
  std::uint64_t no_sync_steps = 0;
  Millis since_step{0};    // since the last step ended (or since start)
  Millis compute{0};       // smoothed compute time of a synchronized step (0: unknown)
  Millis last_wall{0};     // end-to-end time of the last synchronized step (0: unknown)
  Millis mean_compute{0};  // compute time per synchronized step over the round (0: unknown)
  // From another node: its summary is older than its keep-alive period allows.
  bool stale = false;
  Millis summary_age{0};
};

const char* to_string(RankStatus::State state);

}  // namespace ddp::agent
