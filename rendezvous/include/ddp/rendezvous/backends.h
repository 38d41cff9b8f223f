// The rendezvous backends ddprun knows, in one table: the command line checks
// names and flags against it, the launcher and the factory build handlers
// from it. Adding a backend is adding a row (rendezvous/src/backends.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "ddp/rendezvous/rendezvous.h"

namespace ddp {

struct RendezvousBackend {
  using Make = std::unique_ptr<RendezvousHandler> (*)(const RendezvousParams&, RendezvousStore);

  // --rdzv_backend's value.
  std::string_view name;
  // Where the agents' store is. kNodeRankZero: the node with --node_rank=0
  // hosts it at --master_addr:--master_port (an --rdzv_endpoint may replace
  // that address). kEndpoint: at --rdzv_endpoint, hosted by the node whose
  // address that is (or --rdzv_conf is_host), reached by every other one.
  // kEtcd: an etcd cluster at --rdzv_endpoint (a comma-separated list) that
  // no node hosts.
  enum class StoreAt { kNodeRankZero, kEndpoint, kEtcd } store_at;
  // The endpoint's port when --rdzv_endpoint names none (kEndpoint, kEtcd).
  std::uint16_t default_port;
  // Whether --nnodes must be one number (MIN == MAX).
  bool fixed_node_count;
  Make make;
};

// The backend called `name`, or null when there is none.
const RendezvousBackend* find_rendezvous_backend(std::string_view name);

// "static, c10d or etcd": the names, for error messages.
std::string rendezvous_backend_names();

}  // namespace ddp
