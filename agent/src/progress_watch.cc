#include "progress_watch.h"

#include <algorithm>

#include <fmt/format.h>

#include "ddp/common/logging.h"

namespace ddp::agent {

ProgressWatch::ProgressWatch(const WatchOptions& options, std::string host, std::string addr,
                             const Runtime& runtime)
    : options_(options), host_(std::move(host)), runtime_(runtime), timeout_(options.hang_timeout),
      addr_(std::move(addr)) {}

ProgressWatch::~ProgressWatch() = default;

void ProgressWatch::begin_round(const RendezvousInfo& info, int local_world_size,
                                std::shared_ptr<Store> store) {
  end_round(/*keep_workers=*/true);  // the agent forgot the last round's workers, or kept them
  info_ = info;
  local_world_size_ = local_world_size;
  reported_ = false;
  undecided_since_.reset();
  found_.reset();
  found_version_ = 0;
  published_states_.clear();
  final_scores_.clear();
  stragglers_ = StragglerWatch();
  if (info.group_world_size > 1 && store && active()) {
    RoundRanks ranks;
    ranks.world_size = info.world_size;
    ranks.node = info.group_rank;
    ranks.base_rank = info.base_rank;
    ranks.local_world_size = local_world_size;
    if (static_cast<int>(info.local_world_sizes.size()) == info.group_world_size)
      ranks.local_world_sizes = info.local_world_sizes;
    exchange_ = std::make_unique<ProgressExchange>(std::move(store), info.round_prefix,
                                                   std::move(ranks), info.group_world_size,
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

std::optional<ProgressWatch::Verdict> ProgressWatch::check(bool final) {
  const auto now = runtime_.now();
  Remote remote = look(now);
  note_stragglers(now);
  timeout_.observe(view_);
  if (reported_ || !timeout_.enabled()) return std::nullopt;
  const Millis timeout = timeout_.current();
  auto hang = find_hang(view_, timeout);
  const bool own = hang.has_value();
  if (own) {
    hang->found_by = info_.group_rank;
    // Without every rank's word a stall cannot be pinned on the ranks that do report.
    const auto known = static_cast<int>(view_.size());
    if (hang->kind == Hang::Kind::kStalled && known < info_.world_size) {
      hang->culprits.clear();
      hang->summary +=
          fmt::format("; {} of {} ranks never reported, so the culprit may be among them",
                      info_.world_size - known, info_.world_size);
    }
  } else if (remote.hang) {
    hang = std::move(remote.hang);
  } else {
    undecided_since_.reset();
    return std::nullopt;
  }
  Verdict verdict;
  verdict.hang = std::move(*hang);
  verdict.timeout = timeout;
  verdict.unreachable = std::move(remote.unreachable);
  verdict.report_only = timeout_.is_auto() && may_be_work(verdict.hang);
  // A culprit's record that neither confirms nor contradicts yet gets a
  // timeout to do either (the hang stays found, or claimed, meanwhile).
  if (!undecided_since_) undecided_since_ = now;
  if (!judge(verdict, final || now - *undecided_since_ >= timeout)) return std::nullopt;
  if (own) {
    found_ = verdict.hang;
    // In the store before the culprit is ended: the others see why their round ends.
    publish(view_local(), false);
    found_version_ = version_;
    if (exchange_ && !exchange_->tick_now(kPublishWait)) {
      log::get("ddprun")->warn("the hang's summary did not reach the store within {} s",
                               kPublishWait.count() / 1000.0);
    }
  }
  for (const auto& line : verdict.disputed) {
    log::get("ddprun")->warn(
        "disagreement: node {}{} names a culprit of a hang ({}) that this node's own record "
        "does not confirm, so it is left running: {}",
        verdict.hang.found_by, own ? " (this node)" : "", to_string(verdict.hang.kind), line);
  }
  reported_ = true;
  return verdict;
}

std::optional<ProgressWatch::Verdict> ProgressWatch::last_look(Millis wait) {
  if (reported_ || !exchange_ || !timeout_.enabled()) return std::nullopt;
  exchange_->tick_now(wait);
  return check(/*final=*/true);
}

bool ProgressWatch::hang_in_store(Millis wait) {
  if (!reported_) return false;
  if (!found_) return true;  // another node's summary carried it
  if (!exchange_) return false;
  if (exchange_->written(found_version_)) return true;
  // A write that failed is not retried until the next publication: publish again.
  publish(view_local(), false);
  exchange_->tick_now(wait);
  return exchange_->written(found_version_);
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
    auto refused = exchange_->refused();
    for (int n = 0; n < info_.group_world_size; ++n) {
      if (n == info_.group_rank) continue;
      auto it = remotes.find(n);
      if (it == remotes.end()) {
        remote.unreachable.push_back(
            refused[n] > 0 ? fmt::format("node {} (its progress summaries were refused)", n)
                           : fmt::format("node {} (no progress summary yet)", n));
        nodes.push_back(NodeSeen{n, false, "", "", false, Millis(0), refused[n]});
        continue;
      }
      const NodeSummary& summary = it->second.summary;
      nodes.push_back(NodeSeen{n, true, summary.host, summary.addr, it->second.stale,
                               it->second.age, refused[n]});
      if (it->second.stale) {
        remote.unreachable.push_back(
            fmt::format("node {} ({}: no new progress summary for {:.1f} s)", n,
                        it->second.summary.host, it->second.age.count() / 1000.0));
      }
      for (auto& r : it->second.summary.ranks) view.push_back(std::move(r));
      // A hang is taken from a current summary only (a stale one speaks of the past).
      if (it->second.summary.hang && !it->second.stale && !remote.hang)
        remote.hang = std::move(it->second.summary.hang);
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
          rank, r.node, r.host.str(), r.pid, StragglerWatch::kThreshold,
          std::chrono::duration_cast<std::chrono::seconds>(StragglerWatch::kWindow).count(),
          r.compute.count() / 1000.0, stragglers_.last_scores().at(rank));
    }
  }
}

bool ProgressWatch::judge(Verdict& verdict, bool final) const {
  std::vector<int> culprits;
  std::vector<std::string> disputed;
  for (const auto& [local_rank, local] : locals_) {
    const auto& named = verdict.hang.culprits;
    if (local.state != RankStatus::State::kRunning ||
        std::find(named.begin(), named.end(), local.rank) == named.end())
      continue;
    // Its record as this look read it.
    const RankStatus* own = nullptr;
    for (const auto& r : view_) {
      if (r.node == info_.group_rank && r.local_rank == local_rank) own = &r;
    }
    Confirmation c;
    if (own != nullptr) c = confirm_culprit(verdict.hang, *own, verdict.timeout, view_);
    if (c.kind == Confirmation::Kind::kConfirmed) {
      culprits.push_back(local_rank);
    } else if (c.kind == Confirmation::Kind::kNotYet && !final) {
      return false;
    } else {
      disputed.push_back(
          fmt::format("rank {} (local rank {}): {}", local.rank, local_rank,
                      c.kind == Confirmation::Kind::kNotYet
                          ? c.why + ", within the timeout, so the hang is not confirmed"
                          : c.why));
    }
  }
  verdict.local_culprits = std::move(culprits);
  verdict.disputed = std::move(disputed);
  return true;
}

void ProgressWatch::publish(const std::vector<RankStatus>& local, bool urgent) {
  if (!exchange_) return;
  NodeSummary mine;
  mine.node = info_.group_rank;
  mine.host = host_.str();
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

std::optional<bool> ProgressWatch::steps_seen() const {
  bool pages = false;
  const auto now = runtime_.now();
  const std::int64_t now_ns = progress::now_ns();
  for (const auto& [local_rank, local] : locals_) {
    if (local.rank < 0 || !local.page) continue;
    const RankStatus r = status_of(local_rank, local, now_ns, now);
    pages = pages || r.has_page;
    if (r.steps > 0) return true;
  }
  for (const auto& r : view_) {
    if (r.node == info_.group_rank) continue;  // read from the pages above
    pages = pages || r.has_page;
    if (r.steps > 0) return true;
  }
  if (!pages) return std::nullopt;
  return false;
}

std::string ProgressWatch::straggler_summary() const {
  std::string text = format_scores(final_scores_, stragglers_.named());
  if (!text.empty() && static_cast<int>(final_scores_.size()) < info_.world_size) {
    text += fmt::format(" (step times of {} of {} ranks)", final_scores_.size(), info_.world_size);
  }
  return text;
}

}  // namespace ddp::agent
