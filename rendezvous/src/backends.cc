#include "ddp/rendezvous/backends.h"

#include <array>

#include "ddp/common/error.h"
#include "ddp/store/store_capabilities.h"
#include "dynamic_rendezvous.h"

namespace ddp {
namespace {

const std::array<RendezvousBackend, 3> kBackends = {{
    {"static", RendezvousBackend::StoreAt::kNodeRankZero, 0, true, &make_static_rendezvous},
    {"c10d", RendezvousBackend::StoreAt::kEndpoint, 29400, false, &make_c10d_rendezvous},
    {"etcd", RendezvousBackend::StoreAt::kEtcd, 2379, false, &make_etcd_rendezvous},
}};

}  // namespace

// The dynamic handler's two backends (the static one is rendezvous_static.cc's).
std::unique_ptr<RendezvousHandler> make_c10d_rendezvous(const RendezvousParams& params,
                                                        RendezvousStore store) {
  return std::make_unique<rendezvous_detail::DynamicRendezvous>(params, std::move(store),
                                                                real_runtime(), "c10d");
}

std::unique_ptr<RendezvousHandler> make_etcd_rendezvous(const RendezvousParams& params,
                                                        RendezvousStore store) {
  const std::shared_ptr<Store>& client = store.client_if_made();
  if (!client || !client->leases() || !client->watches()) {
    throw InvalidArgument("etcd rendezvous",
                          "needs a store with leases and watches (an EtcdStore)");
  }
  return std::make_unique<rendezvous_detail::DynamicRendezvous>(params, std::move(store),
                                                                real_runtime(), "etcd");
}

const RendezvousBackend* find_rendezvous_backend(std::string_view name) {
  for (const auto& backend : kBackends) {
    if (backend.name == name) return &backend;
  }
  return nullptr;
}

std::string rendezvous_backend_names() {
  std::string names;
  for (std::size_t i = 0; i < kBackends.size(); ++i) {
    if (i > 0) names += i + 1 == kBackends.size() ? " or " : ", ";
    names += kBackends[i].name;
  }
  return names;
}

}  // namespace ddp
