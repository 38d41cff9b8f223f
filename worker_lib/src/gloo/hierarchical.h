// The pieces of the Gloo group's hierarchical all-reduce (see
// docs/worker-library.md#hierarchical-all-reduce): which ranks share a host, and
// the ring of node leaders over the group's own TCP connections.
//
// Hosts: a rank's host is a string, equal for ranks that can share memory and
// reach each other without a network: GlooOptions::host_id, else the
// environment's DDP_HOST_ID, else this_host_id() (the host's name, its boot id,
// and the rank's IPC and network namespaces, so that "nodes" made of network
// namespaces on one machine, like scripts/cluster's, count as hosts).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gloo/context.h>

#include "ddp/worker/process_group.h"
#include "reduce_functions.h"

namespace ddp {
class Store;
}

namespace ddp::detail {

// This process's host as the hierarchy sees it (see above). Never empty.
std::string this_host_id();

// InvalidArgument unless `host_id` is non-empty, without ',' ';' or newline.
void check_host_id(const std::string& host_id);

// Where the ranks of a group are. The same on every rank of the group.
struct HostPlan {
  int hosts = 1;              // distinct hosts
  int host = 0;               // this rank's host, numbered by its lowest rank
  int local_rank = 0;         // among the ranks of this host, in rank order
  int local_size = 1;         // ranks on this host
  std::vector<int> leaders;   // per host, its lowest rank (the host's leader)
  bool hierarchical = false;  // every rank asked for it, > 1 host, and some host has > 1 rank
  bool shared_memory = true;  // every rank asked for the shared-memory path

  bool leader() const { return local_rank == 0; }
};

// Collective over `store` (the group's own namespace, keys under "hier/"): every
// rank publishes its host and whether it wants the hierarchy and shared memory;
// rank 0 reads them all and publishes the plan; every rank reads it (one store
// round trip each beyond rank 0's gather). Throws what the store throws
// (TimeoutError when a rank never shows up within `timeout`), InvalidArgument as
// check_host_id().
HostPlan plan_hosts(Store& store, int rank, int size, const std::string& host_id,
                    bool want_hierarchical, bool want_shared_memory,
                    std::chrono::milliseconds timeout);

// In-place ring all-reduce (reduce-scatter, then all-gather) of `count` elements
// of `esize` bytes at `data` among `ring` (ranks of `context`, this rank among
// them), over the context's pairs, with messages in `slot`. Every member ends
// with the same bits. Blocks; TCP failures throw gloo::IoException, a peer late
// by more than `timeout` throws Gloo's timeout. `scratch` is reused between calls.
void ring_allreduce(gloo::Context& context, const std::vector<int>& ring, void* data,
                    std::size_t count, std::size_t esize, ReduceFn fn, std::uint64_t slot,
                    std::chrono::milliseconds timeout, std::vector<std::uint8_t>& scratch);

}  // namespace ddp::detail
