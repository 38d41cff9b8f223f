#include "hang_detector.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ddp::agent {
namespace {

std::string seconds(Millis d) { return fmt::format("{:.1f} s", d.count() / 1000.0); }

const GroupStatus* group_of(const RankStatus& rank, const std::string& name) {
  for (const auto& g : rank.groups) {
    if (g.name == name) return &g;
  }
  return nullptr;
}

// "allreduce #17 (4096 bytes)" for the oldest outstanding collective, whose
// kind the page knows only when it is also the last one issued.
std::string collective_name(const GroupStatus& g, std::uint64_t seq) {
  if (seq + 1 == g.issued && g.last_kind != progress::Kind::kNone) {
    return fmt::format("{} #{} ({} bytes)", progress::to_string(g.last_kind), seq, g.last_bytes);
  }
  return fmt::format("collective #{}", seq);
}

std::string where_in_group(const RankStatus& rank, const GroupStatus& g) {
  if (rank.state != RankStatus::State::kRunning) {
    return fmt::format("{} {} ago after issuing {} collectives of group '{}'",
                       rank.state == RankStatus::State::kSucceeded ? "exited 0" : "failed",
                       seconds(rank.since_exit), g.issued, g.name);
  }
  if (g.in_collective()) {
    return fmt::format("waits in {} of group '{}' for {}", collective_name(g, g.completed), g.name,
                       seconds(g.waiting));
  }
  if (g.completed == 0) {
    return fmt::format("has issued no collective of group '{}' in {}", g.name,
                       seconds(g.since_completed));
  }
  return fmt::format("is not in a collective: its last, {} of group '{}', completed {} ago",
                     collective_name(g, g.completed - 1), g.name, seconds(g.since_completed));
}

std::string who(const RankStatus& rank) {
  return fmt::format("rank {} (node {}, host {}, pid {})", rank.rank, rank.node, rank.host.str(),
                     rank.pid);
}

}  // namespace

const char* to_string(RankStatus::State state) {
  switch (state) {
    case RankStatus::State::kRunning:
      return "running";
    case RankStatus::State::kSucceeded:
      return "succeeded";
    case RankStatus::State::kFailed:
      return "failed";
  }
  return "unknown";
}

const char* to_string(Hang::Kind kind) {
  switch (kind) {
    case Hang::Kind::kBehind:
      return "behind";
    case Hang::Kind::kStalled:
      return "stalled";
    case Hang::Kind::kNotExiting:
      return "not_exiting";
  }
  return "unknown";
}

std::string rank_position(const RankStatus& rank) {
  if (!rank.has_page || rank.groups.empty()) {
    if (rank.state == RankStatus::State::kRunning) {
      return rank.has_page ? "running, no process group yet"
                           : "running (no progress page: the program does not link ddp::worker)";
    }
    return fmt::format("{} {} ago",
                       rank.state == RankStatus::State::kSucceeded ? "exited 0" : "failed",
                       seconds(rank.since_exit));
  }
  std::string text = where_in_group(rank, rank.groups.front());
  for (std::size_t i = 1; i < rank.groups.size(); ++i) {
    text += "; " + where_in_group(rank, rank.groups[i]);
  }
  return text;
}

std::string describe_rank(const RankStatus& rank) {
  std::string text = who(rank) + ": " + rank_position(rank);
  if (rank.steps > 0) text += fmt::format("; {} steps", rank.steps);
  if (rank.stale) text += fmt::format(" (as its node reported {} ago)", seconds(rank.summary_age));
  return text;
}

namespace {

using Members = std::vector<std::pair<const RankStatus*, const GroupStatus*>>;

// Ranks of group `name` that waited long in a collective some other rank
// never issued: the ranks that did not issue it are the culprits.
std::optional<Hang> behind_in_group(const std::string& name, const Members& members,
                                    Millis timeout) {
  std::optional<std::uint64_t> waited_seq;
  Millis longest{0};
  progress::Kind kind = progress::Kind::kNone;
  for (const auto& [r, g] : members) {
    if (r->state != RankStatus::State::kRunning || !g->in_collective() || g->waiting < timeout)
      continue;
    if (!waited_seq || g->completed < *waited_seq) {
      waited_seq = g->completed;
      kind = g->completed + 1 == g->issued ? g->last_kind : progress::Kind::kNone;
    }
    longest = std::max(longest, g->waiting);
  }
  if (waited_seq) {
    Hang hang;
    hang.kind = Hang::Kind::kBehind;
    hang.group = name;
    hang.seq = *waited_seq;
    hang.collective = kind;
    hang.duration = longest;
    std::vector<int> waiting;
    for (const auto& [r, g] : members) {
      if (g->issued <= *waited_seq) {
        hang.culprits.push_back(r->rank);
      } else if (g->in_collective()) {
        waiting.push_back(r->rank);
      }
    }
    if (!hang.culprits.empty()) {
      const std::string what = kind == progress::Kind::kNone
                                   ? fmt::format("collective #{}", *waited_seq)
                                   : fmt::format("{} #{}", progress::to_string(kind), *waited_seq);
      hang.summary = fmt::format(
          "rank{} {} never reached {} of group '{}', which rank{} {} {} waited in for {}",
          hang.culprits.size() > 1 ? "s" : "", fmt::join(hang.culprits, ", "), what, name,
          waiting.size() > 1 ? "s" : "", fmt::join(waiting, ", "),
          waiting.size() > 1 ? "have" : "has", seconds(longest));
      return hang;
    }
  }
  return std::nullopt;
}

// No rank of group `name` completed anything for the timeout: all of them wait
// in one collective, or none is in one.
std::optional<Hang> stalled_group(const std::string& name, const Members& members, Millis timeout) {
  Members live;
  for (const auto& m : members) {
    if (m.first->state == RankStatus::State::kRunning) live.push_back(m);
  }
  if (live.size() != members.size() || live.empty()) return std::nullopt;
  // Every rank of the group must be seen: one not seen yet (no page, still
  // starting) may be the one behind, and the others have not stalled.
  if (live.size() < static_cast<std::size_t>(live.front().second->size)) return std::nullopt;
  Millis quiet = Millis::max();
  Millis all_inside = Millis::max();  // how long every rank has been in the collective
  std::size_t inside = 0;
  for (const auto& [r, g] : live) {
    quiet = std::min(quiet, g->since_completed);
    if (g->in_collective()) ++inside;
    all_inside = std::min(all_inside, g->waiting);
  }
  if (quiet < timeout || (inside != 0 && inside != live.size())) return std::nullopt;
  // A collective the last rank entered just now has not stalled, however
  // long the ranks went without completing one before it.
  if (inside != 0 && all_inside < timeout) return std::nullopt;
  Hang hang;
  hang.kind = Hang::Kind::kStalled;
  hang.group = name;
  hang.duration = quiet;
  for (const auto& m : live) hang.culprits.push_back(m.first->rank);
  if (inside == live.size()) {
    const GroupStatus& g = *live.front().second;
    hang.seq = g.completed;
    hang.collective = g.completed + 1 == g.issued ? g.last_kind : progress::Kind::kNone;
    hang.summary = fmt::format(
        "no rank of group '{}' completed a collective for {}: every rank has waited in {} for "
        "{} or more, and it never completes (the backend or the network between the ranks)",
        name, seconds(quiet), collective_name(g, g.completed), seconds(all_inside));
  } else {
    hang.in_own_code = true;
    hang.seq = live.front().second->completed;
    hang.summary = fmt::format(
        "no rank of group '{}' completed a collective for {}, and none is in one: every rank "
        "is stuck in its own code",
        name, seconds(quiet));
  }
  return hang;
}

// A few ranks that do not exit after every other one did.
std::optional<Hang> not_exiting(const std::vector<const RankStatus*>& sorted, Millis timeout) {
  std::vector<int> running;
  int succeeded = 0;
  int failed = 0;
  Millis last_exit = Millis::max();
  for (const auto* r : sorted) {
    switch (r->state) {
      case RankStatus::State::kRunning:
        running.push_back(r->rank);
        break;
      case RankStatus::State::kSucceeded:
        ++succeeded;
        last_exit = std::min(last_exit, r->since_exit);
        break;
      case RankStatus::State::kFailed:
        ++failed;
        break;
    }
  }
  if (!running.empty() && running.size() <= static_cast<std::size_t>(succeeded) && failed == 0 &&
      last_exit >= timeout) {
    Hang hang;
    hang.kind = Hang::Kind::kNotExiting;
    hang.culprits = running;
    hang.duration = last_exit;
    hang.summary =
        fmt::format("rank{} {} still running {} after every other rank exited 0",
                    running.size() > 1 ? "s" : "", fmt::join(running, ", "), seconds(last_exit));
    return hang;
  }
  return std::nullopt;
}

}  // namespace

std::optional<Hang> find_hang(const std::vector<RankStatus>& ranks, Millis timeout) {
  std::vector<const RankStatus*> sorted;
  for (const auto& r : ranks) sorted.push_back(&r);
  std::sort(sorted.begin(), sorted.end(),
            [](const RankStatus* a, const RankStatus* b) { return a->rank < b->rank; });
  auto finish = [&](Hang hang) {
    std::sort(hang.culprits.begin(), hang.culprits.end());
    for (const auto* r : sorted) hang.ranks.push_back(describe_rank(*r));
    return hang;
  };

  // Group by group: the process groups in the order ranks list them.
  std::vector<std::string> names;
  for (const auto* r : sorted) {
    for (const auto& g : r->groups) {
      if (std::find(names.begin(), names.end(), g.name) == names.end()) names.push_back(g.name);
    }
  }
  for (const auto& name : names) {
    Members members;
    for (const auto* r : sorted) {
      if (const GroupStatus* g = group_of(*r, name)) members.emplace_back(r, g);
    }
    if (members.size() < 2) continue;
    if (auto hang = behind_in_group(name, members, timeout)) return finish(std::move(*hang));
    if (auto hang = stalled_group(name, members, timeout)) return finish(std::move(*hang));
  }
  // A few ranks that do not exit after every other one did (checked after
  // the groups: a rank behind in a collective says more).
  if (auto hang = not_exiting(sorted, timeout)) return finish(std::move(*hang));
  return std::nullopt;
}

Confirmation confirm_culprit(const Hang& hang, const RankStatus& rank, Millis timeout,
                             const std::vector<RankStatus>& view) {
  using K = Confirmation::Kind;
  if (rank.state != RankStatus::State::kRunning)
    return {K::kContradicted,
            fmt::format("it {} {} ago", to_string(rank.state), seconds(rank.since_exit))};
  if (hang.kind == Hang::Kind::kNotExiting) {
    std::optional<Confirmation> not_yet;
    for (const auto& r : view) {
      if (std::find(hang.culprits.begin(), hang.culprits.end(), r.rank) != hang.culprits.end())
        continue;
      if (r.state == RankStatus::State::kRunning)
        return {K::kContradicted, fmt::format("rank {} (node {}) still runs too", r.rank, r.node)};
      if (r.state == RankStatus::State::kFailed)
        return {K::kContradicted, fmt::format("rank {} (node {}) failed", r.rank, r.node)};
      if (r.since_exit < timeout)
        not_yet = Confirmation{K::kNotYet, fmt::format("rank {} (node {}) exited 0 only {} ago",
                                                       r.rank, r.node, seconds(r.since_exit))};
    }
    if (not_yet) return *not_yet;
    return {K::kConfirmed, "it still runs after every other rank exited 0"};
  }
  const GroupStatus* g = group_of(rank, hang.group);
  if (g == nullptr) {
    return {K::kContradicted, rank.has_page ? fmt::format("its page has no group '{}'", hang.group)
                                            : std::string("it has no progress page")};
  }
  const std::string done = fmt::format(
      "{} issued and {} completed in group '{}', the last issued {} ago and the last "
      "completed {} ago",
      g->issued, g->completed, g->name, seconds(g->since_issued), seconds(g->since_completed));
  if (hang.kind == Hang::Kind::kStalled) {
    return {g->since_completed >= timeout ? K::kConfirmed : K::kContradicted,
            "its page shows " + done};
  }
  if (g->issued > hang.seq) {
    return {K::kContradicted,
            fmt::format("its page shows it issued collective #{}: {}", hang.seq, done)};
  }
  return {std::min(g->since_issued, g->since_completed) >= timeout ? K::kConfirmed : K::kNotYet,
          "its page shows " + done};
}

bool may_be_work(const Hang& hang) {
  return hang.kind == Hang::Kind::kNotExiting ||
         (hang.kind == Hang::Kind::kStalled && hang.in_own_code);
}

void HangTimeout::observe(const std::vector<RankStatus>& ranks) {
  if (fixed_) return;
  for (const auto& r : ranks) {
    if (r.steps > kWarmupSteps && r.last_wall.count() > 0) {
      warm_ = true;
      slowest_ = std::max(slowest_, r.last_wall);
    }
  }
}

Millis HangTimeout::current() const {
  if (fixed_) return *fixed_;
  if (!warm_) return kAutoBeforeWarmup;
  return std::max(kAutoFloor, slowest_ * kAutoFactor);
}

}  // namespace ddp::agent
