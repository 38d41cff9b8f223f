#include "dynamic_rendezvous.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <sstream>

#include "ddp/common/error.h"
#include "round_control.h"

namespace ddp::rendezvous_detail {
namespace {

constexpr const char* kOrigin = "c10d rendezvous";

std::string random_member() {
  std::random_device device;
  char text[17];
  std::snprintf(text, sizeof(text), "%08x%08x", device(), device());
  return text;
}

// A round that ended so leaves nothing for a waiting node to join.
bool ends_the_job(const RoundEnd& end) {
  return end.kind == RoundEnd::Kind::kDone || end.kind == RoundEnd::Kind::kAbort;
}

// "4", "0.5": seconds as the user would write them.
std::string seconds_text(Duration d) {
  std::ostringstream out;
  out << static_cast<double>(d.count()) / 1000.0;
  return out.str();
}

// Waits on another thread are bounded so that a lost wake-up costs at most this.
constexpr Duration kMaxWait = std::chrono::seconds(5);
// How often a watched keep-alive is read: a quarter interval, at most every
// 200 ms, so that a death is seen at most that long past its deadline.
Duration tick_period(Duration keep_alive_interval) {
  return std::clamp<Duration>(keep_alive_interval / 4, Duration(1), std::chrono::milliseconds(200));
}

// Round R's arrival counter (R/arrivals): tickets on a LeaseStore (etcd: a
// thousand nodes arriving at once never race), add() on any other store.
// arrive() returns this node's arrival index, arrivals() how many arrived
// (both as counted: anyone may add to the counter; clamp before use).
std::int64_t arrive(Store& s, const std::string& round_prefix) {
  if (auto* leases = dynamic_cast<LeaseStore*>(&s))
    return leases->take_ticket(round_prefix + "/arrivals");
  return s.add(round_prefix + "/arrivals", 1) - 1;
}

std::int64_t arrivals(Store& s, const std::string& round_prefix) {
  if (auto* leases = dynamic_cast<LeaseStore*>(&s))
    return leases->tickets_taken(round_prefix + "/arrivals");
  return s.add(round_prefix + "/arrivals", 0);
}

// How long a decider waits for the record of an arrival whose index was taken:
// a node writes it right after, so a longer silence means the node died in
// between (or the count was bumped by someone else).
constexpr Duration kRecordGrace = std::chrono::seconds(5);
// Records read with one multi_get.
constexpr std::size_t kRecordBatch = 1024;

std::string rec_key(const std::string& round_prefix, std::int64_t index) {
  return round_prefix + "/rec_" + std::to_string(index);
}

// A node's lease lasts as long as the keep-alives it may miss, in whole
// seconds (what etcd counts in); etcd raises it to its own minimum.
std::int64_t lease_ttl(const RendezvousParams& params) {
  const auto ms = (params.keep_alive_interval * params.keep_alive_max_attempt).count();
  return std::max<std::int64_t>(1, (ms + 999) / 1000);
}

}  // namespace

DynamicRendezvous::DynamicRendezvous(const RendezvousParams& params, RendezvousStore store,
                                     const Runtime& runtime, std::string backend)
    : params_(params), store_(std::move(store)), time_(runtime), backend_(std::move(backend)),
      leases_(std::dynamic_pointer_cast<LeaseStore>(store_.store)),
      liveness_(std::make_shared<Liveness>()) {
  if (!store_.store && !store_.opener) throw InvalidArgument(kOrigin, "no store given");
  if (params_.min_nodes < 1 || params_.max_nodes < params_.min_nodes) {
    throw InvalidArgument(kOrigin, "bad node range " + std::to_string(params_.min_nodes) + ":" +
                                       std::to_string(params_.max_nodes));
  }
  if (params_.local_world_size < 1)
    throw InvalidArgument(kOrigin, "local world size must be at least 1");
  if (params_.keep_alive_interval.count() <= 0 || params_.keep_alive_max_attempt < 1) {
    throw InvalidArgument(kOrigin,
                          "keep_alive_interval must be positive and keep_alive_max_attempt "
                          "at least 1");
  }
  liveness_->prefix = prefix();
  liveness_->interval = params_.keep_alive_interval;
  liveness_->time = &time_;
  liveness_->member = random_member();
}

DynamicRendezvous::~DynamicRendezvous() {
  death_watch_.reset();
  stop_liveness(std::chrono::seconds(1));
}

std::string DynamicRendezvous::store_name() const {
  if (!store_.external_name.empty()) return store_.external_name;
  return store_.host + ":" + std::to_string(store_.port);
}

void DynamicRendezvous::set_worker_store(RendezvousInfo& info, const std::string& master_addr,
                                         std::uint16_t master_store_port) const {
  if (store_.worker_store_port == 0) {  // workers share the agents' store
    info.store_addr = store_.host;
    info.store_port = store_.port;
  } else {  // the one group rank 0's agent serves
    info.store_addr = master_addr;
    info.store_port = master_store_port;
  }
}

std::string DynamicRendezvous::member() const {
  std::lock_guard lock(liveness_->mutex);
  return liveness_->member;
}

std::shared_ptr<Store> DynamicRendezvous::store() {
  if (!store_.store) store_.store = store_.opener();
  return store_.store;
}

std::shared_ptr<Store> DynamicRendezvous::open_store() {
  return store_.opener ? store_.opener() : store();
}

std::optional<std::string> DynamicRendezvous::try_get(Store& store, const std::string& key) {
  try {
    return store.get(key, Duration(0));
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
}

// ---- joining ---------------------------------------------------------------------------------

RendezvousInfo DynamicRendezvous::next_rendezvous() {
  if (params_.max_nodes == 1) {  // nobody to meet: no store round trip at all
    RendezvousInfo info;
    info.round = ++last_round_;
    info.group_world_size = 1;
    info.world_size = params_.local_world_size;
    info.local_world_sizes = {params_.local_world_size};
    info.master_addr = params_.local_addr;
    info.master_port = worker_master_port();
    info.instance = member();
    info.round_prefix = round_prefix(info.round) + "_" + info.instance;
    info.worker_prefix = info.round_prefix + "/workers";
    set_worker_store(info, params_.local_addr, store_.worker_store_port);
    return info;
  }
  start_liveness();
  begin_join();
  for (;;) {
    if (auto info = step()) return *info;
    wait_for_change();
  }
}

void DynamicRendezvous::begin_join() {
  Store& s = *store();
  {
    std::lock_guard lock(liveness_->mutex);
    liveness_->watched.reset();  // this node has left its round: nobody to judge
  }
  death_watch_.reset();
  if (last_round_ < 0) claim_run_id();
  if (last_round_ >= 0) {
    // Declared dead while it could not be heard (a partition that healed, a
    // frozen process): it comes back as a new member, never as the old one.
    auto end = try_get(s, round_prefix(last_round_) + "/end");
    auto parsed = end ? parse_round_end(*end) : std::nullopt;
    const std::string old_member = member();
    if (parsed && parsed->kind == RoundEnd::Kind::kNodeLost && parsed->member == old_member) {
      {
        std::lock_guard lock(liveness_->mutex);
        liveness_->member = random_member();
      }
      if (!leases_) s.delete_key(alive_key(old_member));  // a lease's key goes with it
    }
  }
  if (leases_) put_leased_key();
  int current_round = -1, current_nodes = 0;
  if (auto current = try_get(s, prefix() + "current")) {
    const Current c = parse_current(*current, prefix() + "current");
    current_round = c.round;
    current_nodes = c.nodes;
  }
  const int round = std::max(current_round, last_round_) + 1;
  join_round(round);
  join_.deadline = time_.now() + params_.join_timeout;
  // A round is running (or just ended) that this node is not part of.
  if (current_round >= 0 && current_round == round - 1 && last_round_ != current_round) {
    const std::string end_key = round_prefix(current_round) + "/end";
    if (auto end = try_get(s, end_key)) {
      if (auto parsed = parse_round_end(*end); parsed && ends_the_job(*parsed)) {
        throw ShutdownError(
            kOrigin, "run '" + params_.run_id + "' already ended (" + describe(*parsed) + ")");
      }
    } else {
      admit_or_wait_behind(current_round, current_nodes);
    }
  }
}

void DynamicRendezvous::claim_run_id() {
  Store& s = *store();
  const std::string mine =
      params_.job_signature.empty()
          ? "nnodes=" + std::to_string(params_.min_nodes) + ":" + std::to_string(params_.max_nodes)
          : params_.job_signature;
  const std::string key = prefix() + "config";
  std::string held = s.compare_set(key, "", mine);
  if (held == mine) return;
  // Another job's: refused while any of its nodes lives, taken over otherwise.
  // On a LeaseStore (etcd, shared and long-lived) the dead job's keys go in
  // the same step; elsewhere the rounds that follow delete them as they go.
  if (!job_alive()) {
    if (leases_ && leases_->take_over(key, held, mine, prefix())) return;
    held = leases_ ? s.compare_set(key, "", mine) : s.compare_set(key, held, mine);
  }
  if (held == mine) return;
  throw InvalidArgument(kOrigin, "run id '" + params_.run_id + "' is in use on the store at " +
                                     store_name() + " by another running job (" + held +
                                     "); this node runs (" + mine + "): use another --rdzv_id");
}

bool DynamicRendezvous::job_alive() {
  Store& s = *store();
  std::vector<std::string> keys;
  if (auto current = try_get(s, prefix() + "current")) {
    const Current c = parse_current(*current, prefix() + "current");
    for (const auto& m : load_lineage(c.round).members) keys.push_back(alive_key(m));
  } else {  // its first round is forming
    const std::string r = round_prefix(0);
    Join first;
    read_arrivals(s, r, considered_arrivals(arrivals(s, r)), first, time_.now());
    for (const auto& a : first.arrivals) {
      if (a) keys.push_back(alive_key(a->member));
    }
  }
  if (keys.empty()) return false;
  auto read = [&] {
    std::vector<std::optional<std::string>> values;
    for (const auto& key : keys) values.push_back(try_get(s, key));
    return values;
  };
  const auto first = read();
  if (leases_) {  // a leased key exists exactly as long as its node refreshes it
    return std::any_of(first.begin(), first.end(), [](const auto& v) { return v.has_value(); });
  }
  // Counters: alive when one moves within the time that declares a node dead.
  const auto until = time_.now() + params_.keep_alive_interval * params_.keep_alive_max_attempt;
  while (time_.now() < until) {
    time_.sleep_for(tick_period(params_.keep_alive_interval));
    const auto now = read();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (now[i] && now[i] != first[i]) return true;
    }
  }
  return false;
}

void DynamicRendezvous::join_round(int round) {
  Store& s = *store();
  const std::string r = round_prefix(round);
  Join join;
  join.round = round;
  join.last_call = LastCall(params_.min_nodes, params_.last_call_timeout);
  join.deadline = join_.deadline;
  join.index = arrive(s, r);
  // Between the index and the record this node may be killed: the decider
  // then waits kRecordGrace for the record and forms without it.
  Arrival mine;
  mine.member = member();
  mine.node_rank = params_.node_rank;
  mine.local_world_size = params_.local_world_size;
  mine.master_port = worker_master_port();
  mine.store_port = store_.worker_store_port;
  mine.addr = params_.local_addr;
  s.set(rec_key(r, join.index), encode_arrival(mine));
  join.fallback_at = fallback_after(time_.now());
  join_ = std::move(join);
}

std::uint16_t DynamicRendezvous::worker_master_port() const {
  return params_.worker_master_port != 0 ? params_.worker_master_port : find_free_port();
}

bool DynamicRendezvous::may_decide(Clock::time_point now) const {
  // A node past what a round considers (the counter inflated by anyone's
  // add) is late for it: it never decides, whatever the time.
  if (join_.index >= kMaxArrivals) return false;
  return join_.index == 0 || now >= join_.fallback_at;
}

Clock::time_point DynamicRendezvous::fallback_after(Clock::time_point now) const {
  // Another node decides only long after arrival 0 should have (it died).
  return now + params_.last_call_timeout +
         params_.keep_alive_interval * params_.keep_alive_max_attempt;
}

std::optional<RendezvousInfo> DynamicRendezvous::step() {
  Store& s = *store();
  const std::string r = round_prefix(join_.round);
  const auto now = time_.now();
  if (auto closed = try_get(s, r + "/closed")) return on_closed(*closed);
  if (join_.spare_of >= 0) {
    auto end = spare_end_ ? spare_end_ : try_get(s, round_prefix(join_.spare_of) + "/end");
    if (!end) {
      // The last agent to leave deletes the job's keys, "current" included.
      if (!try_get(s, prefix() + "current")) {
        throw ShutdownError(kOrigin, "the job ended while this node waited as a spare");
      }
      // A spare waits as long as the full round runs, and no longer: a round
      // whose nodes all died (a crashed job) has nobody left to end it.
      end = end_if_dead(s, join_.spare_of, now);
      if (!end) return std::nullopt;
    }
    if (auto parsed = parse_round_end(*end); parsed && ends_the_job(*parsed)) {
      throw ShutdownError(
          kOrigin, "the job ended while this node waited as a spare (" + describe(*parsed) + ")");
    }
    // A member left: the round this node waits in forms now, within join_timeout.
    join_.spare_of = -1;
    spare_end_.reset();
    join_.deadline = now + params_.join_timeout;
    join_.fallback_at = fallback_after(now);
  }
  if (may_decide(now) && decide(join_)) {
    if (auto closed = try_get(s, r + "/closed")) return on_closed(*closed);
  }
  if (now >= join_.deadline) {
    const std::int64_t arrived = arrivals(s, r);
    throw TimeoutError(kOrigin, "round " + std::to_string(join_.round) + " of run '" +
                                    params_.run_id + "': " + std::to_string(arrived) +
                                    " of at least " + std::to_string(params_.min_nodes) +
                                    " nodes joined within the join "
                                    "timeout of " +
                                    seconds_text(params_.join_timeout) + " s");
  }
  return std::nullopt;
}

Lineage DynamicRendezvous::load_lineage(int round) {
  Lineage lineage;
  if (round < 0) return lineage;
  Store& s = *store();
  const std::string r = round_prefix(round);
  auto closed = try_get(s, r + "/closed");
  if (!closed) return lineage;
  const Decision c = parse_decision(*closed, r + "/closed");
  const std::string members_key = r + "/members_" + std::to_string(c.decider);
  if (auto members = try_get(s, members_key))
    lineage.members = parse_members(*members, members_key);
  if (auto end = try_get(s, r + "/end")) {
    auto parsed = parse_round_end(*end);
    if (parsed && parsed->kind == RoundEnd::Kind::kNodeLost) lineage.lost = parsed->member;
  }
  return lineage;
}

void DynamicRendezvous::read_arrivals(Store& s, const std::string& r, int count, Join& join,
                                      Clock::time_point now) {
  // The records missing at the last look but still within their grace (one
  // past it is an arrival that did not happen: not read again), then the
  // arrivals not read yet.
  std::vector<int> wanted;
  for (const auto& [i, since] : join.missing) {
    if (now < since + kRecordGrace) wanted.push_back(i);
  }
  for (int i = static_cast<int>(join.arrivals.size()); i < count; ++i) wanted.push_back(i);
  if (static_cast<int>(join.arrivals.size()) < count)
    join.arrivals.resize(static_cast<std::size_t>(count));
  for (std::size_t begin = 0; begin < wanted.size(); begin += kRecordBatch) {
    const std::size_t end = std::min(wanted.size(), begin + kRecordBatch);
    std::vector<std::string> keys;
    for (std::size_t k = begin; k < end; ++k) keys.push_back(rec_key(r, wanted[k]));
    std::vector<std::optional<std::string>> values(keys.size());
    try {
      auto all = s.multi_get(keys, Duration(0));  // one round trip when every record is there
      for (std::size_t k = 0; k < keys.size(); ++k) values[k] = std::move(all[k]);
    } catch (const TimeoutError&) {
      for (std::size_t k = 0; k < keys.size(); ++k) values[k] = try_get(s, keys[k]);
    }
    for (std::size_t k = 0; k < keys.size(); ++k) {
      const int i = wanted[begin + k];
      if (values[k]) {
        join.arrivals[static_cast<std::size_t>(i)] = parse_arrival(*values[k], keys[k]);
        join.missing.erase(i);
      } else {
        join.missing.emplace(i, now);  // keeps the first time it was seen missing
      }
    }
  }
}

bool DynamicRendezvous::decide(Join& join) {
  Store& s = *store();
  const std::string r = round_prefix(join.round);
  const auto now = time_.now();
  const int count =
      std::max(considered_arrivals(arrivals(s, r)), static_cast<int>(join.arrivals.size()));
  read_arrivals(s, r, count, join, now);
  // A missing record may yet come (its node took its index a moment ago):
  // wait for it within its grace; past it, that arrival did not happen.
  for (const auto& [i, since] : join.missing) {
    if (now < since + kRecordGrace) return false;
  }
  std::vector<Arrival> present;
  std::vector<int> index_of;  // present[k] is arrival index_of[k]
  for (int i = 0; i < count; ++i) {
    if (!join.arrivals[static_cast<std::size_t>(i)]) continue;
    present.push_back(*join.arrivals[static_cast<std::size_t>(i)]);
    index_of.push_back(i);
  }
  if (!join.lineage) join.lineage = load_lineage(join.round - 1);
  join.last_call.observe(static_cast<int>(present.size()), now);
  auto chosen =
      decide_round(present, *join.lineage, RoundRule{params_.min_nodes, params_.max_nodes},
                   join.last_call.over(now));
  if (!chosen) return false;

  // Publish the answers first, then the decision that points at them. Every
  // arrival considered gets one ("spare" for those not chosen and those
  // whose record never came).
  Decision d;
  d.decider = static_cast<int>(join.index);
  d.nodes = static_cast<int>(chosen->size());
  d.considered = count;
  std::vector<int> rank_of(static_cast<std::size_t>(count), -1);
  std::vector<int> base_of(static_cast<std::size_t>(count), 0);
  std::vector<std::string> members;
  for (int g = 0; g < d.nodes; ++g) {
    const int i = index_of[static_cast<std::size_t>((*chosen)[static_cast<std::size_t>(g)])];
    const Arrival& a = *join.arrivals[static_cast<std::size_t>(i)];
    rank_of[static_cast<std::size_t>(i)] = g;
    base_of[static_cast<std::size_t>(i)] = d.world;
    d.world += a.local_world_size;  // at most kMaxNodes x kMaxLocalWorldSize: fits
    members.push_back(a.member);
  }
  auto arrival_of_rank = [&](int g) -> const Arrival& {
    return *join.arrivals[static_cast<std::size_t>(
        index_of[static_cast<std::size_t>((*chosen)[static_cast<std::size_t>(g)])])];
  };
  const std::string me = std::to_string(d.decider);
  std::vector<std::string> keys, values;
  for (int i = 0; i < count; ++i) {
    keys.push_back(r + "/assign_" + me + "_" + std::to_string(i));
    Assignment a;
    if (rank_of[static_cast<std::size_t>(i)] < 0) {
      a.spare = true;
    } else {
      a.group_rank = rank_of[static_cast<std::size_t>(i)];
      a.base_rank = base_of[static_cast<std::size_t>(i)];
      a.watched_rank = (a.group_rank + 1) % d.nodes;
      a.watched_member = d.nodes > 1 ? arrival_of_rank(a.watched_rank).member : "";
    }
    values.push_back(encode_assignment(a));
  }
  keys.push_back(r + "/members_" + me);
  values.push_back(encode_members(members));
  s.multi_set(keys, values);
  const Arrival& master = arrival_of_rank(0);
  d.master_addr = master.addr;
  d.master_port = master.master_port;
  d.store_port = master.store_port;
  const std::string decision = encode_decision(d);
  if (s.compare_set(r + "/closed", "", decision) == decision) {
    s.set(prefix() + "current", encode_current({join.round, d.nodes}));
    if (join.round >= 2) forget_round(join.round - 2);
  }
  return true;
}

std::optional<RendezvousInfo> DynamicRendezvous::on_closed(const std::string& text) {
  Store& s = *store();
  const std::string r = round_prefix(join_.round);
  const Decision c = parse_decision(text, r + "/closed");
  if (join_.index >= c.considered) {
    on_late(c.nodes);
    return std::nullopt;
  }
  const std::string key =
      r + "/assign_" + std::to_string(c.decider) + "_" + std::to_string(join_.index);
  const Assignment a = parse_assignment(s.get(key, std::chrono::seconds(10)), key, c);
  if (a.spare) {
    on_late(c.nodes);
    return std::nullopt;
  }
  RendezvousInfo info;
  info.round = join_.round;
  info.group_rank = a.group_rank;
  info.base_rank = a.base_rank;
  info.group_world_size = c.nodes;
  info.world_size = c.world;
  info.master_addr = c.master_addr;
  info.master_port = c.master_port;
  info.round_prefix = r;
  info.worker_prefix = r + "/workers";
  set_worker_store(info, c.master_addr, c.store_port);
  last_round_ = join_.round;
  last_nodes_ = c.nodes;
  members_key_ = r + "/members_" + std::to_string(c.decider);
  if (leases_ && c.nodes > 1) watch_for_death(r, a.watched_rank, a.watched_member);
  {
    std::lock_guard lock(liveness_->mutex);
    info.instance = liveness_->member;
    liveness_->watched.reset();
    if (c.nodes > 1 && !leases_) {
      liveness_->watched.emplace(
          Watched{r, a.watched_rank, a.watched_member,
                  HeartbeatTracker(params_.keep_alive_interval, params_.keep_alive_max_attempt,
                                   time_.now())});
    }
  }
  return info;
}

void DynamicRendezvous::on_late(int nodes) {
  // The round formed without this node: it joins the next one.
  const int round = join_.round;
  join_round(round + 1);
  admit_or_wait_behind(round, nodes);
}

std::optional<std::string> DynamicRendezvous::end_if_dead(Store& s, int round,
                                                          Clock::time_point now) {
  const std::vector<std::string> members = load_lineage(round).members;
  if (members.empty()) return std::nullopt;
  bool any_alive = false;
  for (const auto& m : members) {
    const auto value = try_get(s, alive_key(m));
    if (leases_) {  // a leased key exists exactly as long as its node refreshes it
      any_alive = any_alive || value.has_value();
      continue;
    }
    auto [it, first_look] = spare_watch_.try_emplace(m, params_.keep_alive_interval,
                                                     params_.keep_alive_max_attempt, now);
    it->second.observe(value, now);
    any_alive = any_alive || first_look || !it->second.dead(now);
  }
  if (any_alive) return std::nullopt;
  RoundEnd lost;
  lost.kind = RoundEnd::Kind::kNodeLost;
  lost.node = 0;
  lost.member = members.front();
  return s.compare_set(round_prefix(round) + "/end", "", encode_round_end(lost));
}

void DynamicRendezvous::admit_or_wait_behind(int round, int nodes) {
  // Round `round` runs with `nodes` nodes, without this one. Below max it
  // re-forms at once to admit it; a full one is waited behind, as a spare.
  if (nodes >= params_.max_nodes) {
    join_.spare_of = round;
    spare_watch_.clear();
    return;
  }
  RoundEnd joined;
  joined.kind = RoundEnd::Kind::kNodeJoined;
  joined.member = member();
  store()->compare_set(round_prefix(round) + "/end", "", encode_round_end(joined));
}

void DynamicRendezvous::wait_for_change() {
  const std::string r = round_prefix(join_.round);
  const auto now = time_.now();
  std::string key;
  Clock::time_point until = join_.deadline;
  if (join_.spare_of >= 0) {
    // Nothing forms while the full round runs: wait for its end, and take the
    // value in the same call (at the job's end the store's host leaves at once).
    try {
      spare_end_ = store()->get(round_prefix(join_.spare_of) + "/end", kMaxWait);
    } catch (const TimeoutError&) {
    } catch (const NetworkError& e) {
      throw ShutdownError(kOrigin, std::string("the store went away while this node waited as a "
                                               "spare (the job ended, or its store host died): ") +
                                       e.what());
    }
    return;
  } else if (may_decide(now) && !join_.missing.empty()) {
    // The decider waits for a record whose index was taken, within its grace.
    auto first = std::min_element(join_.missing.begin(), join_.missing.end(),
                                  [](const auto& a, const auto& b) { return a.second < b.second; });
    key = rec_key(r, first->first);
    until = std::min(until, first->second + kRecordGrace);
  } else if (may_decide(now)) {
    // The decider waits for the arrival that can change its decision.
    const int have = static_cast<int>(join_.arrivals.size());
    // The first arrival that can change the decision: min or max nodes in a
    // first round, every survivor in a re-formation (then one by one).
    int wanted = have < params_.min_nodes ? params_.min_nodes : params_.max_nodes;
    if (join_.lineage && !join_.lineage->members.empty()) {
      const int survivors =
          static_cast<int>(join_.lineage->members.size()) - (join_.lineage->lost.empty() ? 0 : 1);
      wanted = std::max(params_.min_nodes, survivors);
    }
    const int next = std::max(have, wanted - 1);
    key = rec_key(r, next);
    until = std::min(until, join_.last_call.deadline());
  } else {
    key = r + "/closed";
    until = std::min(until, join_.fallback_at);
  }
  auto left = std::chrono::duration_cast<Duration>(until - now);
  left = std::clamp(left, Duration(1), kMaxWait);
  try {
    store()->wait({key}, left);
  } catch (const TimeoutError&) {
  }
}

std::chrono::milliseconds DynamicRendezvous::grace_for_membership_change(
    const RendezvousInfo& info) {
  const Duration verdict = params_.keep_alive_interval * (params_.keep_alive_max_attempt + 1);
  if (params_.max_nodes == 1 || info.group_world_size <= 1) return Duration(0);
  try {
    Store& s = *store();
    const std::string me = member();
    std::vector<std::string> keys;
    for (const auto& m : parse_members(s.get(members_key_, Duration(0)), members_key_)) {
      if (m != me) keys.push_back(alive_key(m));
    }
    if (leases_) return lease_grace(keys);
    // Every other member's keep-alive must move within about one interval.
    const auto first = s.multi_get(keys, Duration(0));
    std::vector<bool> moved(keys.size(), false);
    const auto until = time_.now() + params_.keep_alive_interval + params_.keep_alive_interval / 2;
    const auto period = tick_period(params_.keep_alive_interval);
    while (time_.now() < until) {
      time_.sleep_for(period);
      const auto now = s.multi_get(keys, Duration(0));
      bool all = true;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (now[i] != first[i]) moved[i] = true;
        all = all && moved[i];
      }
      if (all) return Duration(0);
    }
  } catch (const std::exception&) {
    // A member's key is gone or the store does not answer: let the watch decide.
  }
  return verdict;
}

std::chrono::milliseconds DynamicRendezvous::lease_grace(const std::vector<std::string>& keys) {
  // A member is alive when its lease's time left rises (it was refreshed);
  // etcd counts it in whole seconds, hence the extra second of patience.
  const Duration verdict = std::chrono::seconds(lease_ttl(params_)) + params_.keep_alive_interval +
                           std::chrono::seconds(1);
  std::vector<LeaseStore::LeaseId> ids;
  const auto values = leases_->multi_get(keys, Duration(0));
  for (std::size_t i = 0; i < values.size(); ++i) ids.push_back(parse_lease_id(values[i], keys[i]));
  std::vector<std::int64_t> lowest;
  for (auto id : ids) {
    lowest.push_back(leases_->lease_time_left(id));
    if (lowest.back() < 0) return verdict;  // already gone: the watch reports it
  }
  std::vector<bool> refreshed(ids.size(), false);
  const auto until = time_.now() + params_.keep_alive_interval * 3 / 2 + std::chrono::seconds(1);
  while (time_.now() < until) {
    time_.sleep_for(tick_period(params_.keep_alive_interval));
    bool all = true;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (refreshed[i]) continue;
      const auto left = leases_->lease_time_left(ids[i]);
      if (left < 0) return verdict;
      refreshed[i] = left > lowest[i];
      lowest[i] = std::min(lowest[i], left);
      all = all && refreshed[i];
    }
    if (all) return Duration(0);
  }
  return verdict;
}

int DynamicRendezvous::num_nodes_waiting() {
  if (params_.max_nodes == 1 || last_round_ < 0) return 0;
  return considered_arrivals(arrivals(*store(), round_prefix(last_round_ + 1)));
}

// ---- the running round --------------------------------------------------------------------------

std::unique_ptr<RoundWatch> DynamicRendezvous::watch_round(const RendezvousInfo& info,
                                                           std::function<void()> wake) {
  if (params_.max_nodes == 1) return inert_watch();
  return watch_end_key(open_store(), info.round_prefix + "/end", std::move(wake),
                       store_.host + ":" + std::to_string(store_.port));
}

std::unique_ptr<PendingEnd> DynamicRendezvous::end_round(const RendezvousInfo& info,
                                                         const RoundEnd& end) {
  if (params_.max_nodes == 1) return nothing_to_tell();
  return set_end_key(store(), info.round_prefix + "/end", encode_round_end(end));
}

void DynamicRendezvous::arrive_at_exit_barrier(const RendezvousInfo& info,
                                               Clock::time_point deadline) {
  if (params_.max_nodes == 1) return;
  rendezvous_detail::arrive_at_exit_barrier(store(), info, deadline, kOrigin);
}

// ---- liveness ---------------------------------------------------------------------------------------

void DynamicRendezvous::liveness_tick(Store& store) { tick(*liveness_, store); }

void DynamicRendezvous::tick(Liveness& l, Store& store) {
  if (auto* leases = dynamic_cast<LeaseStore*>(&store)) return refresh_tick(l, *leases);
  const auto now = l.time->now();
  std::string member, watched_member, watched_round;
  int watched_rank = -1;
  bool write = false;
  std::int64_t beat = 0;
  {
    std::lock_guard lock(l.mutex);
    member = l.member;
    if (now >= l.next_write) {
      write = true;
      beat = ++l.beats;
      l.next_write = now + l.interval;
    }
    if (l.watched) {
      watched_member = l.watched->member;
      watched_round = l.watched->round_prefix;
      watched_rank = l.watched->group_rank;
    }
  }
  if (write) store.set(l.prefix + "alive/" + member, std::to_string(beat));
  if (watched_member.empty()) return;
  const auto value = try_get(store, l.prefix + "alive/" + watched_member);
  bool dead = false;
  {
    std::lock_guard lock(l.mutex);
    if (!l.watched || l.watched->member != watched_member) return;
    l.watched->tracker.observe(value, now);
    dead = l.watched->tracker.dead(now);
    if (dead) l.watched.reset();
  }
  if (!dead) return;
  RoundEnd lost;
  lost.kind = RoundEnd::Kind::kNodeLost;
  lost.node = watched_rank;
  lost.member = watched_member;
  store.compare_set(watched_round + "/end", "", encode_round_end(lost));
}

void DynamicRendezvous::refresh_tick(Liveness& l, LeaseStore& store) {
  LeaseStore::LeaseId lease = 0;
  {
    std::lock_guard lock(l.mutex);
    const auto now = l.time->now();
    if (l.lease == 0 || now < l.next_write) return;
    lease = l.lease;
    l.next_write = now + l.interval;
  }
  if (store.refresh_lease(lease)) return;
  // Expired (this node could not refresh it in time): its key is gone and its
  // round ends; the next join puts a new member id on a new lease.
  std::lock_guard lock(l.mutex);
  if (l.lease == lease) l.lease = 0;
}

void DynamicRendezvous::put_leased_key() {
  std::string member;
  LeaseStore::LeaseId old = 0;
  {
    std::lock_guard lock(liveness_->mutex);
    member = liveness_->member;
    if (liveness_->lease != 0 && liveness_->leased_member == member) return;
    old = liveness_->lease;
  }
  if (old != 0) leases_->revoke_lease(old);  // the old member id's key goes with it
  const auto lease = leases_->grant_lease(std::chrono::seconds(lease_ttl(params_)));
  leases_->set_with_lease(alive_key(member), std::to_string(lease), lease);
  std::lock_guard lock(liveness_->mutex);
  liveness_->lease = lease;
  liveness_->leased_member = member;
  liveness_->next_write = time_.now() + params_.keep_alive_interval;
}

void DynamicRendezvous::watch_for_death(const std::string& round_prefix, int rank,
                                        const std::string& member) {
  const std::string key = alive_key(member);
  RoundEnd lost;
  lost.kind = RoundEnd::Kind::kNodeLost;
  lost.node = rank;
  lost.member = member;
  auto declare = [store = store(), end_key = round_prefix + "/end", text = encode_round_end(lost)] {
    try {
      store->compare_set(end_key, "", text);
    } catch (const std::exception&) {
      // The store is gone: the round's watch reports that.
    }
  };
  // From a revision read before the check below: a delete after it is pushed,
  // one before it is seen by the check.
  const auto from = leases_->revision() + 1;
  death_watch_ = leases_->watch_prefix(
      key, from,
      [key, declare](const StoreEvent& event) {
        if (event.kind == StoreEvent::Kind::kDelete && event.key == key) declare();
      },
      [](const std::string&) {
        // The store cannot be watched any more: the round's watch reports a lost store.
      });
  if (!leases_->check({key})) declare();
}

void DynamicRendezvous::start_liveness() {
  if (liveness_worker_) return;
  // Its own store handle: a TcpStore serializes calls, and the agent's may
  // block in a rendezvous wait. Writes are due once per interval; the watched
  // neighbour is read every tick (one key), so its death is seen at most
  // 200 ms past its deadline.
  StoreOpener opener = store_.liveness_opener ? store_.liveness_opener : store_.opener;
  auto handle = std::make_shared<OwnStoreHandle>(opener ? nullptr : store(), std::move(opener));
  liveness_worker_ =
      std::make_unique<BackgroundWorker>(tick_period(liveness_->interval), [l = liveness_, handle] {
        Store& own = handle->get();  // a store that cannot be opened ends the worker
        try {
          tick(*l, own);
        } catch (const std::exception&) {
          // The store is unreachable for now: the round's watcher reports a
          // lost store; a keep-alive that could not be written is a missed one.
        }
      });
}

void DynamicRendezvous::stop_liveness(std::chrono::milliseconds deadline) {
  if (liveness_worker_) liveness_worker_->stop(deadline);
}

// ---- leaving ------------------------------------------------------------------------------------

void DynamicRendezvous::forget_round(int round) {
  // Off the decider's way (2N keys are deleted one by one), on a store handle
  // of its own; nobody waits for it, and a store gone or refusing leaves
  // nothing to delete.
  OwnStoreHandle handle(store_.opener ? nullptr : store(), store_.opener);
  BackgroundCall forget(
      [handle, r = round_prefix(round)]() mutable { delete_round_keys(handle.get(), r); });
}

void DynamicRendezvous::delete_round_keys(Store& s, const std::string& r) {
  auto closed = try_get(s, r + "/closed");
  const int arrived = considered_arrivals(arrivals(s, r));
  std::vector<std::string> keys = {r + "/end", r + "/exit_barrier", r + "/left"};
  for (int i = 0; i < arrived; ++i) keys.push_back(rec_key(r, i));
  if (closed) {
    const Decision c = parse_decision(*closed, r + "/closed");
    keys.push_back(r + "/members_" + std::to_string(c.decider));
    for (int i = 0; i < c.considered; ++i) {
      keys.push_back(r + "/assign_" + std::to_string(c.decider) + "_" + std::to_string(i));
    }
    keys.push_back(r + "/closed");
  }
  for (const auto& key : keys) s.delete_key(key);
  if (auto* leases = dynamic_cast<LeaseStore*>(&s)) {
    leases->delete_tickets(r + "/arrivals");
  } else {
    s.delete_key(r + "/arrivals");
  }
}

void DynamicRendezvous::shutdown(std::chrono::milliseconds deadline) {
  const auto until = time_.now() + deadline;
  stop_liveness(deadline);
  // A single node never touched the store. A node that never joined a round
  // (refused, timed out) only takes its keep-alive key away.
  if (params_.max_nodes == 1) return;
  auto left = std::chrono::duration_cast<Duration>(until - time_.now());
  if (left <= Duration(0)) return;
  // On a thread of its own, which owns all it touches, so that a frozen store
  // cannot hold the exit past the deadline.
  // The handle the agent used (opening another one could wait for a store
  // that is gone: its host may have left first). The thread gets the
  // handler's references and drops them before it reports done: the store's
  // destructor then runs there, in time, and takes away what the client left
  // (an EtcdStore's marker; ddprun leaves through _exit, which runs none).
  if (!store_.store) return;
  death_watch_.reset();
  std::shared_ptr<Store> store = std::move(store_.store);
  const std::string prefix = this->prefix();
  const std::string alive = alive_key(member());
  std::shared_ptr<LeaseStore> leases = std::move(leases_);
  LeaseStore::LeaseId lease = 0;
  {
    std::lock_guard lock(liveness_->mutex);
    lease = liveness_->lease;
  }
  const std::string last = last_round_ >= 0 ? round_prefix(last_round_) : "";
  const std::string before = last_round_ >= 1 ? round_prefix(last_round_ - 1) : "";
  const int nodes = last_nodes_;
  BackgroundCall cleanup([store, leases, lease, prefix, alive, last, before, nodes]() mutable {
    try {
      if (leases && lease != 0) {
        leases->revoke_lease(lease);  // its key goes with it
      } else {
        store->delete_key(alive);
      }
      // The last node of the last round to leave deletes what is left of the job.
      if (!last.empty() && store->add(last + "/left", 1) >= nodes) {
        if (!before.empty()) delete_round_keys(*store, before);
        delete_round_keys(*store, last);
        store->delete_key(prefix + "current");
        store->delete_key(prefix + "config");
      }
    } catch (const std::exception&) {
    }
    leases.reset();
    try {
      store.reset();  // the last reference, unless a round's end is still being written
    } catch (const std::exception&) {
    }
  });
  cleanup.wait_for(left);
}

}  // namespace ddp::rendezvous_detail

namespace ddp {

std::unique_ptr<RendezvousHandler> make_c10d_rendezvous(const RendezvousParams& params,
                                                        RendezvousStore store) {
  return std::make_unique<rendezvous_detail::DynamicRendezvous>(params, std::move(store),
                                                                real_runtime(), "c10d");
}

std::unique_ptr<RendezvousHandler> make_etcd_rendezvous(const RendezvousParams& params,
                                                        RendezvousStore store) {
  if (!std::dynamic_pointer_cast<LeaseStore>(store.store)) {
    throw InvalidArgument("etcd rendezvous", "needs a store with leases (an EtcdStore)");
  }
  return std::make_unique<rendezvous_detail::DynamicRendezvous>(params, std::move(store),
                                                                real_runtime(), "etcd");
}

}  // namespace ddp
