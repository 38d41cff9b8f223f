// Run ids on a shared store (a ddp-rendezvous daemon, etcd): P/config holds
// the job using the run id ("nnodes=MIN:MAX ..."); a node of another job is
// refused while any node of that job is alive, and takes the run id over
// otherwise (on a store with prefix operations, deleting the dead job's keys
// in the same step).
#pragma once

#include <string>

#include "ddp/rendezvous/rendezvous.h"
#include "dynamic_keys.h"
#include "liveness.h"

namespace ddp::rendezvous_detail {

// Claims `keys`' run id for the job `params` describes. Blocks up to a
// verdict time while another job holds it (is any of its nodes alive?).
// Throws InvalidArgument naming the run id, both jobs and `store_name` when a
// live job holds it; the store's errors.
void claim_run_id(Store& store, const RunKeys& keys, const RendezvousParams& params,
                  Liveness& liveness, const std::string& store_name);

}  // namespace ddp::rendezvous_detail
