#include "ddp/rendezvous/rendezvous_factory.h"
#include "ddp/rendezvous/backends.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "ddp/common/error.h"
#include "ddp/store/tcp_store.h"
#include "ddp/store_etcd/etcd_store.h"
#include "ddp/store_server/store_server.h"

namespace ddp {
namespace {

// true when `host` names an address of this machine: binding a socket to it
// (port 0) only succeeds for local addresses.
bool is_local_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &result) != 0) return false;
  bool local = false;
  for (addrinfo* ai = result; ai != nullptr && !local; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    local = ::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    ::close(fd);
  }
  ::freeaddrinfo(result);
  return local;
}

// A StoreServer this process runs for the job, as the rendezvous holds it.
class HostedStoreServer final : public HostedStore {
 public:
  explicit HostedStoreServer(std::shared_ptr<StoreServer> server) : server_(std::move(server)) {}
  std::uint16_t port() const override { return server_->port(); }

 private:
  std::shared_ptr<StoreServer> server_;
};

// The agents' store reached through clients of type `Client` (TcpStore,
// EtcdStore): `first` (null: made on first use), more made with `options`,
// and the keep-alive thread's made with `liveness`.
template <typename Client, typename Options>
RendezvousStore clients_of(std::shared_ptr<Store> first, const Options& options,
                           const Options& liveness) {
  return RendezvousStore(
      std::move(first),
      [options]() -> std::shared_ptr<Store> { return std::make_shared<Client>(options); },
      [liveness]() -> std::shared_ptr<Store> { return std::make_shared<Client>(liveness); });
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "127.0.0.1" || host == "::1";
}

// The built-in store for this node's workers, on every interface unless the
// node's own address is loopback. Never closes a connection for idleness.
std::shared_ptr<StoreServer> serve_worker_store(const RendezvousConfig& config) {
  StoreServerOptions options;
  options.host = is_loopback(config.params.local_addr) ? "127.0.0.1" : "0.0.0.0";
  options.port = 0;
  options.token = config.token;
  options.idle_timeout = std::chrono::milliseconds(0);
  auto server = std::make_shared<StoreServer>(options);
  server->start();
  return server;
}

EtcdStoreOptions etcd_options(const RendezvousConfig& config) {
  EtcdStoreOptions options;
  options.endpoints = parse_etcd_endpoints(config.etcd.endpoints);
  // Every key of ddprun's under one prefix; the rendezvous adds rdzv/<run_id>/.
  options.prefix = "ddp/";
  static_cast<EtcdCredentials&>(options) = config.etcd;
  // etcd runs before the job does: one that does not answer is an error
  // within read_timeout, not a wait for a host that may come later.
  options.connect_timeout = config.read_timeout;
  options.request_timeout = config.read_timeout;
  options.timeout = config.params.join_timeout;
  return options;
}

// The agents meet in an etcd cluster; workers in the built-in store of their
// round's group rank 0.
std::unique_ptr<RendezvousHandler> create_on_etcd(const RendezvousConfig& config,
                                                  const RendezvousBackend& backend) {
  const EtcdStoreOptions client = etcd_options(config);
  auto worker_store = std::make_shared<HostedStoreServer>(serve_worker_store(config));
  auto etcd = std::make_shared<EtcdStore>(client);
  const std::string name = etcd->endpoints_text();
  // The lease refreshes: a call that cannot be made within keep_alive_write_timeout is a missed one.
  EtcdStoreOptions liveness = client;
  liveness.connect_timeout = config.keep_alive_write_timeout;
  liveness.request_timeout = config.keep_alive_write_timeout;
  RendezvousStore rs = clients_of<EtcdStore>(std::move(etcd), client, liveness);
  rs.at(config.params.local_addr, worker_store->port(), config.token).external(name, worker_store);
  return backend.make(config.params, std::move(rs));
}

}  // namespace

std::unique_ptr<RendezvousHandler> create_rendezvous(const RendezvousConfig& config) {
  const RendezvousBackend* backend = find_rendezvous_backend(config.backend);
  if (backend == nullptr) {
    throw InvalidArgument("rendezvous", "unknown backend '" + config.backend + "' (expected " +
                                            rendezvous_backend_names() + ")");
  }
  if (backend->store_at == RendezvousBackend::StoreAt::kEtcd)
    return create_on_etcd(config, *backend);
  bool host_store = config.is_host;
  if (config.host_auto) host_store = config.port == 0 || is_local_address(config.host);

  std::string store_host = config.host;
  std::uint16_t store_port = config.port;
  std::shared_ptr<StoreServer> server;
  if (host_store) {
    StoreServerOptions options;
    // A loopback endpoint stays private to this machine; any other address is
    // served on every interface (what PyTorch's TCPStore does).
    options.host = is_loopback(config.host) ? "127.0.0.1" : "0.0.0.0";
    options.port = config.port;
    options.token = config.token;
    // Agents (and workers) keep their connection for the whole job and may be
    // silent for hours while training runs: never close them for idleness.
    options.idle_timeout = std::chrono::milliseconds(0);  // zero: no idle timeout
    try {
      server = std::make_shared<StoreServer>(options);
    } catch (const NetworkError& e) {
      // c10d with an automatic choice: somebody else on this machine hosts it.
      if (!config.host_auto || config.port == 0) {
        throw NetworkError("rendezvous", "cannot host the rendezvous store on port " +
                                             std::to_string(config.port) +
                                             " (is the port already "
                                             "in use?): " +
                                             e.what());
      }
    }
    if (server) {
      server->start();
      store_port = server->port();
      if (is_loopback(config.host) || config.host == "0.0.0.0") store_host = "127.0.0.1";
    }
  }
  TcpStoreOptions client;
  client.host = server ? "127.0.0.1" : config.host;
  client.port = store_port;
  client.token = config.token;
  client.connect_timeout = server ? std::chrono::milliseconds(10000) : config.connect_timeout;
  client.timeout = config.params.join_timeout;
  client.reconnect_timeout = config.read_timeout;
  // A single node never needs the agents' store itself (only its workers
  // do): connect lazily, sparing the handshake at startup.
  std::shared_ptr<Store> first;
  if (config.params.max_nodes > 1 || !server) first = std::make_shared<TcpStore>(client);
  // Keep-alives: a write that takes longer than keep_alive_write_timeout is a missed
  // one, and a lost connection is retried for no longer than that either.
  TcpStoreOptions liveness = client;
  liveness.timeout = config.keep_alive_write_timeout;
  liveness.reconnect_timeout = config.keep_alive_write_timeout;
  RendezvousStore rs = clients_of<TcpStore>(std::move(first), client, liveness);
  rs.at(store_host, store_port, config.token);
  if (server) rs.served_by(std::make_shared<HostedStoreServer>(std::move(server)));
  return backend->make(config.params, std::move(rs));
}

}  // namespace ddp
