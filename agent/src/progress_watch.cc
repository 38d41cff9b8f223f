#include "progress_watch.h"

#include <fmt/format.h>

#include "ddp/common/logging.h"

namespace ddp::agent {

ProgressWatch::ProgressWatch(const WatchOptions& options, std::string host, std::string addr,
                             const Runtime& runtime)
    : options_(options), host_(std::move(host)), runtime_(runtime), timeout_(options.hang_timeout),
      addr_(std::move(addr)) {}

ProgressWatch::~ProgressWatch() = default;

void ProgressWatch::begin_round(const RendezvousInfo& info, std::shared_ptr<Store> store) {
  end_round(/*keep_workers=*/true);  // the agent forgot the last round's workers, or kept them
  info_ = info;
  reported_ = false;
  found_.reset();
  published_states_.clear();
  final_scores_.clear();
  stragglers_ = StragglerWatch();
  if (info.group_world_size > 1 && store && active()) {
    exchange_ = std::make_unique<ProgressExchange>(std::move(store), info.round_prefix,
                                                   info.group_rank, info.group_world_size,
                                                   options_.exchange_period, runtime_);
  }
}

void ProgressWatch::end_round(bool keep_workers) {
  exchange_.reset();
  if (!keep_workers) {
    locals_.clear();
  } else {
    for (auto it = locals_.begin(); it != locals_.end();) {
      it = it->second.state == RankStatus::State::kRunning ? std::next(it) : locals_.erase(it);
    }
  }
  view_.clear();
  nodes_.clear();
  new_stragglers_.clear();
}

ProgressPageFile* ProgressWatch::prepare(int local_rank) {
  Local& local = locals_[local_rank];
  local = Local{};  // a new worker in this slot
  if (options_.progress_pages) local.page = ProgressPageFile::create();
  return local.page.get();
}

void ProgressWatch::started(int local_rank, int rank, int pid) {
  Local& local = locals_[local_rank];
  local.rank = rank;
  local.pid = pid;
  local.started = runtime_.now();
  if (local.page) local.page->close_fd();
}

void ProgressWatch::kept(int local_rank, int rank) {
  auto it = locals_.find(local_rank);
  if (it == locals_.end()) return;
  it->second.rank = rank;
  // Its groups start afresh: the new round's ages count from now.
  it->second.started = runtime_.now();
}

void ProgressWatch::exited(int local_rank, int status) {
  auto it = locals_.find(local_rank);
  if (it == locals_.end() || it->second.state != RankStatus::State::kRunning) return;
  it->second.state = status == 0 ? RankStatus::State::kSucceeded : RankStatus::State::kFailed;
  it->second.exited = runtime_.now();
}

RankStatus ProgressWatch::status_of(int local_rank, const Local& local, std::int64_t now_ns,
                                    Clock::time_point now) const {
  RankStatus r;
  r.rank = local.rank;
  r.local_rank = local_rank;
  r.node = info_.group_rank;
  r.host = host_;
  r.pid = local.pid;
  r.state = local.state;
  r.since_start = std::chrono::duration_cast<Millis>(now - local.started);
  if (local.state != RankStatus::State::kRunning)
    r.since_exit = std::chrono::duration_cast<Millis>(now - local.exited);
  r.since_step = r.since_start;
  if (local.page) local.page->read(r, now_ns, r.since_start);
  for (auto& g : r.groups) {
    // A page written by a worker that ended stops aging where it ended.
    if (local.state != RankStatus::State::kRunning) g.waiting = Millis(0);
  }
  return r;
}

std::optional<ProgressWatch::Verdict> ProgressWatch::check() {
  const auto now = runtime_.now();
  Remote remote = look(now);
  note_stragglers(now);
  timeout_.observe(view_);
  if (reported_ || !timeout_.enabled()) return std::nullopt;
  const Millis timeout = timeout_.current();
  auto hang = find_hang(view_, timeout);
  if (hang) {
    hang->found_by = info_.group_rank;
    // Without every rank's word a stall cannot be pinned on the ranks that do report.
    const auto known = static_cast<int>(view_.size());
    if (hang->kind == Hang::Kind::kStalled && known < info_.world_size) {
      hang->culprits.clear();
      hang->summary +=
          fmt::format("; {} of {} ranks never reported, so the culprit may be among them",
                      info_.world_size - known, info_.world_size);
    }
    found_ = hang;
    // In the store before the culprit is ended: the others see why their round ends.
    publish(view_local(), false);
    if (exchange_ && !exchange_->tick_now(kPublishWait)) {
      log::get("ddprun")->warn("the hang's summary did not reach the store within {} s",
                               kPublishWait.count() / 1000.0);
    }
  } else if (remote.hang) {
    hang = std::move(remote.hang);
  } else {
    return std::nullopt;
  }
  reported_ = true;
  return verdict_on(std::move(*hang), timeout, std::move(remote.unreachable));
}

std::optional<ProgressWatch::Verdict> ProgressWatch::last_look(Millis wait) {
  if (reported_ || !exchange_ || !timeout_.enabled()) return std::nullopt;
  exchange_->tick_now(wait);
  return check();
}

ProgressWatch::Remote ProgressWatch::look(Clock::time_point now) {
  const std::int64_t now_ns = progress::now_ns();
  std::vector<RankStatus> view;
  for (const auto& [local_rank, local] : locals_) {
    if (local.rank >= 0) view.push_back(status_of(local_rank, local, now_ns, now));
  }
  std::vector<RankStatus::State> states;
  for (const auto& r : view) states.push_back(r.state);
  // An exit goes out at once: another node's not_exiting rule counts from it.
  publish(view, states != published_states_);
  published_states_ = std::move(states);
  Remote remote;
  std::vector<NodeSeen> nodes;
  if (exchange_) {
    auto remotes = exchange_->remotes(now);
    for (int n = 0; n < info_.group_world_size; ++n) {
      if (n == info_.group_rank) continue;
      auto it = remotes.find(n);
      if (it == remotes.end()) {
        remote.unreachable.push_back(fmt::format("node {} (no progress summary yet)", n));
        nodes.push_back(NodeSeen{n, false, "", "", false, Millis(0)});
        continue;
      }
      const NodeSummary& summary = it->second.summary;
      nodes.push_back(
          NodeSeen{n, true, summary.host, summary.addr, it->second.stale, it->second.age});
      if (it->second.stale) {
        remote.unreachable.push_back(
            fmt::format("node {} ({}: no new progress summary for {:.1f} s)", n,
                        it->second.summary.host, it->second.age.count() / 1000.0));
      }
      for (auto& r : it->second.summary.ranks) view.push_back(std::move(r));
      if (it->second.summary.hang && !remote.hang) remote.hang = std::move(it->second.summary.hang);
    }
  }
  view_ = std::move(view);
  nodes_ = std::move(nodes);
  return remote;
}

void ProgressWatch::note_stragglers(Clock::time_point now) {
  if (auto means = straggler_scores(view_, &RankStatus::mean_compute);
      means.size() >= final_scores_.size()) {
    final_scores_ = std::move(means);
  }
  for (int rank : stragglers_.update(now, straggler_scores(view_))) {
    new_stragglers_.push_back(rank);
    for (const auto& r : view_) {
      if (r.rank != rank) continue;
      log::get("ddprun")->warn(
          "straggler: rank {} (node {}, host {}, pid {}) has scored below {:.1f} for {} s: a "
          "step's compute takes {:.3f} s there, {:.2f} of the fastest rank's speed",
          rank, r.node, r.host, r.pid, StragglerWatch::kThreshold,
          std::chrono::duration_cast<std::chrono::seconds>(StragglerWatch::kWindow).count(),
          r.compute.count() / 1000.0, stragglers_.last_scores().at(rank));
    }
  }
}

ProgressWatch::Verdict ProgressWatch::verdict_on(Hang hang, Millis timeout,
                                                 std::vector<std::string> unreachable) const {
  Verdict verdict;
  verdict.hang = std::move(hang);
  verdict.timeout = timeout;
  verdict.unreachable = std::move(unreachable);
  verdict.report_only = timeout_.is_auto() && may_be_work(verdict.hang);
  for (const auto& [local_rank, local] : locals_) {
    for (int culprit : verdict.hang.culprits) {
      if (culprit == local.rank && local.state == RankStatus::State::kRunning)
        verdict.local_culprits.push_back(local_rank);
    }
  }
  return verdict;
}

void ProgressWatch::publish(const std::vector<RankStatus>& local, bool urgent) {
  if (!exchange_) return;
  NodeSummary mine;
  mine.node = info_.group_rank;
  mine.host = host_;
  mine.addr = addr_;
  mine.version = ++version_;
  mine.ranks = local;
  mine.hang = found_;
  exchange_->publish(std::move(mine), urgent);
}

std::vector<RankStatus> ProgressWatch::view_local() const {
  std::vector<RankStatus> local;
  for (const auto& r : view_) {
    if (r.node == info_.group_rank) local.push_back(r);
  }
  return local;
}

std::string ProgressWatch::straggler_summary() const {
  std::string text = format_scores(final_scores_, stragglers_.named());
  if (!text.empty() && static_cast<int>(final_scores_.size()) < info_.world_size) {
    text += fmt::format(" (step times of {} of {} ranks)", final_scores_.size(), info_.world_size);
  }
  return text;
}

}  // namespace ddp::agent
