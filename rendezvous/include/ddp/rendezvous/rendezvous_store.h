// The agents' store as a rendezvous handler reaches it (RendezvousStore): the
// client the agent's thread uses, how to open more (a thread that blocks in the
// store needs its own), where the store is for workers and messages, and the
// servers this process runs for the job, which live as long as the handler.
// Built by the factory (rendezvous_factory.h), or by a test around a
// MemoryStore.
//
// Thread-safety: built, then handed to one handler, whose thread alone calls
// client() and release_client(); open(), the openers and the accessors may be
// called from any thread once it is built.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ddp/store/store.h"

namespace ddp {

// Opens another client of the agents' store. Throws the store's errors.
using StoreOpener = std::function<std::shared_ptr<Store>()>;

// A store server this process runs for the job (the factory's StoreServer).
// Thread-safety: port() may be called from any thread.
class HostedStore {
 public:
  virtual ~HostedStore() = default;
  // The port it listens on.
  virtual std::uint16_t port() const = 0;
};

class RendezvousStore {
 public:
  // No store: a handler given it throws InvalidArgument ("no store given").
  RendezvousStore() = default;
  // An existing client (an in-process store, or one the caller connected),
  // which open() returns too. Null: no store.
  explicit RendezvousStore(std::shared_ptr<Store> client);
  // Clients made by `opener`: `client` is the first when not null, else one
  // is made on first use; open() makes a new one each time;
  // `liveness_opener` makes the keep-alive thread's own (null: `opener`),
  // whose calls may be bounded more tightly.
  RendezvousStore(std::shared_ptr<Store> client, StoreOpener opener,
                  StoreOpener liveness_opener = nullptr);

  // Where the store is, for workers (DDP_STORE_ADDR, DDP_STORE_PORT,
  // DDP_STORE_TOKEN) and for messages. Returns *this.
  RendezvousStore& at(std::string host, std::uint16_t port, std::string token = "");
  // This process serves the agents' store (`server`, kept running as long as
  // this): the other nodes lose it when this node leaves
  // (Round::needed_by_others). Returns *this.
  RendezvousStore& served_by(std::shared_ptr<HostedStore> server);
  // The agents meet in a store that is not built-in (etcd), called `name` in
  // messages ("h1:2379,h2:2379"). Every node then serves its workers a
  // built-in store, `workers_store` (kept running as long as this), and a
  // round's workers use group rank 0's. Returns *this.
  RendezvousStore& external(std::string name, std::shared_ptr<HostedStore> workers_store);

  // Whether there is a client, or a way to make one.
  bool has_store() const { return client_ != nullptr || opener_ != nullptr; }
  // The client of the agent's thread, made on first use (throws what the
  // opener throws).
  std::shared_ptr<Store> client();
  // The client if it was made, else null; never makes one.
  const std::shared_ptr<Store>& client_if_made() const { return client_; }
  // Hands the client over (the handler's shutdown), leaving none here.
  std::shared_ptr<Store> release_client() { return std::move(client_); }
  // Another client: a new one when an opener was given, else client().
  std::shared_ptr<Store> open();
  // What opens a client for a thread of its own (null: share client()).
  const StoreOpener& opener() const { return opener_; }
  // What opens the keep-alive thread's client (null: share client()).
  const StoreOpener& liveness_opener() const {
    return liveness_opener_ ? liveness_opener_ : opener_;
  }

  const std::string& host() const { return host_; }
  std::uint16_t port() const { return port_; }
  const std::string& token() const { return token_; }
  // "host:port", or an external store's name.
  std::string name() const;
  // This process serves the agents' store (served_by).
  bool served_here() const { return agents_server_ != nullptr; }
  // The agents meet in an external store (external).
  bool is_external() const { return workers_store_ != nullptr; }
  // The port of this node's workers' store when external, else 0.
  std::uint16_t worker_store_port() const { return workers_store_ ? workers_store_->port() : 0; }

 private:
  // Declared first, so that the servers outlive the clients below.
  std::shared_ptr<HostedStore> agents_server_;
  std::shared_ptr<HostedStore> workers_store_;
  std::shared_ptr<Store> client_;
  StoreOpener opener_;
  StoreOpener liveness_opener_;
  std::string host_;
  std::uint16_t port_ = 0;
  std::string token_;
  std::string external_name_;
};

}  // namespace ddp
