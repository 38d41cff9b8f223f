#include "ddp/rendezvous/rendezvous_store.h"

namespace ddp {

RendezvousStore::RendezvousStore(std::shared_ptr<Store> client) : client_(std::move(client)) {}

RendezvousStore::RendezvousStore(std::shared_ptr<Store> client, StoreOpener opener,
                                 StoreOpener liveness_opener)
    : client_(std::move(client)), opener_(std::move(opener)),
      liveness_opener_(std::move(liveness_opener)) {}

RendezvousStore& RendezvousStore::at(std::string host, std::uint16_t port, std::string token) {
  host_ = std::move(host);
  port_ = port;
  token_ = std::move(token);
  return *this;
}

RendezvousStore& RendezvousStore::served_by(std::shared_ptr<HostedStore> server) {
  agents_server_ = std::move(server);
  return *this;
}

RendezvousStore& RendezvousStore::external(std::string name,
                                           std::shared_ptr<HostedStore> workers_store) {
  external_name_ = std::move(name);
  workers_store_ = std::move(workers_store);
  return *this;
}

std::shared_ptr<Store> RendezvousStore::client() {
  if (!client_) client_ = opener_();
  return client_;
}

std::shared_ptr<Store> RendezvousStore::open() { return opener_ ? opener_() : client(); }

std::string RendezvousStore::name() const {
  if (is_external()) return external_name_;
  return host_ + ":" + std::to_string(port_);
}

}  // namespace ddp
