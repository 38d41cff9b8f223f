// EtcdStore: a Store with all four capabilities of store_capabilities.h
// (leases, watches, tickets, prefix operations) on an etcd v3
// cluster, spoken to through etcd's HTTP/JSON gateway (/v3/...) with
// Boost.Beast; no gRPC. etcd >= 3.4 serves the gateway by default.
//
// Mapping (keys and values are base64 in the JSON; every key is stored under
// options.prefix):
//   set, multi_set       kv/put (multi_set: one kv/txn)
//   get, wait, multi_get kv/range; a missing key is waited for with a watch
//                        from the revision of that read (never by polling)
//   take_ticket          kv/put of a key per ticket, then a count-only kv/range
//                        at its create revision (no conflicts)
//   add, append          kv/txn comparing the key's mod_revision (or its
//                        absence) with what was read, retried on a lost race;
//                        a retry after a lost connection is applied once
//   compare_set          kv/txn on the value, with c10d's semantics
//   check                kv/range (count only)
//   delete_key           kv/deleterange
//   num_keys             kv/range count of the keys under options.prefix
//   leases               lease/grant, lease/keepalive, lease/timetolive, lease/revoke
//
// Replies are not trusted (etcd_http.h): bodies and watch messages are
// bounded by max_reply_bytes, JSON nesting is bounded, bytes fields must be
// valid padded base64; such a reply from one endpoint moves the call to the
// next, and a call that got one from every endpoint throws ProtocolError
// naming them. A new connection proves its cluster (maintenance/status, no
// token needed) before a password or a write is sent on it. A username over
// plain http is logged as a warning: the password then crosses in clear text.
//
// Watches (a blocking get, watch_prefix) check a silent stream's member every
// watch_check_interval and resume on the next endpoint, from the last
// revision, when it does not answer (a frozen or cut-off member keeps the
// connection open and says nothing).
//
// Endpoints: calls go to one endpoint at a time. A refused or broken
// connection, a timeout, or an etcd error meaning "try again" (no leader, a
// leader change, a member stopping) moves the call to the next endpoint and
// retries it, with backoff, until `request_timeout` after the first failure;
// then it throws NetworkError naming every endpoint and the last reason. One
// attempt of a unary call lasts at most clamp(request_timeout, 1 s, 15 s), and
// moves on when no reply has started within 3 s (plus 1 s per MiB sent): a
// member that lost its leader would otherwise hold it for its own 7 s.
// Every endpoint must belong to the cluster of the first reply (its
// cluster_id): a new connection proves it before a write goes through it, and
// a reply or watch message from another cluster (say another etcd that took
// over a dead member's port) counts as a failed endpoint.
// The constructor checks that some endpoint answers as an etcd v3 gateway
// (and authenticates when a username is given) within `connect_timeout`;
// it throws NetworkError naming the endpoints when none does, ProtocolError
// naming the endpoint when a server answers that is not an etcd v3 gateway
// (for example etcd started with --enable-grpc-gateway=false), and AuthError
// when the credentials are refused.
//
// Thread-safety: every method may be called from several threads; unary calls
// share one connection (serialized), each blocking wait and each watch opens
// a connection of its own, so a blocked get never stalls other calls.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/store/store_capabilities.h"

namespace ddp {

struct EtcdEndpoint {
  std::string host;
  std::uint16_t port = 2379;
};

// "host1:2379,host2,[::1]:2379" (default port 2379) → endpoints. Throws
// InvalidArgument naming the bad item (empty host, bad port, empty list).
std::vector<EtcdEndpoint> parse_etcd_endpoints(const std::string& text);

// How a client and etcd trust each other; shared by EtcdStoreOptions and the
// launcher's rendezvous config (torchrun's --rdzv_conf etcd keys).
struct EtcdCredentials {
  // https to the gateway. `ca_file`: the CA that signs the servers'
  // certificates (empty: the system's default paths). `cert_file` and
  // `key_file`: a client certificate, for etcd's --client-cert-auth.
  bool tls = false;
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // etcd's user authentication (auth/authenticate); empty username: none.
  std::string username;
  std::string password;
};

struct EtcdStoreOptions : EtcdCredentials {
  std::vector<EtcdEndpoint> endpoints;
  // Every key lives under it ("" allowed); num_keys() counts only keys below it.
  std::string prefix;
  // How long the constructor keeps trying to reach some endpoint.
  Store::Duration connect_timeout = std::chrono::seconds(60);
  // How long one call keeps retrying (across endpoints) after a failure.
  Store::Duration request_timeout = std::chrono::seconds(60);
  // Default timeout of blocking calls (Store::timeout()).
  Store::Duration timeout = Store::kDefaultTimeout;
  // The largest reply body, and the largest message of a watch stream, taken
  // from an endpoint; a larger one is not etcd's (the call moves on).
  std::size_t max_reply_bytes = 64u << 20;
  // A watch stream silent for this long asks its member (on a connection of
  // its own) whether it still answers, as a member of this cluster with a
  // leader, within the same time; one that does not is left, and the watch
  // resumes on the next endpoint from where it was. A frozen member is thus
  // left at most twice this long after it froze.
  Store::Duration watch_check_interval = std::chrono::seconds(2);
};

class EtcdStore final : public Store,
                        public StoreLeases,
                        public StoreWatches,
                        public StoreTickets,
                        public StorePrefixes {
 public:
  explicit EtcdStore(const EtcdStoreOptions& options);
  ~EtcdStore() override;
  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

  void set(const std::string& key, const std::string& value) override;
  using Store::get;
  std::string get(const std::string& key, Duration timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  std::int64_t num_keys() override;
  using Store::multi_get;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     Duration timeout) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;
  void append(const std::string& key, const std::string& value) override;

  StoreLeases* leases() override { return this; }
  StoreWatches* watches() override { return this; }
  StoreTickets* tickets() override { return this; }
  StorePrefixes* prefixes() override { return this; }

  LeaseId grant_lease(std::chrono::seconds ttl) override;
  bool refresh_lease(LeaseId lease) override;
  // lease/timetolive ({"ID": id} -> "TTL": seconds left, "-1" when gone).
  std::int64_t lease_time_left(LeaseId lease) override;
  void revoke_lease(LeaseId lease) override;
  void set_with_lease(const std::string& key, const std::string& value, LeaseId lease) override;
  // A key of its own below "<key>/" (a re-sent put keeps its create_revision),
  // then a count of the keys below "<key>/" at that revision.
  std::int64_t take_ticket(const std::string& key) override;
  // A count of the keys below "<key>/".
  std::int64_t tickets_taken(const std::string& key) override;
  // kv/deleterange of the keys below "<key>/".
  void delete_tickets(const std::string& key) override;
  // One kv/txn: compare `key`'s value, delete [prefix, key) and (key, end of
  // prefix), put `key` (etcd refuses a put and a delete of one key in a txn).
  bool take_over(const std::string& key, const std::string& expected, const std::string& desired,
                 const std::string& prefix) override;
  std::int64_t revision() override;
  std::unique_ptr<StoreWatch> watch_prefix(
      const std::string& key_prefix, std::int64_t from_revision,
      std::function<void(const StoreEvent&)> on_event,
      std::function<void(const std::string& reason)> on_error) override;

  const EtcdStoreOptions& options() const;
  // "host1:2379,host2:2379": for error messages.
  std::string endpoints_text() const;

 private:
  class Client;
  std::unique_ptr<Client> client_;
};

}  // namespace ddp
