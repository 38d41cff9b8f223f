// How a running round ends, as every agent of it learns it. The agent keeps the
// state machine (run, restart, re-form, stop); the rendezvous layer owns how an
// end is told and seen (a key in the store, heartbeats, a lost store).
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "ddp/common/time.h"

namespace ddp {

struct RoundEnd {
  enum class Kind {
    kRestart,     // a worker of node `node` failed; `value` is its exit code
    kAbort,       // the agent of node `node` got signal `value` and stops the job
    kDone,        // every node's workers succeeded (all passed the exit barrier)
    kNodeLost,    // node `node` missed its keep-alives; `member` names it (dynamic)
    kNodeJoined,  // a node waits to join and the group is below max (dynamic)
    kStoreLost,   // the store could not be reached; `detail` says why
  };
  Kind kind = Kind::kDone;
  int node = -1;
  int value = 0;
  // The member id of a lost or joining node (dynamic rendezvous).
  std::string member;
  std::string detail;
  // kRestart and kAbort: the node ended the round over a hang it acted on (it
  // ended a hung worker), and its progress summary in the store carried that
  // hang before this end was written: every node reports the hang from there.
  bool hang = false;

  // Whether the round ends because its membership changed (a node lost or
  // admitted): that does not consume --max_restarts.
  bool membership_change() const { return kind == Kind::kNodeLost || kind == Kind::kNodeJoined; }
  // Whether the round ended so that it leaves nothing for a waiting node to join.
  bool ends_the_job() const { return kind == Kind::kDone || kind == Kind::kAbort; }
};

// The value stored under "<round prefix>/end" ("restart 1 3", "abort 0 15",
// "restart 1 -9 hang", "done", "lost 2 <member>", "joined <member>"), and
// back. parse_round_end returns nullopt for text that is none of these.
std::string encode_round_end(const RoundEnd& end);
std::optional<RoundEnd> parse_round_end(const std::string& text);

// A one-line description for logs and reports ("node 2 was lost (...)").
std::string describe(const RoundEnd& end);

// The round's area of the store for its agents' own use: one key per group
// rank, "<round prefix>/area/<node>", which the agent of that node may write
// while the round runs (and read the others'). What it holds is the agent's
// business, not a rendezvous record; the handlers delete every node's key
// with the round's other keys, without knowing what it holds, so a node that
// died leaves none in the store.
std::string round_area_key(const std::string& round_prefix, int node);

// Watches one round for its end (Round::watch). Destroying
// it stops watching; a watch still blocked in the store is left to finish on
// its own and wakes nobody. Thread-safe.
class RoundWatch {
 public:
  virtual ~RoundWatch() = default;
  // How the round ended, once it has.
  virtual std::optional<RoundEnd> ended() const = 0;
};

// An end being told to the other agents (Round::end).
class PendingEnd {
 public:
  virtual ~PendingEnd() = default;
  // Waits until the store took the end or `deadline` passed. Returns "" when
  // the round's end is set (by us or, first, by another agent), otherwise what
  // went wrong. A call still blocked in the store is abandoned (it owns all it
  // touches and ends on its own).
  virtual std::string wait_until(Clock::time_point deadline) = 0;
};

}  // namespace ddp
