#include "dynamic_rendezvous.h"

#include <algorithm>

#include "ddp/common/error.h"
#include "ddp/common/text.h"
#include "job_counts_store.h"
#include "round_control.h"
#include "run_claim.h"

namespace ddp::rendezvous_detail {
namespace {

// Waits on another thread are bounded so that a lost wake-up costs at most this.
constexpr Duration kMaxWait = std::chrono::seconds(5);

// Where a round's workers may reach their store: the agents' store, or (an
// external one) the built-in one its group rank 0 serves.
WorkerStores worker_stores(const RendezvousStore& store) {
  return {store.host(), store.port(), store.worker_store_port()};
}

// Time left, up to the next tenth of a second ("600", not "599.999").
std::string seconds_left(Duration d) {
  return seconds_text(Duration((std::max(Duration(0), d).count() + 99) / 100 * 100));
}

}  // namespace

DynamicRendezvous::DynamicRendezvous(const RendezvousParams& params, RendezvousStore store,
                                     const Runtime& runtime, std::string backend)
    : params_(params), store_(std::move(store)), time_(runtime), backend_(std::move(backend)),
      keys_(params.run_id), rules_{RoundRule{params.min_nodes, params.max_nodes},
                                   params.join_timeout, params.last_call_timeout,
                                   params.keep_alive_interval * params.keep_alive_max_attempt},
      liveness_(Liveness::create(store_.client_if_made().get(),
                                 LivenessSettings{keys_.prefix(), params.keep_alive_interval,
                                                  params.keep_alive_max_attempt, &runtime})) {
  if (!store_.has_store()) throw InvalidArgument(kDynamicOrigin, "no store given");
  if (params_.min_nodes < 1 || params_.max_nodes < params_.min_nodes) {
    throw InvalidArgument(kDynamicOrigin, "bad node range " + std::to_string(params_.min_nodes) +
                                              ":" + std::to_string(params_.max_nodes));
  }
  if (params_.local_world_size < 1)
    throw InvalidArgument(kDynamicOrigin, "local world size must be at least 1");
  if (params_.keep_alive_interval.count() <= 0 || params_.keep_alive_max_attempt < 1) {
    throw InvalidArgument(kDynamicOrigin,
                          "keep_alive_interval must be positive and keep_alive_max_attempt "
                          "at least 1");
  }
}

DynamicRendezvous::~DynamicRendezvous() {
  liveness_->unwatch();
  if (liveness_worker_) liveness_worker_->stop(std::chrono::seconds(1));
}

void DynamicRendezvous::observe_keep_alives(const std::function<void(KeepAliveProbe)>& observer) {
  observer([liveness = liveness_, &time = time_]() -> std::optional<KeepAliveView> {
    try {
      return liveness->watched(time.now());
    } catch (const std::exception&) {
      return std::nullopt;
    }
  });
}

std::string DynamicRendezvous::store_name() const { return store_.name(); }

std::optional<JobCounts> DynamicRendezvous::job_counts() {
  if (params_.max_nodes == 1) return std::nullopt;  // no store round trip for a single node
  return read_job_counts(*store_.client(), keys_.counts());
}

JobCounts DynamicRendezvous::count_round_end(const JobCounts& mine, int round,
                                             const RoundEndCount& how) {
  if (params_.max_nodes == 1) return counted(mine, round, how);
  return rendezvous_detail::count_round_end(*store_.client(), keys_.counts(), round, how);
}

std::shared_ptr<Store> DynamicRendezvous::store() { return store_.client(); }

std::shared_ptr<Store> DynamicRendezvous::open_store() { return store_.open(); }

std::uint16_t DynamicRendezvous::worker_master_port() const {
  return params_.worker_master_port != 0 ? params_.worker_master_port : find_free_port();
}

// ---- joining ---------------------------------------------------------------------------------

std::unique_ptr<Round> DynamicRendezvous::join() {
  if (params_.max_nodes == 1) {  // nobody to meet: no store round trip at all
    return std::make_unique<StoreRound>(solo_round(), *this, /*solo=*/true, kDynamicOrigin);
  }
  start_liveness();
  begin_join();
  for (;;) {
    if (auto info = step()) {
      const int nodes = info->group_world_size;
      // The agents' store this node hosts, or (etcd) the workers' store of
      // group rank 0, is used by every node of the round.
      const bool serves = store_.served_here() || (store_.is_external() && info->group_rank == 0);
      std::function<bool()> needed;
      if (serves) needed = [this] { return others_alive(); };
      return std::make_unique<StoreRound>(
          std::move(*info), *this, /*solo=*/false, kDynamicOrigin,
          [this, nodes] { return membership_grace(nodes); }, std::move(needed));
    }
    wait_for_change();
  }
}

RendezvousInfo DynamicRendezvous::solo_round() {
  Decision alone;
  alone.nodes = 1;
  alone.world = params_.local_world_size;
  alone.considered = 1;
  alone.master_addr = params_.local_addr;
  alone.master_port = worker_master_port();
  alone.store_port = store_.worker_store_port();
  const int round = ++last_round_;
  RendezvousInfo info = round_info(round, round_prefix(round) + "_" + member(), alone, Assignment{},
                                   member(), worker_stores(store_));
  info.local_world_sizes = {params_.local_world_size};
  return info;
}

void DynamicRendezvous::begin_join() {
  Store& s = *store();
  liveness_->unwatch();  // this node has left its round: nobody to judge
  if (last_round_ < 0) claim_run_id(s, keys_, params_, *liveness_, store_name());
  // Declared dead while it could not be heard (a partition that healed, a
  // frozen process): it comes back as a new member, never as the old one.
  bool declared_lost = false;
  if (last_round_ >= 0) {
    const auto end = read_end(s, round_prefix(last_round_));
    declared_lost = end && end->kind == RoundEnd::Kind::kNodeLost && end->member == member();
  }
  liveness_->enter(s, declared_lost);
  const auto current = read_current(s, keys_);
  const int current_round = current ? current->round : -1;
  const int round = std::max(current_round, last_round_) + 1;
  if (round > kMaxRound) {  // the next reader would refuse P/current
    throw ProtocolError(kDynamicOrigin, "run '" + params_.run_id + "' has reached round " +
                                            std::to_string(round - 1) +
                                            ", the last one a run may have: use another --rdzv_id");
  }
  arrive(round);
  join_.deadline = time_.now() + params_.join_timeout;
  // A round is running (or just ended) that this node is not part of.
  if (current && current_round == round - 1 && last_round_ != current_round) {
    if (auto end = try_get(s, RunKeys::end(round_prefix(current_round)))) {
      if (auto parsed = parse_round_end(*end); parsed && parsed->ends_the_job()) {
        throw ShutdownError(kDynamicOrigin, "run '" + params_.run_id + "' already ended (" +
                                                describe(*parsed) + ")");
      }
    } else {
      admit_or_wait_behind(current_round, current->nodes);
    }
  }
}

void DynamicRendezvous::arrive(int round) {
  Store& s = *store();
  const std::string r = round_prefix(round);
  const std::int64_t index = take_arrival_index(s, r);
  // Between the index and the record this node may be killed: the decider
  // then waits kRecordGrace for the record and forms without it.
  Arrival mine;
  mine.member = member();
  mine.node_rank = params_.node_rank;
  mine.local_world_size = params_.local_world_size;
  mine.master_port = worker_master_port();
  mine.store_port = store_.worker_store_port();
  mine.addr = params_.local_addr;
  s.set(RunKeys::record(r, index), encode_arrival(mine));
  join_ = start_join(rules_, round, index, join_.deadline, time_.now());
  spare_.reset();
}

std::optional<RendezvousInfo> DynamicRendezvous::step() {
  Store& s = *store();
  const std::string r = round_prefix(join_.round);
  const auto now = time_.now();
  if (auto decision = read_decision(s, r)) return on_closed(*decision);
  if (spare_) {
    auto end = spare_->look(s, *liveness_, now);
    if (!end) {
      note_wait(now);
      return std::nullopt;
    }
    if (auto parsed = parse_round_end(*end); parsed && parsed->ends_the_job()) {
      throw ShutdownError(kDynamicOrigin, "the job ended while this node waited as a spare (" +
                                              describe(*parsed) + ")");
    }
    // A member left: the round this node waits in forms now, within join_timeout.
    spare_.reset();
    join_.deadline = now + params_.join_timeout;
    join_.fallback_at = fallback_after(rules_, now);
  }
  if (may_decide(join_, now) && decide()) {
    if (auto decision = read_decision(s, r)) return on_closed(*decision);
  }
  if (timed_out(join_, now)) {
    throw TimeoutError(kDynamicOrigin, "round " + std::to_string(join_.round) + " of run '" +
                                           params_.run_id +
                                           "': " + std::to_string(count_arrivals(s, r)) +
                                           " of at least " + std::to_string(params_.min_nodes) +
                                           " nodes joined within the join timeout of " +
                                           seconds_text(params_.join_timeout) + " s");
  }
  note_wait(now);
  return std::nullopt;
}

void DynamicRendezvous::note_wait(Clock::time_point now) {
  if (!wait_note_) return;
  enum Kind { kSpare, kBelowMin, kLastCall };
  const std::string nnodes =
      "--nnodes=" + std::to_string(params_.min_nodes) + ":" + std::to_string(params_.max_nodes);
  const int round = join_.round;
  Kind kind = kBelowMin;
  std::int64_t joined = 0;
  if (spare_) {
    kind = kSpare;
  } else {
    joined = count_arrivals(*store(), round_prefix(round));
    if (joined >= params_.min_nodes) kind = kLastCall;
  }
  if (wait_told_ == std::make_pair(round, static_cast<int>(kind))) return;
  wait_told_ = std::make_pair(round, static_cast<int>(kind));
  std::string line;
  switch (kind) {
    case kSpare:
      line = "the running round has the most nodes " + nnodes +
             " allows: this node waits as a spare until a member leaves or the job ends";
      break;
    case kBelowMin:
      line = "waiting for nodes to join round " + std::to_string(round) + ": " +
             std::to_string(joined) + " of at least " + std::to_string(params_.min_nodes) + " (" +
             nnodes + ") so far; giving up in " +
             seconds_left(std::chrono::duration_cast<Duration>(join_.deadline - now)) +
             " s (join_timeout)";
      break;
    case kLastCall: {
      // The decider's own last call; another node's is at most as long.
      const auto ends = join_.last_call.deadline();
      const Duration left = ends == Clock::time_point::max()
                                ? std::chrono::duration_cast<Duration>(params_.last_call_timeout)
                                : std::chrono::duration_cast<Duration>(ends - now);
      line = std::to_string(joined) + (joined == 1 ? " node has" : " nodes have") +
             " joined round " + std::to_string(round) + " (" + nnodes + "): waiting up to " +
             seconds_left(left) + " s (last_call_timeout) for more before it starts";
      break;
    }
  }
  wait_note_(line);
}

bool DynamicRendezvous::decide() {
  Store& s = *store();
  const std::string r = round_prefix(join_.round);
  const auto now = time_.now();
  const int count =
      std::max(considered_arrivals(count_arrivals(s, r)), static_cast<int>(join_.arrivals.size()));
  const std::vector<int> wanted = records_to_read(join_, count, now);
  const auto records = read_records(s, r, wanted);
  for (std::size_t k = 0; k < wanted.size(); ++k) note_record(join_, wanted[k], records[k], now);
  if (awaiting_record(join_, now)) return false;
  if (!join_.lineage) join_.lineage = read_lineage(s, keys_, join_.round - 1);
  const auto plan = plan_round(join_, rules_, count, now);
  if (!plan) return false;
  if (publish(s, r, *plan)) {
    s.set(keys_.current(), encode_current({join_.round, plan->decision.nodes}));
    if (join_.round >= 2) forget_round(join_.round - 2);
  }
  return true;
}

std::optional<RendezvousInfo> DynamicRendezvous::on_closed(const Decision& c) {
  Store& s = *store();
  const std::string r = round_prefix(join_.round);
  if (join_.index >= c.considered) {
    on_late(c.nodes);
    return std::nullopt;
  }
  const std::string key = RunKeys::assignment(r, c.decider, join_.index);
  const Assignment a = parse_assignment(s.get(key, std::chrono::seconds(10)), key, c);
  if (a.spare) {
    on_late(c.nodes);
    return std::nullopt;
  }
  RendezvousInfo info = round_info(join_.round, r, c, a, member(), worker_stores(store_));
  last_round_ = join_.round;
  last_nodes_ = c.nodes;
  members_key_ = RunKeys::members(r, c.decider);
  others_.reset();
  others_seen_.clear();
  liveness_->unwatch();
  if (c.nodes > 1) liveness_->watch(store(), r, a.watched_rank, a.watched_member);
  return info;
}

void DynamicRendezvous::on_late(int nodes) {
  const int round = join_.round;
  arrive(round + 1);
  admit_or_wait_behind(round, nodes);
}

void DynamicRendezvous::admit_or_wait_behind(int round, int nodes) {
  // Round `round` runs with `nodes` nodes, without this one. Below max it
  // re-forms at once to admit it; a full one is waited behind, as a spare.
  if (nodes >= params_.max_nodes) {
    spare_.emplace(keys_, round);
    return;
  }
  RoundEnd joined;
  joined.kind = RoundEnd::Kind::kNodeJoined;
  joined.member = member();
  end_round_once(*store(), round_prefix(round), joined);
}

void DynamicRendezvous::wait_for_change() {
  if (spare_) {  // nothing forms while the full round runs
    spare_->wait(*store(), kMaxWait);
    return;
  }
  const auto now = time_.now();
  const Wake wake = next_wake(join_, rules_, now);
  const std::string r = round_prefix(join_.round);
  const std::string key =
      wake.kind == Wake::Kind::kRecord ? RunKeys::record(r, wake.index) : RunKeys::closed(r);
  const auto left =
      std::clamp(std::chrono::duration_cast<Duration>(wake.until - now), Duration(1), kMaxWait);
  try {
    store()->wait({key}, left);
  } catch (const TimeoutError&) {
  }
}

Duration DynamicRendezvous::membership_grace(int group_world_size) {
  if (group_world_size <= 1) return Duration(0);
  try {
    Store& s = *store();
    const std::string me = member();
    std::vector<std::string> others;
    for (const auto& m : parse_members(s.get(members_key_, Duration(0)), members_key_)) {
      if (m != me) others.push_back(m);
    }
    return liveness_->grace_for_membership_change(s, others);
  } catch (const std::exception&) {
    // A member's key is gone or the store does not answer: let the watch decide.
  }
  return params_.keep_alive_interval * (params_.keep_alive_max_attempt + 1);
}

bool DynamicRendezvous::others_alive() {
  Store& s = *store();
  if (!others_) {
    others_.emplace();
    const std::string me = member();
    for (const auto& m : parse_members(s.get(members_key_, Duration(0)), members_key_)) {
      if (m != me) others_->push_back(m);
    }
  }
  return !others_->empty() && liveness_->any_alive_now(s, *others_, time_.now(), others_seen_);
}

int DynamicRendezvous::num_nodes_waiting() {
  if (params_.max_nodes == 1 || last_round_ < 0) return 0;
  return considered_arrivals(count_arrivals(*store(), round_prefix(last_round_ + 1)));
}

// ---- liveness and leaving ---------------------------------------------------------------------

void DynamicRendezvous::start_liveness() {
  if (liveness_worker_) return;
  // Its own store handle: a TcpStore serializes calls, and the agent's may
  // block in a rendezvous wait.
  StoreOpener opener = store_.liveness_opener();
  auto handle = std::make_shared<OwnStoreHandle>(opener ? nullptr : store(), std::move(opener));
  liveness_worker_ = std::make_unique<BackgroundWorker>(
      tick_period(params_.keep_alive_interval),
      [liveness = liveness_, handle] {
        Store& own = handle->get();  // a store that cannot be opened ends the worker
        try {
          liveness->tick(own);
        } catch (const std::exception&) {
          // The store is unreachable for now: the round's watcher reports a
          // lost store; a keep-alive that could not be written is a missed one.
        }
      },
      time_);
}

void DynamicRendezvous::forget_round(int round) {
  // Off the decider's way (2N keys are deleted one by one), on a store handle
  // of its own; nobody waits for it, and a store gone or refusing leaves
  // nothing to delete.
  OwnStoreHandle handle(store_.opener() ? nullptr : store(), store_.opener());
  BackgroundCall forget(
      [handle, r = round_prefix(round)]() mutable { delete_round_keys(handle.get(), r); }, time_);
}

void DynamicRendezvous::shutdown(std::chrono::milliseconds deadline) {
  const auto until = time_.now() + deadline;
  if (liveness_worker_) liveness_worker_->stop(deadline);
  // A single node never touched the store. A node that never joined a round
  // (refused, timed out) only takes its keep-alive key away.
  if (params_.max_nodes == 1) return;
  const auto left = std::chrono::duration_cast<Duration>(until - time_.now());
  if (left <= Duration(0) || !store_.client_if_made()) return;
  // On a thread of its own, which owns all it touches, so that a frozen store
  // cannot hold the exit past the deadline. It uses the handle the agent used
  // (opening another could wait for a store whose host left first), and drops
  // it before it reports done: the store's destructor then runs there, in
  // time, and takes away what the client left (an EtcdStore's marker; ddprun
  // leaves through _exit, which runs none).
  auto leave = liveness_->leave();
  std::shared_ptr<Store> store = store_.release_client();
  const int nodes = last_nodes_;
  BackgroundCall cleanup(
      [store, leave, keys = keys_, last = last_round_, nodes]() mutable {
        try {
          leave(*store);
          leave_job(*store, keys, last, nodes);
        } catch (const std::exception&) {
        }
        try {
          store.reset();  // the last reference, unless a round's end is still being written
        } catch (const std::exception&) {
        }
      },
      time_);
  cleanup.wait_for(left);
}

}  // namespace ddp::rendezvous_detail
