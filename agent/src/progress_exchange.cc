#include "progress_exchange.h"

#include <algorithm>
#include <future>
#include <limits>
#include <mutex>
#include <set>
#include <type_traits>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "ddp/common/error.h"
#include "ddp/common/json.h"
#include "ddp/common/logging.h"
#include "ddp/common/text.h"
#include "ddp/rendezvous/round.h"

namespace ddp::agent {
namespace {

constexpr const char* kOrigin = "progress summary";
// The longest line of a hang a summary may carry (its summary, one rank's
// line), and the shortest rank line (describe_rank's start: "rank N (node").
constexpr std::size_t kMaxHangText = 4096;
constexpr std::size_t kMinHangLine = 8;

std::int64_t ms(Millis d) { return d.count(); }

[[noreturn]] void bad(const std::string& what) { throw ProtocolError(kOrigin, what); }

// An integer field within T's range (a number beyond it is an error, never
// wrapped or cut).
template <typename T>
T integer(const nlohmann::json& value, const char* name) {
  if (!value.is_number_integer()) bad(std::string("field '") + name + "' is not an integer");
  if (value.is_number_unsigned()) {
    const auto v = value.get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(std::numeric_limits<T>::max()))
      bad(std::string("field '") + name + "' is out of range");
    return static_cast<T>(v);
  }
  const auto v = value.get<std::int64_t>();
  if (v < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
      (std::is_signed_v<T> && v > static_cast<std::int64_t>(std::numeric_limits<T>::max())))
    bad(std::string("field '") + name + "' is out of range");
  return static_cast<T>(v);
}

const nlohmann::json& member(const nlohmann::json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end()) bad(std::string("no field '") + name + "'");
  return *it;
}

template <typename T>
T field(const nlohmann::json& object, const char* name) {
  return integer<T>(member(object, name), name);
}

// A text field of at most `limit` bytes, made printable.
std::string text_field(const nlohmann::json& object, const char* name, std::size_t limit) {
  const auto& value = member(object, name);
  if (!value.is_string()) bad(std::string("field '") + name + "' is not a string");
  const auto& text = value.get_ref<const std::string&>();
  if (text.size() > limit) bad(std::string("field '") + name + "' is too long");
  return printable(text);
}

Millis age_field(const nlohmann::json& object, const char* name) {
  const auto value = field<std::int64_t>(object, name);
  if (value < 0) bad(std::string("field '") + name + "' is negative");
  return Millis(value);
}

progress::Kind kind_field(const nlohmann::json& object, const char* name) {
  const auto kind = progress::kind_of(field<std::int64_t>(object, name));
  if (!kind) bad(std::string("field '") + name + "' is no collective kind");
  return *kind;
}

const nlohmann::json& array_field(const nlohmann::json& object, const char* name,
                                  std::size_t limit) {
  const auto& value = member(object, name);
  if (!value.is_array()) bad(std::string("field '") + name + "' is not an array");
  if (value.size() > limit) bad(std::string("field '") + name + "' has too many entries");
  return value;
}

Hang parse_hang(const nlohmann::json& item) {
  if (!item.is_object()) bad("'hang' is not an object");
  Hang hang;
  const int kind = field<int>(item, "kind");
  if (kind < 0 || kind > static_cast<int>(Hang::Kind::kNotExiting)) bad("unknown hang kind");
  hang.kind = static_cast<Hang::Kind>(kind);
  const auto& culprits = array_field(item, "culprits", ProgressExchange::kMaxRanks);
  const auto& lines = array_field(item, "ranks", ProgressExchange::kMaxRanks);
  hang.culprits.reserve(culprits.size());
  for (const auto& c : culprits) hang.culprits.push_back(integer<int>(c, "culprits"));
  hang.summary = text_field(item, "summary", kMaxHangText);
  std::size_t bytes = hang.summary.size();
  hang.ranks.reserve(lines.size());
  for (const auto& line : lines) {
    if (!line.is_string()) bad("a hang's rank line is not a string");
    const auto& text = line.get_ref<const std::string&>();
    bytes += text.size();
    if (text.size() < kMinHangLine || text.size() > kMaxHangText || bytes > kMaxHangBytes)
      bad("a hang's rank line is too short or too long, or its lines are too many bytes");
    hang.ranks.push_back(printable(text));
  }
  hang.group = text_field(item, "group", progress::kNameBytes);
  hang.seq = field<std::uint64_t>(item, "seq");
  hang.collective = kind_field(item, "k");
  hang.duration = age_field(item, "d");
  hang.found_by = field<int>(item, "by");
  // Absent from an older agent's summary: not known to be in its own code.
  if (auto own = item.find("own"); own != item.end()) {
    if (!own->is_boolean()) bad("field 'own' is not a boolean");
    hang.in_own_code = own->get<bool>() && hang.kind == Hang::Kind::kStalled;
  }
  return hang;
}

GroupStatus parse_group(const nlohmann::json& item) {
  if (!item.is_object()) bad("a group is not an object");
  GroupStatus g;
  const auto& name = member(item, "n");
  if (!name.is_string()) bad("field 'n' is not a string");
  g.name = printable(
      std::string_view(name.get_ref<const std::string&>()).substr(0, progress::kNameBytes));
  g.size = field<int>(item, "sz");
  g.rank = field<int>(item, "rk");
  g.issued = field<std::uint64_t>(item, "i");
  g.completed = field<std::uint64_t>(item, "c");
  if (g.issued < g.completed) bad("a group completed more than it issued");
  g.last_kind = kind_field(item, "k");
  g.last_bytes = field<std::uint64_t>(item, "b");
  g.since_issued = age_field(item, "si");
  g.since_completed = age_field(item, "sc");
  g.waiting = age_field(item, "w");
  return g;
}

RankStatus parse_rank(const nlohmann::json& item, int node, const SharedText& host) {
  if (!item.is_object()) bad("a rank is not an object");
  RankStatus r;
  r.rank = field<int>(item, "r");
  r.local_rank = field<int>(item, "lr");
  r.node = node;
  r.host = host;
  r.pid = field<int>(item, "pid");
  const int state = field<int>(item, "st");
  if (state < 0 || state > static_cast<int>(RankStatus::State::kFailed)) bad("unknown rank state");
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
  const auto& groups = array_field(item, "g", progress::kMaxGroups);
  r.groups.reserve(groups.size());
  for (const auto& g : groups) r.groups.push_back(parse_group(g));
  // Every age counts from the worker's start at the most (progress_page_file.h).
  bool older = r.since_exit > r.since_start || r.since_step > r.since_start;
  for (const auto& g : r.groups) {
    older = older || g.since_issued > r.since_start || g.since_completed > r.since_start ||
            g.waiting > r.since_start;
  }
  if (older) bad(fmt::format("rank {} says it waited longer than it has run", r.rank));
  return r;
}

std::size_t heap_bytes(const std::string& text) {
  // Short strings live inside the object (the small-string buffer).
  return text.capacity() > std::string().capacity() ? text.capacity() + 1 : 0;
}

// "ranks 4..7" or "no ranks".
std::string range_text(int first, int end) {
  if (end <= first) return "no ranks";
  return first + 1 == end ? fmt::format("rank {}", first)
                          : fmt::format("ranks {}..{}", first, end - 1);
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
    // The lines that fit kMaxHangBytes, then how many did not.
    nlohmann::json lines = nlohmann::json::array();
    std::size_t bytes = hang->summary.size();
    for (std::size_t i = 0; i < hang->ranks.size(); ++i) {
      bytes += hang->ranks[i].size();
      if (bytes + 64 > kMaxHangBytes) {
        lines.push_back(fmt::format("({} more ranks: see node {}'s report)", hang->ranks.size() - i,
                                    hang->found_by));
        break;
      }
      lines.push_back(hang->ranks[i]);
    }
    doc["hang"] = {{"kind", static_cast<int>(hang->kind)},
                   {"culprits", hang->culprits},
                   {"group", hang->group},
                   {"seq", hang->seq},
                   {"k", static_cast<int>(hang->collective)},
                   {"d", ms(hang->duration)},
                   {"by", hang->found_by},
                   {"own", hang->in_own_code},
                   {"summary", hang->summary},
                   {"ranks", std::move(lines)}};
  }
  return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

NodeSummary parse_summary(std::string_view text) {
  if (text.size() > kMaxSummaryBytes)
    bad(fmt::format("{} bytes, more than the {} a summary may have", text.size(),
                    kMaxSummaryBytes));
  auto parsed = json::parse_bounded(text, 6);
  if (!parsed.valid || parsed.too_deep || !parsed.value.is_object()) {
    bad("not a JSON object of at most 6 levels");
  }
  const auto& doc = parsed.value;
  NodeSummary summary;
  summary.node = field<int>(doc, "node");
  summary.host = text_field(doc, "host", kMaxHostBytes);
  summary.addr = text_field(doc, "addr", kMaxHostBytes);
  summary.version = field<std::uint64_t>(doc, "v");
  const auto& ranks = array_field(doc, "ranks", ProgressExchange::kMaxRanks);
  const SharedText host(summary.host);
  summary.ranks.reserve(ranks.size());
  for (const auto& item : ranks) summary.ranks.push_back(parse_rank(item, summary.node, host));
  if (auto hang = doc.find("hang"); hang != doc.end()) summary.hang = parse_hang(*hang);
  return summary;
}

std::size_t summary_footprint(const NodeSummary& summary) {
  std::size_t bytes = sizeof(NodeSummary) + heap_bytes(summary.host) + heap_bytes(summary.addr);
  std::set<const std::string*> hosts;
  bytes += summary.ranks.capacity() * sizeof(RankStatus);
  for (const auto& r : summary.ranks) {
    if (const std::string* held = r.host.held(); held && hosts.insert(held).second)
      bytes += sizeof(std::string) + heap_bytes(*held) + 32;  // and the shared count
    bytes += r.groups.capacity() * sizeof(GroupStatus);
    for (const auto& g : r.groups) bytes += heap_bytes(g.name);
  }
  if (const auto& hang = summary.hang) {
    // The Hang itself is inside the NodeSummary (std::optional).
    bytes += hang->culprits.capacity() * sizeof(int) + heap_bytes(hang->group) +
             heap_bytes(hang->summary) + hang->ranks.capacity() * sizeof(std::string);
    for (const auto& line : hang->ranks) bytes += heap_bytes(line);
  }
  return bytes;
}

std::string refusal(const NodeSummary& summary, const RoundRanks& round,
                    const std::map<int, const NodeSummary*>& others, Millis round_age) {
  const int n = summary.node;
  // The ranks node n may name: [first, end).
  int first = 0;
  int end = round.world_size;
  bool exact = false;
  if (!round.local_world_sizes.empty()) {
    if (n < 0 || n >= static_cast<int>(round.local_world_sizes.size()))
      return fmt::format("node {} is not a node of the round", n);
    first = 0;
    for (int m = 0; m < n; ++m) first += round.local_world_sizes[static_cast<std::size_t>(m)];
    end = first + round.local_world_sizes[static_cast<std::size_t>(n)];
    exact = true;
  } else if (n < round.node) {
    end = round.base_rank;
  } else {
    first = round.base_rank + round.local_world_size;
  }
  if (!exact) {
    for (const auto& [m, other] : others) {
      if (m == n || other->ranks.empty()) continue;
      // Taken summaries name ranks of the world only.
      int low = round.world_size;
      int high = -1;
      for (const auto& r : other->ranks) {
        if (r.rank < 0 || r.rank >= round.world_size) continue;
        low = std::min(low, r.rank);
        high = std::max(high, r.rank);
      }
      if (m < n) first = std::max(first, high + 1);
      if (m > n) end = std::min(end, low);
    }
  }
  std::optional<int> base;
  std::set<int> seen;
  for (const auto& r : summary.ranks) {
    if (r.rank < first || r.rank >= end || r.local_rank < 0)
      return fmt::format("rank {} is not one of its ranks in the round ({})", r.rank,
                         range_text(first, end));
    if (!base) base = r.rank - r.local_rank;
    if (r.rank - r.local_rank != *base || (exact && *base != first))
      return fmt::format("rank {} has local rank {}, which is not its place among its node's ranks",
                         r.rank, r.local_rank);
    if (!seen.insert(r.rank).second) return fmt::format("rank {} is listed twice", r.rank);
    if (r.since_start > round_age + kRoundSkew)
      return fmt::format("rank {} says it has run for {:.1f} s, longer than the round ({:.1f} s)",
                         r.rank, r.since_start.count() / 1000.0, round_age.count() / 1000.0);
  }
  if (const auto& hang = summary.hang) {
    if (hang->found_by != n)
      return fmt::format("its hang says node {} found it, which is not its own find",
                         hang->found_by);
    for (int c : hang->culprits) {
      if (c < 0 || c >= round.world_size)
        return fmt::format("its hang names rank {}, which is not a rank of the world", c);
    }
    if (hang->duration > round_age + kRoundSkew)
      return fmt::format("its hang lasted {:.1f} s, longer than the round ({:.1f} s)",
                         hang->duration.count() / 1000.0, round_age.count() / 1000.0);
  }
  return "";
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
  RoundRanks ranks;
  int node = 0;
  int nodes = 0;
  const Runtime* runtime = nullptr;
  Clock::time_point began{};
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
  struct Refused {
    int count = 0;
    std::uint64_t version = 0;  // the last refused (a version, or a text's hash)
    bool any = false;
  };
  std::map<int, Refused> refused;  // guarded
  bool warned = false;             // the worker thread's

  // Node n's summary as read: taken, or refused (counted once per version,
  // warned about once per node). Called with the mutex held.
  void take(int n, NodeSummary summary, Clock::time_point now) {
    auto it = seen.find(n);
    if (it != seen.end() && it->second.summary.version == summary.version) return;
    if (const Refused& r = refused[n]; r.any && r.version == summary.version) return;
    std::map<int, const NodeSummary*> others;
    for (const auto& [m, s] : seen) others.emplace(m, &s.summary);
    const std::string why =
        refusal(summary, ranks, others, std::chrono::duration_cast<Millis>(now - began));
    if (why.empty()) {
      seen[n] = Seen{std::move(summary), now};
      return;
    }
    refuse(n, summary.version, why);
  }

  // Counts a refused summary of node `n` once (`which`: its version, or the
  // hash of a text that does not parse) and warns about the node's first.
  void refuse(int n, std::uint64_t which, const std::string& why) {
    Refused& refusals = refused[n];
    if (refusals.any && refusals.version == which) return;
    if (refusals.count++ == 0) {
      log::get("ddprun")->warn(
          "refusing node {}'s progress summary ({}): its ranks and any hang it claims are "
          "left out until it sends one that fits the round",
          n, why);
    }
    refusals.any = true;
    refusals.version = which;
  }

  std::string key(int n) const { return round_area_key(prefix, n); }

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
      // Parsed without the lock: the owner's remotes() never waits for a parse.
      std::vector<std::optional<NodeSummary>> parsed(keys.size());
      std::vector<std::string> errors(keys.size());
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (values[i].empty()) continue;
        try {
          parsed[i] = parse_summary(values[i]);
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      }
      const auto now = runtime->now();
      std::lock_guard lock(mutex);
      for (std::size_t i = 0; i < keys.size(); ++i) {
        const int n = (static_cast<int>(i) >= node) ? static_cast<int>(i) + 1 : static_cast<int>(i);
        if (parsed[i] && parsed[i]->node != n)  // written under another node's key
          errors[i] = fmt::format("it says it is node {}'s", parsed[i]->node);
        if (!errors[i].empty()) {
          refuse(n, std::hash<std::string>{}(values[i]), errors[i]);
        } else if (parsed[i]) {
          take(n, std::move(*parsed[i]), now);
        }
      }
    } catch (const std::exception& e) {
      if (!warned) log::get("ddprun")->warn("progress exchange through the store: {}", e.what());
      warned = true;
    }
  }
};

ProgressExchange::ProgressExchange(std::shared_ptr<Store> store, std::string round_prefix,
                                   RoundRanks ranks, int nodes, Millis period,
                                   const Runtime& runtime)
    : state_(std::make_shared<State>()), period_(period) {
  state_->store = std::move(store);
  state_->prefix = std::move(round_prefix);
  state_->node = ranks.node;
  state_->ranks = std::move(ranks);
  state_->nodes = nodes;
  state_->runtime = &runtime;
  state_->began = runtime.now();
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

std::map<int, int> ProgressExchange::refused() const {
  std::map<int, int> out;
  std::lock_guard lock(state_->mutex);
  for (const auto& [n, r] : state_->refused) out.emplace(n, r.count);
  return out;
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
