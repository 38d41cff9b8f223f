// Hang detection: pure functions of what the agents know about every rank
// (rank_status.h) and the timeout, so that every node, given the same
// summaries, names the same culprit. No clock is read here: ages come in.
//
// A hang, for timeout T:
//   - kBehind: in some process group, ranks have waited in collective #N for
//     T or longer while others never issued #N (they stay in #N-1 or earlier,
//     inside or outside a collective, or exited). The culprits are the ranks
//     furthest behind.
//   - kStalled: every rank of a group is seen (a page names the group for as
//     many ranks as its size) and none completed a collective of it for T.
//     When every rank has waited in the same collective for T the culprits
//     are all of them (the collective itself does not complete: the network
//     or the backend); when none is in a collective, all of them (nobody
//     issued one for T). A collective the last rank entered less than T ago
//     is no stall, and neither is a group some of whose ranks are not seen
//     yet (still starting, before their page names it).
//   - kNotExiting: a rank still runs T after every other rank exited 0 (also
//     for programs that do not link ddp::worker).
// Thread-safety: none needed (values in, values out).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "rank_status.h"

namespace ddp::agent {

struct Hang {
  enum class Kind { kBehind, kStalled, kNotExiting };
  Kind kind = Kind::kBehind;
  std::vector<int> culprits;  // ranks, ascending
  std::string group;          // the process group ("" for kNotExiting)
  std::uint64_t seq = 0;      // the collective the others wait in (kBehind, kStalled)
  progress::Kind collective = progress::Kind::kNone;
  Millis duration{0};  // how long the group has been stuck
  // kStalled only: no rank of the group is in a collective (every rank is in
  // its own code), as a long evaluation on every rank would look.
  bool in_own_code = false;
  int found_by = -1;  // the node (group rank) whose agent found it
  // One line: what is wrong and who is to blame.
  std::string summary;
  // One line per rank: where it is.
  std::vector<std::string> ranks;
};

const char* to_string(Hang::Kind kind);

// The hang the ranks are in, or nullopt. `timeout` must be positive.
std::optional<Hang> find_hang(const std::vector<RankStatus>& ranks, Millis timeout);

// What this node's own record of one of its running ranks (its progress
// page, and what its launcher knows of the process) says of a claim that the
// rank is a culprit of `hang`, whoever found it. The rules, for timeout T:
//   - kBehind: confirmed when the rank has not issued collective #seq of the
//     group and has neither issued nor completed one of the group for T;
//     contradicted when it issued #seq, or its page has no such group (or no
//     page); otherwise not yet (it did something in the group within T).
//   - kStalled: confirmed when the rank completed no collective of the group
//     for T; otherwise, or without the group, contradicted.
//   - kNotExiting: confirmed when the rank still runs and every other rank of
//     `view` (this node's own ranks as its launcher knows them, the other
//     nodes' as their summaries say) that the hang does not name exited 0 at
//     least T ago; contradicted when one of them still runs or failed; not yet
//     while one exited 0 less than T ago.
// A rank that no longer runs contradicts every claim (there is nothing to end).
struct Confirmation {
  enum class Kind { kConfirmed, kNotYet, kContradicted };
  Kind kind = Kind::kContradicted;
  // What the record shows, for a warning: "its page shows it issued
  // collective #100 of group 'default', the last one 0.0 s ago".
  std::string why;
};
Confirmation confirm_culprit(const Hang& hang, const RankStatus& rank, Millis timeout,
                             const std::vector<RankStatus>& view);

// Whether `hang` cannot be told apart from legitimate work: a rank still
// running after every other exited 0 (not_exiting) may be rank 0 evaluating,
// saving or uploading; a group none of whose ranks is in a collective
// (kStalled, in_own_code) may be every rank evaluating. The default timeout
// (auto) only reports such a hang; an explicit --hang_timeout acts on it.
bool may_be_work(const Hang& hang);

// Where one rank is, for reports: "rank 2 (node 1, host h, pid 42): waits in
// allreduce #17 (4096 bytes) of group 'default' for 5.2 s; 16 completed".
std::string describe_rank(const RankStatus& rank);
// The same without who the rank is, its steps and staleness: "waits in
// allreduce #17 (4096 bytes) of group 'default' for 5.2 s" (the live view's).
std::string rank_position(const RankStatus& rank);

// --hang_timeout: a fixed value, or derived from the steps seen (auto):
// kAutoBeforeWarmup until some rank finished kWarmupSteps synchronized steps,
// then the larger of kAutoFloor and kAutoFactor times the slowest step seen
// since (a generous factor and a floor, as NVIDIA's ft_launcher calibrates).
class HangTimeout {
 public:
  static constexpr Millis kAutoBeforeWarmup = std::chrono::minutes(15);
  static constexpr Millis kAutoFloor = std::chrono::minutes(5);
  static constexpr int kAutoFactor = 10;
  static constexpr std::uint64_t kWarmupSteps = 3;

  // nullopt: auto. Zero: off.
  explicit HangTimeout(std::optional<Millis> fixed) : fixed_(fixed) {}
  bool enabled() const { return !fixed_ || fixed_->count() > 0; }
  bool is_auto() const { return !fixed_; }
  // Takes in the ranks' last step times.
  void observe(const std::vector<RankStatus>& ranks);
  Millis current() const;
  Millis slowest_step() const { return slowest_; }

 private:
  std::optional<Millis> fixed_;
  bool warm_ = false;
  Millis slowest_{0};
};

}  // namespace ddp::agent
