#include "in_place_recovery.h"

#include <algorithm>

#include <fmt/format.h>

#include "ddp/common/logging.h"
#include "ddp/worker_contract/worker_contract.h"

namespace ddp::agent {

InPlaceRecovery::InPlaceRecovery(const AgentOptions& options, const RendezvousParams& params,
                                 WorkerGroup& group, AgentEvents& events)
    : options_(options), params_(params), group_(group), events_(events) {}

bool InPlaceRecovery::keep_workers_through(const RoundEnd& end) {
  WorkerControl& control = group_.control();
  control.poll();
  if (group_.workers().empty()) return false;
  for (const auto& w : group_.workers()) {
    if (!w.running || !control.in_place(w.local_rank)) return false;
  }
  const bool restart = end.kind == RoundEnd::Kind::kRestart;
  if (restart && group_.job_restarts() >= options_.spec.max_restarts) return false;
  const control::Message abort =
      contract::encode(contract::Abort{group_.round_info().round, describe(end)});
  bool failed = false;
  for (auto& w : group_.workers()) {
    const control::Sent sent = group_.tell(w, abort);
    failed = failed || sent == control::Sent::kFull || sent == control::Sent::kRefused;
  }
  if (failed) {
    log::get("ddprun")->warn(
        "a worker could not be told that its round ended: stopping the workers");
    return false;
  }
  recovery_ = Recovery{};
  recovery_->from_round = group_.round_info().round;
  recovery_->why = describe(end);
  recovery_->verdict = options_.runtime->now();
  recovery_->node_lost = end.kind == RoundEnd::Kind::kNodeLost;
  events_.recovering(recovery_->why);
  return true;
}

void InPlaceRecovery::round_formed(const RendezvousInfo& info) {
  if (!recovery_) return;
  recovery_->to_round = info.round;
  recovery_->formed = options_.runtime->now();
}

void InPlaceRecovery::report(bool final) {
  if (!recovery_ || !recovery_->formed || recovery_->reported) return;
  group_.control().poll();
  std::size_t synced = 0;
  std::size_t kept = 0;
  for (const auto& w : group_.workers()) {
    if (!w.kept) continue;
    ++kept;
    if (group_.control().synced(w.local_rank)) ++synced;
  }
  if (!final && synced < kept) return;
  recovery_->reported = true;
  events_.recovered(describe_report());
}

// "in-place recovery from round ... of N workers kept": the verdict, the
// rendezvous, the groups' re-form and the state transfer, as reported.
std::string InPlaceRecovery::describe_report() const {
  const WorkerControl& control = group_.control();
  double build = 0;
  double state_seconds = 0;
  std::int64_t state_bytes = 0;
  int root = -1;
  std::size_t reformed = 0;
  std::size_t synced = 0;
  std::size_t kept = 0;
  for (const auto& w : group_.workers()) {
    if (!w.kept) continue;
    ++kept;
    if (auto r = control.reformed(w.local_rank)) {
      ++reformed;
      build = std::max(build, r->build_seconds);
    }
    if (auto st = control.synced(w.local_rank)) {
      ++synced;
      state_seconds = std::max(state_seconds, st->seconds);
      state_bytes = std::max(state_bytes, st->bytes);
      root = st->root;
    }
  }
  const Recovery& r = *recovery_;
  const double rendezvous = std::chrono::duration<double>(*r.formed - r.verdict).count();
  std::string text = fmt::format("in-place recovery from round {} ({})", r.from_round, r.why);
  if (r.node_lost) {
    text += fmt::format(": verdict after {:.1f} s without keep-alives",
                        std::chrono::duration<double>(params_.keep_alive_interval).count() *
                            params_.keep_alive_max_attempt);
  }
  text += fmt::format("; round {} formed {:.2f} s after the verdict", r.to_round, rendezvous);
  if (reformed > 0) text += fmt::format("; groups re-formed in {:.3f} s", build);
  if (synced > 0) {
    text += fmt::format("; state {:.1f} MiB from rank {} in {:.3f} s", state_bytes / 1048576.0,
                        root, state_seconds);
  } else {
    text += "; no state transfer reported";
  }
  text += fmt::format("; {} of {} workers kept", kept, options_.spec.local_world_size);
  return text;
}

void InPlaceRecovery::finish_report() {
  report(/*final=*/true);
  if (recovery_ && recovery_->formed) recovery_.reset();
}

}  // namespace ddp::agent
