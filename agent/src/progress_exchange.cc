#include "progress_exchange.h"

#include <algorithm>
#include <future>
#include <mutex>

#include <nlohmann/json.hpp>

#include "ddp/common/error.h"
#include "ddp/common/json.h"
#include "ddp/common/logging.h"
#include "ddp/rendezvous/round.h"

namespace ddp::agent {
namespace {

constexpr const char* kOrigin = "progress summary";
// The longest text of a hang a summary may carry (a summary, one rank's line).
constexpr std::size_t kMaxHangText = 4096;

std::int64_t ms(Millis d) { return d.count(); }

template <typename T>
T field(const nlohmann::json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end()) throw ProtocolError(kOrigin, std::string("no field '") + name + "'");
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string())
      throw ProtocolError(kOrigin, std::string("field '") + name + "' is not a string");
    return it->template get<std::string>();
  } else {
    if (!it->is_number_integer())
      throw ProtocolError(kOrigin, std::string("field '") + name + "' is not an integer");
    return it->template get<T>();
  }
}

Millis age_field(const nlohmann::json& object, const char* name) {
  const auto value = field<std::int64_t>(object, name);
  if (value < 0) throw ProtocolError(kOrigin, std::string("field '") + name + "' is negative");
  return Millis(value);
}

progress::Kind kind_field(const nlohmann::json& object, const char* name) {
  const auto kind = progress::kind_of(field<std::int64_t>(object, name));
  if (!kind)
    throw ProtocolError(kOrigin, std::string("field '") + name + "' is no collective kind");
  return *kind;
}

// A text a peer wrote that ends up in reports: bounded.
std::string bounded_text(const nlohmann::json& object, const char* name) {
  std::string text = field<std::string>(object, name);
  if (text.size() > kMaxHangText) {
    throw ProtocolError(kOrigin, std::string("field '") + name + "' is too long");
  }
  return text;
}

Hang parse_hang(const nlohmann::json& item) {
  if (!item.is_object()) throw ProtocolError(kOrigin, "'hang' is not an object");
  Hang hang;
  const int kind = field<int>(item, "kind");
  if (kind < 0 || kind > static_cast<int>(Hang::Kind::kNotExiting))
    throw ProtocolError(kOrigin, "unknown hang kind");
  hang.kind = static_cast<Hang::Kind>(kind);
  auto culprits = item.find("culprits");
  auto lines = item.find("ranks");
  if (culprits == item.end() || !culprits->is_array() ||
      culprits->size() > ProgressExchange::kMaxRanks || lines == item.end() || !lines->is_array() ||
      lines->size() > ProgressExchange::kMaxRanks) {
    throw ProtocolError(kOrigin, "bad 'culprits' or 'ranks' of a hang");
  }
  for (const auto& c : *culprits) {
    if (!c.is_number_integer()) throw ProtocolError(kOrigin, "a culprit is not a rank");
    hang.culprits.push_back(c.get<int>());
  }
  for (const auto& line : *lines) {
    if (!line.is_string() || line.get_ref<const std::string&>().size() > kMaxHangText)
      throw ProtocolError(kOrigin, "a hang's rank line is not a short string");
    hang.ranks.push_back(line.get<std::string>());
  }
  hang.group = bounded_text(item, "group");
  hang.seq = field<std::uint64_t>(item, "seq");
  hang.collective = kind_field(item, "k");
  hang.duration = age_field(item, "d");
  hang.found_by = field<int>(item, "by");
  hang.summary = bounded_text(item, "summary");
  return hang;
}

}  // namespace

std::string encode_summary(const NodeSummary& summary) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : summary.ranks) {
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& g : r.groups) {
      groups.push_back({{"n", g.name},
                        {"sz", g.size},
                        {"rk", g.rank},
                        {"i", g.issued},
                        {"c", g.completed},
                        {"k", static_cast<int>(g.last_kind)},
                        {"b", g.last_bytes},
                        {"si", ms(g.since_issued)},
                        {"sc", ms(g.since_completed)},
                        {"w", ms(g.waiting)}});
    }
    ranks.push_back({{"r", r.rank},
                     {"lr", r.local_rank},
                     {"pid", r.pid},
                     {"st", static_cast<int>(r.state)},
                     {"ex", ms(r.since_exit)},
                     {"up", ms(r.since_start)},
                     {"pg", r.has_page ? 1 : 0},
                     {"steps", r.steps},
                     {"ns", r.no_sync_steps},
                     {"ss", ms(r.since_step)},
                     {"cp", ms(r.compute)},
                     {"wall", ms(r.last_wall)},
                     {"mc", ms(r.mean_compute)},
                     {"g", std::move(groups)}});
  }
  nlohmann::json doc = {{"node", summary.node},
                        {"host", summary.host},
                        {"addr", summary.addr},
                        {"v", summary.version},
                        {"ranks", std::move(ranks)}};
  if (const auto& hang = summary.hang) {
    doc["hang"] = {{"kind", static_cast<int>(hang->kind)},
                   {"culprits", hang->culprits},
                   {"group", hang->group},
                   {"seq", hang->seq},
                   {"k", static_cast<int>(hang->collective)},
                   {"d", ms(hang->duration)},
                   {"by", hang->found_by},
                   {"summary", hang->summary},
                   {"ranks", hang->ranks}};
  }
  return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

NodeSummary parse_summary(std::string_view text) {
  auto parsed = json::parse_bounded(text, 6);
  if (!parsed.valid || parsed.too_deep || !parsed.value.is_object()) {
    throw ProtocolError(kOrigin, "not a JSON object of at most 6 levels");
  }
  const auto& doc = parsed.value;
  NodeSummary summary;
  summary.node = field<int>(doc, "node");
  summary.host = field<std::string>(doc, "host");
  summary.addr = field<std::string>(doc, "addr");
  summary.version = field<std::uint64_t>(doc, "v");
  auto ranks = doc.find("ranks");
  if (ranks == doc.end() || !ranks->is_array()) throw ProtocolError(kOrigin, "no 'ranks' array");
  if (ranks->size() > ProgressExchange::kMaxRanks) throw ProtocolError(kOrigin, "too many ranks");
  for (const auto& item : *ranks) {
    if (!item.is_object()) throw ProtocolError(kOrigin, "a rank is not an object");
    RankStatus r;
    r.rank = field<int>(item, "r");
    r.local_rank = field<int>(item, "lr");
    r.node = summary.node;
    r.host = summary.host;
    r.pid = field<int>(item, "pid");
    const int state = field<int>(item, "st");
    if (state < 0 || state > static_cast<int>(RankStatus::State::kFailed))
      throw ProtocolError(kOrigin, "unknown rank state");
    r.state = static_cast<RankStatus::State>(state);
    r.since_exit = age_field(item, "ex");
    r.since_start = age_field(item, "up");
    r.has_page = field<int>(item, "pg") != 0;
    r.steps = field<std::uint64_t>(item, "steps");
    r.no_sync_steps = field<std::uint64_t>(item, "ns");
    r.since_step = age_field(item, "ss");
    r.compute = age_field(item, "cp");
    r.last_wall = age_field(item, "wall");
    r.mean_compute = age_field(item, "mc");
    auto groups = item.find("g");
    if (groups == item.end() || !groups->is_array() || groups->size() > progress::kMaxGroups) {
      throw ProtocolError(kOrigin, "bad 'g' (groups) of a rank");
    }
    for (const auto& g_item : *groups) {
      if (!g_item.is_object()) throw ProtocolError(kOrigin, "a group is not an object");
      GroupStatus g;
      g.name = field<std::string>(g_item, "n").substr(0, progress::kNameBytes);
      g.size = field<int>(g_item, "sz");
      g.rank = field<int>(g_item, "rk");
      g.issued = field<std::uint64_t>(g_item, "i");
      g.completed = field<std::uint64_t>(g_item, "c");
      if (g.issued < g.completed)
        throw ProtocolError(kOrigin, "a group completed more than it issued");
      g.last_kind = kind_field(g_item, "k");
      g.last_bytes = field<std::uint64_t>(g_item, "b");
      g.since_issued = age_field(g_item, "si");
      g.since_completed = age_field(g_item, "sc");
      g.waiting = age_field(g_item, "w");
      r.groups.push_back(std::move(g));
    }
    summary.ranks.push_back(std::move(r));
  }
  if (auto hang = doc.find("hang"); hang != doc.end()) summary.hang = parse_hang(*hang);
  return summary;
}

void advance_ages(RankStatus& rank, Millis by) {
  if (rank.state != RankStatus::State::kRunning) rank.since_exit += by;
  rank.since_start += by;
  rank.since_step += by;
  for (auto& g : rank.groups) {
    g.since_issued += by;
    g.since_completed += by;
    if (g.in_collective()) g.waiting += by;
  }
  rank.summary_age = by;
}

struct ProgressExchange::State {
  std::shared_ptr<Store> store;
  std::string prefix;
  int node = 0;
  int nodes = 0;
  const Runtime* runtime = nullptr;
  std::mutex mutex;
  std::string outgoing;         // guarded
  bool outgoing_fresh = false;  // guarded
  // The version of `outgoing`, and the last version the store took.
  std::uint64_t outgoing_version = 0;  // guarded
  std::uint64_t written_version = 0;   // guarded
  // A summary carrying a hang went out: the key stays when the round ends (the
  // round's cleanup deletes it), so that a node that sees the round end over
  // that hang still reads it.
  bool keep_key = false;  // guarded
  struct Seen {
    NodeSummary summary;
    Clock::time_point first_seen;
  };
  std::map<int, Seen> seen;  // guarded
  bool warned = false;       // the worker thread's

  std::string key(int n) const { return progress_key(prefix, n); }

  void tick() {
    try {
      std::string text;
      std::uint64_t version = 0;
      {
        std::lock_guard lock(mutex);
        if (outgoing_fresh) {
          text = outgoing;
          version = outgoing_version;
        }
        outgoing_fresh = false;
      }
      if (!text.empty()) {
        store->set(key(node), text);
        std::lock_guard lock(mutex);
        written_version = std::max(written_version, version);
      }
      std::vector<std::string> keys;
      for (int n = 0; n < nodes; ++n) {
        if (n != node) keys.push_back(key(n));
      }
      if (keys.empty()) return;
      std::vector<std::string> values;
      if (store->check(keys)) {
        values = store->multi_get(keys, std::chrono::seconds(5));
      } else {
        for (const auto& k : keys) {
          values.push_back(store->check({k}) ? store->get(k, std::chrono::seconds(5)) : "");
        }
      }
      const auto now = runtime->now();
      std::lock_guard lock(mutex);
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (values[i].empty()) continue;
        NodeSummary summary;
        try {
          summary = parse_summary(values[i]);
        } catch (const std::exception& e) {
          if (!warned) log::get("ddprun")->warn("ignoring a node's progress summary: {}", e.what());
          warned = true;
          continue;
        }
        const int n = (static_cast<int>(i) >= node) ? static_cast<int>(i) + 1 : static_cast<int>(i);
        if (summary.node != n) continue;  // written under another node's key
        auto it = seen.find(n);
        if (it != seen.end() && it->second.summary.version == summary.version) continue;
        seen[n] = Seen{std::move(summary), now};
      }
    } catch (const std::exception& e) {
      if (!warned) log::get("ddprun")->warn("progress exchange through the store: {}", e.what());
      warned = true;
    }
  }
};

ProgressExchange::ProgressExchange(std::shared_ptr<Store> store, std::string round_prefix, int node,
                                   int nodes, Millis period, const Runtime& runtime)
    : state_(std::make_shared<State>()), period_(period) {
  state_->store = std::move(store);
  state_->prefix = std::move(round_prefix);
  state_->node = node;
  state_->nodes = nodes;
  state_->runtime = &runtime;
  std::shared_ptr<State> state = state_;
  worker_ = std::make_unique<BackgroundWorker>(
      period, [state] { state->tick(); }, runtime);
}

ProgressExchange::~ProgressExchange() {
  // Never waits: the agent is between rounds, and the next round's last call
  // does not wait for it. The thread deletes this node's key on its own (the
  // round's cleanup deletes it too).
  std::shared_ptr<State> state = state_;
  worker_->stop(Millis(0), [state] {
    {
      std::lock_guard lock(state->mutex);
      if (state->keep_key) return;
    }
    try {
      state->store->delete_key(state->key(state->node));
    } catch (const std::exception&) {
      // The store is gone; so are its keys, or the round's cleanup takes them.
    }
  });
}

void ProgressExchange::publish(NodeSummary summary, bool urgent) {
  {
    std::lock_guard lock(state_->mutex);
    state_->outgoing = encode_summary(summary);
    state_->outgoing_fresh = true;
    state_->outgoing_version = summary.version;
    state_->keep_key = state_->keep_key || summary.hang.has_value();
  }
  if (urgent) {
    std::shared_ptr<State> state = state_;
    worker_->post([state] { state->tick(); });
  }
}

bool ProgressExchange::tick_now(Millis wait) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> ticked = done->get_future();
  std::shared_ptr<State> state = state_;
  worker_->post([state, done] {
    state->tick();
    done->set_value();
  });
  return ticked.wait_for(wait) == std::future_status::ready;
}

bool ProgressExchange::written(std::uint64_t version) const {
  std::lock_guard lock(state_->mutex);
  return state_->written_version >= version;
}

std::map<int, ProgressExchange::Remote> ProgressExchange::remotes(Clock::time_point now) const {
  std::map<int, Remote> out;
  std::lock_guard lock(state_->mutex);
  for (const auto& [n, seen] : state_->seen) {
    Remote remote;
    remote.summary = seen.summary;
    remote.age = std::chrono::duration_cast<Millis>(now - seen.first_seen);
    if (remote.age.count() < 0) remote.age = Millis(0);
    remote.stale = remote.age > period_ * kStaleAfter;
    for (auto& r : remote.summary.ranks) {
      advance_ages(r, remote.age);
      r.stale = remote.stale;
    }
    out.emplace(n, std::move(remote));
  }
  return out;
}

}  // namespace ddp::agent
