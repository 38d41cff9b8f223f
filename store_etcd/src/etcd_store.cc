// EtcdStore: the Store operations mapped onto etcd's KV, lease and watch
// calls (see etcd_store.h for the table). The transport (etcd_http.h) does
// the HTTP, the endpoint rotation and the retries; the watches live in
// etcd_watch.h.
#include "ddp/store_etcd/etcd_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <random>

#include "ddp/common/error.h"
#include "ddp/common/host_port.h"
#include "ddp/store/store_util.h"
#include "etcd_http.h"
#include "etcd_watch.h"

namespace ddp {

using etcd::base64_encode;
using etcd::Json;
using etcd::json_bytes;
using etcd::json_int;

namespace {

// etcd's default --max-txn-ops: longer key lists are split into several txns.
constexpr std::size_t kMaxTxnOps = 128;
// Where the clients' markers live (at the root, outside every options.prefix
// that does not start with it), and how long the destructor tries to revoke
// its marker's lease.
constexpr const char* kMarkerDir = "__ddp_clients/";
constexpr Duration kMarkerCleanup = std::chrono::seconds(2);
// A marker lives on a lease of its own, so that a client that dies (or leaves
// through _exit) leaves nothing behind for long. Its TTL outlasts one call's
// retries (request_timeout) with room to spare, and a call renews it first
// when less than that is left.
std::chrono::seconds marker_ttl(Duration request_timeout) {
  const auto seconds = std::chrono::ceil<std::chrono::seconds>(2 * request_timeout);
  return seconds + std::chrono::seconds(60);
}
Duration marker_renew_margin(Duration request_timeout) {
  return request_timeout + std::chrono::seconds(30);
}

std::string random_hex(std::size_t digits) {
  std::random_device device;
  std::string text;
  while (text.size() < digits) text += fmt::format("{:08x}", device());
  return text.substr(0, digits);
}

// [key, range_end) of every key starting with `prefix` ("" → every key).
std::pair<std::string, std::string> prefix_range(const std::string& prefix) {
  return {prefix.empty() ? std::string(1, '\0') : prefix, etcd::prefix_range_end(prefix)};
}

Json put_op(const std::string& key, const std::string& value, std::int64_t lease = 0) {
  Json put = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  return {{"request_put", put}};
}

Json range_body(const std::string& key, bool keys_only) {
  Json range = {{"key", base64_encode(key)}};
  if (keys_only) range["keys_only"] = true;
  return range;
}

Json range_op(const std::string& key, bool keys_only) {
  return {{"request_range", range_body(key, keys_only)}};
}

Json count_op(const std::string& prefix) {
  auto [key, end] = prefix_range(prefix);
  return {{"request_range",
           {{"key", base64_encode(key)}, {"range_end", base64_encode(end)}, {"count_only", true}}}};
}

Json compare_mod(const std::string& key, std::int64_t mod_revision) {
  return {{"key", base64_encode(key)},
          {"target", "MOD"},
          {"result", "EQUAL"},
          {"mod_revision", std::to_string(mod_revision)}};
}

// The first kv of a range response (kv/range's reply or a txn's
// response_range), if any.
const Json* first_kv(const Json& range) {
  auto kvs = range.find("kvs");
  if (kvs == range.end() || !kvs->is_array() || kvs->empty()) return nullptr;
  return &(*kvs)[0];
}

// The i-th response of a txn reply, unwrapped ("response_range", ...).
const Json& txn_response(const Json& reply, std::size_t i, const char* kind) {
  static const Json kEmpty = Json::object();
  auto responses = reply.find("responses");
  if (responses == reply.end() || !responses->is_array() || i >= responses->size()) return kEmpty;
  auto it = (*responses)[i].find(kind);
  return it == (*responses)[i].end() ? kEmpty : *it;
}

std::int64_t header_revision(const Json& reply) {
  auto header = reply.find("header");
  return header == reply.end() ? 0 : json_int(*header, "revision");
}

bool lease_not_found(const Error& e) {
  const etcd::ReplyInfo* info = etcd::reply_info(e);
  return info != nullptr &&
         (info->code() == 5 || info->etcd_message().find("lease not found") != std::string::npos);
}

}  // namespace

class EtcdStore::Client {
 public:
  explicit Client(const EtcdStoreOptions& options)
      : transport(std::make_shared<etcd::Transport>(options)), marker(kMarkerDir + random_hex(16)) {
  }

  const EtcdStoreOptions& options() const { return transport->options(); }
  std::string full(const std::string& key) const { return options().prefix + key; }

  Json call(const std::string& origin, const std::string& path, const Json& body) {
    return transport->call(origin, path, body);
  }

  Json txn(const std::string& origin, const Json& compare, const Json& success,
           const Json& failure = Json::array()) {
    Json body = Json::object();
    if (!compare.empty()) body["compare"] = compare;
    if (!success.empty()) body["success"] = success;
    if (!failure.empty()) body["failure"] = failure;
    return call(origin, "/v3/kv/txn", body);
  }

  // The value (or, with keys_only, "") of every key; std::nullopt for a
  // missing one. `revision` gets a revision at which every missing key was
  // missing (the smallest of the reads).
  std::vector<std::optional<std::string>> read(const std::string& origin,
                                               const std::vector<std::string>& keys, bool keys_only,
                                               std::int64_t& revision);
  // A blocking read: waits until every key exists, with a watch per missing
  // key (one after another), re-reading after each.
  std::vector<std::string> wait_for(const std::string& origin, const std::vector<std::string>& keys,
                                    Duration timeout, bool keys_only);
  // add and append: see the comment at the definition.
  std::string read_modify_write(const std::string& origin, const std::string& key,
                                const std::function<std::string(const std::string*)>& update);
  // The marker's lease, granted or renewed when less than a call's retries
  // are left of it. Under rmw_mutex_.
  std::int64_t marker_lease(const std::string& origin);
  // Revokes the marker's lease (the marker goes with it). Best effort.
  void release_marker();

  // A name for this client's next ticket, unique among all clients.
  std::string next_ticket_name() {
    return marker.substr(marker.rfind('/') + 1) + "." + std::to_string(++tickets_);
  }

  std::shared_ptr<etcd::Transport> transport;
  const std::string marker;  // this client's marker key (see read_modify_write)

 private:
  std::mutex rmw_mutex_;  // one add/append of this client at a time
  std::uint64_t sequence_ = 0;
  std::atomic<std::uint64_t> tickets_{0};
  std::int64_t marker_lease_ = 0;  // guarded by rmw_mutex_ (0: none)
  Clock::time_point renew_marker_at_{};
};

std::int64_t EtcdStore::Client::marker_lease(const std::string& origin) {
  const auto now = Clock::now();
  if (marker_lease_ != 0 && now < renew_marker_at_) return marker_lease_;
  const Duration timeout = options().request_timeout;
  const auto ttl = marker_ttl(timeout);
  if (marker_lease_ != 0) {
    const Json reply = call(origin, "/v3/lease/keepalive", {{"ID", std::to_string(marker_lease_)}});
    auto result = reply.find("result");
    if (json_int(result != reply.end() ? *result : reply, "TTL") > 0) {
      renew_marker_at_ = now + ttl - marker_renew_margin(timeout);
      return marker_lease_;
    }
  }
  const Json reply = call(origin, "/v3/lease/grant", {{"TTL", std::to_string(ttl.count())}});
  const std::int64_t id = json_int(reply, "ID");
  if (id == 0) throw ProtocolError(origin, "etcd granted a lease without an ID");
  marker_lease_ = id;
  renew_marker_at_ = now + ttl - marker_renew_margin(timeout);
  return marker_lease_;
}

void EtcdStore::Client::release_marker() {
  std::lock_guard lock(rmw_mutex_);
  if (marker_lease_ == 0) return;
  try {
    transport->call("EtcdStore", "/v3/lease/revoke", {{"ID", std::to_string(marker_lease_)}},
                    std::min(kMarkerCleanup, options().request_timeout));
  } catch (const std::exception&) {
    // best effort: the lease expires by itself
  }
  marker_lease_ = 0;
}

std::vector<std::optional<std::string>> EtcdStore::Client::read(
    const std::string& origin, const std::vector<std::string>& keys, bool keys_only,
    std::int64_t& revision) {
  std::vector<std::optional<std::string>> values;
  values.reserve(keys.size());
  revision = 0;
  for (std::size_t begin = 0; begin < keys.size(); begin += kMaxTxnOps) {
    const std::size_t end = std::min(keys.size(), begin + kMaxTxnOps);
    std::vector<const Json*> ranges;
    Json reply;
    if (end - begin == 1) {
      reply = call(origin, "/v3/kv/range", range_body(full(keys[begin]), keys_only));
      ranges.push_back(&reply);
    } else {
      Json ops = Json::array();
      for (std::size_t i = begin; i < end; ++i) ops.push_back(range_op(full(keys[i]), keys_only));
      reply = txn(origin, Json::array(), ops);
      for (std::size_t i = 0; i < end - begin; ++i)
        ranges.push_back(&txn_response(reply, i, "response_range"));
    }
    std::int64_t at = header_revision(reply);
    revision = revision == 0 ? at : std::min(revision, at);
    for (const Json* range : ranges) {
      const Json* kv = first_kv(*range);
      if (kv == nullptr) {
        values.emplace_back(std::nullopt);
      } else {
        values.emplace_back(keys_only ? std::string() : json_bytes(*kv, "value"));
      }
    }
  }
  return values;
}

std::vector<std::string> EtcdStore::Client::wait_for(const std::string& origin,
                                                     const std::vector<std::string>& keys,
                                                     Duration timeout, bool keys_only) {
  Deadline deadline(timeout);
  etcd::Transport::Failures failures;  // across the waits: every endpoint bad fails the call
  for (;;) {
    std::int64_t revision = 0;
    auto values = read(origin, keys, keys_only, revision);
    std::vector<std::string> missing;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (!values[i]) missing.push_back(keys[i]);
    }
    if (missing.empty()) {
      std::vector<std::string> result;
      result.reserve(values.size());
      for (auto& value : values) result.push_back(std::move(*value));
      return result;
    }
    if (deadline.expired()) {
      throw TimeoutError(origin, store_util::timeout_message(missing, timeout));
    }
    // Whatever the watch says, read again: a PUT wakes us, and the re-read
    // also notices keys deleted meanwhile.
    etcd::wait_for_put(*transport, origin, full(missing.front()), revision + 1, deadline, failures);
  }
}

// add and append: read (value, mod_revision), then a txn that writes the new
// value only if the key's mod_revision is still the one read (0: still
// absent); a lost race reads again (the txn's failure branch returns the
// fresh values) and retries.
//
// Exactly once across lost connections: the transport re-sends a txn whose
// connection broke, and a txn that was applied before the break must not be
// applied twice as a new add. So the same txn also puts this client's marker
// key (kMarkerDir + a random client id, outside options.prefix) with the
// attempt's sequence number, and it also requires the marker's mod_revision
// to be the one read. A re-sent txn that had been applied fails its compare;
// the next read then finds the marker holding that attempt's number, so the
// attempt was applied and its value is the result. The marker compare makes
// an attempt still in flight inside etcd unable to apply after a later
// attempt of this client did. The client's adds and appends run one at a
// time (the marker is per client). The marker lives on a lease of the
// client's (marker_lease): it outlasts any call's retries, and goes away by
// itself once the client is gone; the destructor revokes it at once.
std::string EtcdStore::Client::read_modify_write(
    const std::string& origin, const std::string& key,
    const std::function<std::string(const std::string*)>& update) {
  std::lock_guard lock(rmw_mutex_);
  const std::string full_key = full(key);
  const Json reads = Json::array({range_op(full_key, false), range_op(marker, false)});
  std::vector<std::pair<std::string, std::string>> attempts;  // (sequence, value written)
  std::int64_t lease = marker_lease(origin);
  Json reply = txn(origin, Json::array(), reads);
  for (;;) {
    const Json* kv = first_kv(txn_response(reply, 0, "response_range"));
    const Json* marker_kv = first_kv(txn_response(reply, 1, "response_range"));
    if (marker_kv != nullptr) {
      const std::string applied = json_bytes(*marker_kv, "value");
      for (const auto& [sequence, written] : attempts) {
        if (sequence == applied) return written;
      }
    }
    std::optional<std::string> current;
    if (kv != nullptr) current = json_bytes(*kv, "value");
    std::string value = update(current ? &*current : nullptr);
    std::string sequence = std::to_string(++sequence_);
    Json compare =
        Json::array({compare_mod(full_key, kv ? json_int(*kv, "mod_revision") : 0),
                     compare_mod(marker, marker_kv ? json_int(*marker_kv, "mod_revision") : 0)});
    try {
      reply = txn(origin, compare,
                  Json::array({put_op(full_key, value), put_op(marker, sequence, lease)}), reads);
    } catch (const InvalidArgument& e) {
      // The lease expired under us (this process was stopped longer than its
      // TTL): the txn was refused, not applied. A new lease, and again.
      if (!lease_not_found(e)) throw;
      marker_lease_ = 0;
      lease = marker_lease(origin);
      reply = txn(origin, Json::array(), reads);
      continue;
    }
    attempts.emplace_back(sequence, value);
    if (etcd::json_flag(reply, "succeeded")) return value;
  }
}

// ---------------------------------------------------------------------------

EtcdStore::EtcdStore(const EtcdStoreOptions& options)
    : Store(options.timeout), client_(std::make_unique<Client>(options)) {
  client_->transport->probe();
}

EtcdStore::~EtcdStore() { client_->release_marker(); }

const EtcdStoreOptions& EtcdStore::options() const { return client_->options(); }

std::string EtcdStore::endpoints_text() const { return client_->transport->endpoints_text(); }

void EtcdStore::set(const std::string& key, const std::string& value) {
  client_->call("EtcdStore::set", "/v3/kv/put", put_op(client_->full(key), value)["request_put"]);
}

std::string EtcdStore::get(const std::string& key, Duration timeout) {
  return client_->wait_for("EtcdStore::get", {key}, timeout, false).front();
}

std::int64_t EtcdStore::add(const std::string& key, std::int64_t delta) {
  std::string result =
      client_->read_modify_write("EtcdStore::add", key, [&](const std::string* current) {
        return std::to_string(store_util::add_to_decimal(current, delta, "EtcdStore::add", key));
      });
  return std::stoll(result);
}

void EtcdStore::append(const std::string& key, const std::string& value) {
  client_->read_modify_write("EtcdStore::append", key, [&](const std::string* current) {
    return current ? *current + value : value;
  });
}

// c10d's compare_set in single txns: the write happens only if the compare
// that decided it still holds. A re-sent txn that had been applied fails its
// compare and reads the key, which then holds `desired`: the same result.
std::string EtcdStore::compare_set(const std::string& key, const std::string& expected,
                                   const std::string& desired) {
  const char* origin = "EtcdStore::compare_set";
  const std::string full_key = client_->full(key);
  const Json put = Json::array({put_op(full_key, desired)});
  const Json read = Json::array({range_op(full_key, false)});
  for (;;) {
    Json compare;
    if (expected.empty()) {  // absent (create_revision 0)
      compare = {{"key", base64_encode(full_key)},
                 {"target", "CREATE"},
                 {"result", "EQUAL"},
                 {"create_revision", "0"}};
    } else {
      compare = {{"key", base64_encode(full_key)},
                 {"target", "VALUE"},
                 {"result", "EQUAL"},
                 {"value", base64_encode(expected)}};
    }
    Json reply = client_->txn(origin, Json::array({compare}), put, read);
    if (etcd::json_flag(reply, "succeeded")) return desired;
    const Json* kv = first_kv(txn_response(reply, 0, "response_range"));
    if (kv == nullptr) {
      if (!expected.empty()) return expected;
      continue;  // not reached: the failed compare and the read are one txn
    }
    std::string current = json_bytes(*kv, "value");
    if (!expected.empty() || !current.empty()) return current;
    // A present key holding "" equals expected "": replace it if it still does.
    Json same = {{"key", base64_encode(full_key)},
                 {"target", "VALUE"},
                 {"result", "EQUAL"},
                 {"value", base64_encode("")}};
    reply = client_->txn(origin, Json::array({same}), put, read);
    if (etcd::json_flag(reply, "succeeded")) return desired;
    kv = first_kv(txn_response(reply, 0, "response_range"));
    if (kv != nullptr) return json_bytes(*kv, "value");
  }
}

void EtcdStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  client_->wait_for("EtcdStore::wait", keys, timeout, true);
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  std::int64_t revision = 0;
  auto values = client_->read("EtcdStore::check", keys, true, revision);
  return std::all_of(values.begin(), values.end(), [](const auto& v) { return v.has_value(); });
}

bool EtcdStore::delete_key(const std::string& key) {
  Json reply = client_->call("EtcdStore::delete_key", "/v3/kv/deleterange",
                             {{"key", base64_encode(client_->full(key))}});
  return json_int(reply, "deleted") > 0;
}

std::int64_t EtcdStore::num_keys() {
  const std::string& prefix = options().prefix;
  // Markers of clients count only when they sit below the prefix ("" for
  // one): leave them out.
  const bool markers_below = std::string(kMarkerDir).rfind(prefix, 0) == 0;
  Json ops = Json::array({count_op(prefix)});
  if (markers_below) ops.push_back(count_op(kMarkerDir));
  Json reply = client_->txn("EtcdStore::num_keys", Json::array(), ops);
  std::int64_t count = json_int(txn_response(reply, 0, "response_range"), "count");
  if (markers_below) count -= json_int(txn_response(reply, 1, "response_range"), "count");
  return count;
}

std::vector<std::string> EtcdStore::multi_get(const std::vector<std::string>& keys,
                                              Duration timeout) {
  if (keys.empty()) return {};
  return client_->wait_for("EtcdStore::multi_get", keys, timeout, false);
}

void EtcdStore::multi_set(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values) {
  store_util::check_multi_set(keys, values, "EtcdStore::multi_set");
  // etcd refuses a txn that puts one key twice: the last value wins, as it
  // would with one set after another.
  std::map<std::string, std::size_t> last;
  for (std::size_t i = 0; i < keys.size(); ++i) last[keys[i]] = i;
  Json ops = Json::array();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (last[keys[i]] != i) continue;
    ops.push_back(put_op(client_->full(keys[i]), values[i]));
    if (ops.size() == kMaxTxnOps) {
      client_->txn("EtcdStore::multi_set", Json::array(), ops);
      ops = Json::array();
    }
  }
  if (!ops.empty()) client_->txn("EtcdStore::multi_set", Json::array(), ops);
}

// ---------------------------------------------------------------------------
// Leases, revision, watches

StoreLeases::LeaseId EtcdStore::grant_lease(std::chrono::seconds ttl) {
  if (ttl.count() <= 0) {
    throw InvalidArgument("EtcdStore::grant_lease",
                          fmt::format("ttl must be positive, got {} s", ttl.count()));
  }
  Json reply = client_->call("EtcdStore::grant_lease", "/v3/lease/grant",
                             {{"TTL", std::to_string(ttl.count())}});
  LeaseId id = json_int(reply, "ID");
  if (id == 0) throw ProtocolError("EtcdStore::grant_lease", "etcd granted a lease without an ID");
  return id;
}

bool EtcdStore::refresh_lease(LeaseId lease) {
  Json reply = client_->call("EtcdStore::refresh_lease", "/v3/lease/keepalive",
                             {{"ID", std::to_string(lease)}});
  auto result = reply.find("result");
  return json_int(result != reply.end() ? *result : reply, "TTL") > 0;
}

std::int64_t EtcdStore::lease_time_left(LeaseId lease) {
  try {
    Json reply = client_->call("EtcdStore::lease_time_left", "/v3/lease/timetolive",
                               {{"ID", std::to_string(lease)}});
    // etcd answers "TTL":"-1" for a lease that is gone (and omits a 0).
    return std::max<std::int64_t>(json_int(reply, "TTL"), -1);
  } catch (const InvalidArgument& e) {
    if (lease_not_found(e)) return -1;
    throw;
  }
}

void EtcdStore::revoke_lease(LeaseId lease) {
  try {
    client_->call("EtcdStore::revoke_lease", "/v3/lease/revoke", {{"ID", std::to_string(lease)}});
  } catch (const InvalidArgument& e) {
    if (!lease_not_found(e)) throw;
  }
}

void EtcdStore::set_with_lease(const std::string& key, const std::string& value, LeaseId lease) {
  try {
    client_->call("EtcdStore::set_with_lease", "/v3/kv/put",
                  put_op(client_->full(key), value, lease)["request_put"]);
  } catch (const InvalidArgument& e) {
    if (!lease_not_found(e)) throw;
    throw InvalidArgument(
        "EtcdStore::set_with_lease",
        fmt::format("lease {} does not exist ({})", lease, etcd::reply_info(e)->etcd_message()));
  }
}

// Tickets: one key per ticket below "<key>/", named by the client and the
// call, so a put that the transport sends again (its first send may have been
// applied) leaves the key's create_revision as it was. A ticket's number is how
// many ticket keys existed at that revision, less one: a count-only range at
// the revision (etcd keeps the index; a count ignores max_create_revision).
// Puts of different keys never conflict.
std::int64_t EtcdStore::take_ticket(const std::string& key) {
  const char* origin = "EtcdStore::take_ticket";
  const std::string tickets = client_->full(key) + "/";
  Json put = put_op(tickets + client_->next_ticket_name(), "")["request_put"];
  put["prev_kv"] = true;
  const Json reply = client_->call(origin, "/v3/kv/put", put);
  auto previous = reply.find("prev_kv");
  const std::int64_t created =
      previous != reply.end() ? json_int(*previous, "create_revision") : header_revision(reply);
  auto [begin, end] = prefix_range(tickets);
  Json at = {{"key", base64_encode(begin)},
             {"range_end", base64_encode(end)},
             {"count_only", true},
             {"revision", std::to_string(created)}};
  const std::int64_t count = json_int(client_->call(origin, "/v3/kv/range", at), "count");
  if (count < 1) {
    throw ProtocolError(origin,
                        fmt::format("etcd counts no ticket of '{}' at revision {}, where this "
                                    "client's was created",
                                    key, created));
  }
  return count - 1;
}

void EtcdStore::delete_tickets(const std::string& key) {
  auto [begin, end] = prefix_range(client_->full(key) + "/");
  client_->call("EtcdStore::delete_tickets", "/v3/kv/deleterange",
                {{"key", base64_encode(begin)}, {"range_end", base64_encode(end)}});
}

bool EtcdStore::take_over(const std::string& key, const std::string& expected,
                          const std::string& desired, const std::string& prefix) {
  const char* origin = "EtcdStore::take_over";
  if (key.rfind(prefix, 0) != 0) {
    throw InvalidArgument(origin, fmt::format("key '{}' is not below '{}'", key, prefix));
  }
  const std::string full_key = client_->full(key);
  auto [begin, end] = prefix_range(client_->full(prefix));
  Json compare = Json::array();
  if (expected.empty()) {
    compare.push_back({{"key", base64_encode(full_key)},
                       {"target", "CREATE"},
                       {"result", "EQUAL"},
                       {"create_revision", "0"}});
  } else {
    compare.push_back({{"key", base64_encode(full_key)},
                       {"target", "VALUE"},
                       {"result", "EQUAL"},
                       {"value", base64_encode(expected)}});
  }
  auto delete_range = [](const std::string& from, const std::string& to) {
    return Json{
        {"request_delete_range", {{"key", base64_encode(from)}, {"range_end", base64_encode(to)}}}};
  };
  Json success = Json::array();
  if (begin < full_key) success.push_back(delete_range(begin, full_key));
  const std::string after_key = full_key + std::string(1, '\0');
  if (after_key < end || end == std::string(1, '\0'))
    success.push_back(delete_range(after_key, end));
  success.push_back(put_op(full_key, desired));
  const Json reply = client_->txn(origin, compare, success);
  return etcd::json_flag(reply, "succeeded");
}

std::int64_t EtcdStore::tickets_taken(const std::string& key) {
  const Json reply = client_->txn("EtcdStore::tickets_taken", Json::array(),
                                  Json::array({count_op(client_->full(key) + "/")}));
  return json_int(txn_response(reply, 0, "response_range"), "count");
}

std::int64_t EtcdStore::revision() {
  Json body = range_body(client_->marker, true);
  body["count_only"] = true;
  return header_revision(client_->call("EtcdStore::revision", "/v3/kv/range", body));
}

std::unique_ptr<StoreWatch> EtcdStore::watch_prefix(
    const std::string& key_prefix, std::int64_t from_revision,
    std::function<void(const StoreEvent&)> on_event,
    std::function<void(const std::string& reason)> on_error) {
  auto [key, end] = prefix_range(client_->full(key_prefix));
  return etcd::start_watch(client_->transport, key, end, options().prefix.size(),
                           std::max<std::int64_t>(from_revision, 0), std::move(on_event),
                           std::move(on_error));
}

// ---------------------------------------------------------------------------

namespace {

std::uint16_t parse_port(const std::string& text, const std::string& item) {
  const bool digits =
      !text.empty() && text.size() <= 5 &&
      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  int port = digits ? std::stoi(text) : 0;
  if (port < 1 || port > 65535) {
    throw InvalidArgument("parse_etcd_endpoints", fmt::format("bad port in '{}'", item));
  }
  return static_cast<std::uint16_t>(port);
}

EtcdEndpoint parse_endpoint(const std::string& item) {
  if (item.find("://") != std::string::npos) {
    throw InvalidArgument(
        "parse_etcd_endpoints",
        fmt::format("'{}': give host[:port] without a scheme (TLS is an option)", item));
  }
  HostPort split = split_host_port(item, "parse_etcd_endpoints");
  if (split.port && split.port->empty()) {
    throw InvalidArgument("parse_etcd_endpoints", fmt::format("bad port in '{}'", item));
  }
  EtcdEndpoint endpoint;
  endpoint.host = std::move(split.host);
  if (endpoint.host.empty()) {
    throw InvalidArgument("parse_etcd_endpoints", fmt::format("empty host in '{}'", item));
  }
  if (split.port) endpoint.port = parse_port(*split.port, item);
  return endpoint;
}

std::string trim(const std::string& text) {
  auto begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return {};
  auto end = text.find_last_not_of(" \t");
  return text.substr(begin, end - begin + 1);
}

}  // namespace

std::vector<EtcdEndpoint> parse_etcd_endpoints(const std::string& text) {
  if (trim(text).empty()) throw InvalidArgument("parse_etcd_endpoints", "no etcd endpoints given");
  std::vector<EtcdEndpoint> endpoints;
  std::size_t start = 0;
  for (;;) {
    auto comma = text.find(',', start);
    std::string item =
        trim(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (item.empty()) {
      throw InvalidArgument("parse_etcd_endpoints", fmt::format("empty item in '{}'", text));
    }
    endpoints.push_back(parse_endpoint(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return endpoints;
}

}  // namespace ddp
