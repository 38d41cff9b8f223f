#include "ddp/rendezvous/backends.h"

#include <array>

namespace ddp {
namespace {

const std::array<RendezvousBackend, 3> kBackends = {{
    {"static", RendezvousBackend::StoreAt::kNodeRankZero, 0, true, &make_static_rendezvous},
    {"c10d", RendezvousBackend::StoreAt::kEndpoint, 29400, false, &make_c10d_rendezvous},
    {"etcd", RendezvousBackend::StoreAt::kEtcd, 2379, false, &make_etcd_rendezvous},
}};

}  // namespace

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
