// Builds a rendezvous handler from the launcher's settings: hosts the store
// (an embedded StoreServer) on the node that should, connects a TcpStore
// everywhere else; for etcd, connects an EtcdStore and serves a built-in store
// for this node's workers.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "ddp/rendezvous/rendezvous.h"
#include "ddp/store_etcd/etcd_store.h"

namespace ddp {

// How to reach an etcd cluster (--rdzv_backend=etcd): the credentials come
// from --rdzv_conf protocol=https, cacert, cert, key, username, and the
// password read from password_file (torchrun's etcd keys).
struct EtcdConfig : EtcdCredentials {
  // "host1:2379,host2:2379" (--rdzv_endpoint).
  std::string endpoints;
};

struct RendezvousConfig {
  // "static", "c10d" or "etcd".
  std::string backend = "static";
  // Where the agents' store lives: static: --master_addr:--master_port;
  // c10d: --rdzv_endpoint. Port 0 (standalone) picks a free one.
  std::string host = "127.0.0.1";
  std::uint16_t port = 29500;
  // Whether this node hosts the store. For static: node_rank == 0. For c10d the
  // factory decides when `host_auto` is set: it hosts when `host` is a local
  // address and the port can be bound, and connects otherwise.
  bool is_host = false;
  bool host_auto = false;
  // Shared secret for the store (DDP_STORE_TOKEN); empty: none.
  std::string token;
  // How long non-hosting nodes keep trying to reach the store.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(900);
  // How long one store call of the agents keeps retrying a lost connection
  // before it fails (TcpStoreOptions::reconnect_timeout); for a keep-alive
  // write, keep_alive_write_timeout (--rdzv_conf heartbeat_timeout: a write that could
  // not be made is a missed one).
  std::chrono::milliseconds read_timeout = std::chrono::seconds(60);
  std::chrono::milliseconds keep_alive_write_timeout = std::chrono::seconds(5);
  EtcdConfig etcd;
  RendezvousParams params;
};

// Throws NetworkError naming host:port when the store cannot be hosted (for
// example the port is already in use) or reached in time, InvalidArgument for
// an unknown backend or bad params.
std::unique_ptr<RendezvousHandler> create_rendezvous(const RendezvousConfig& config);

}  // namespace ddp
