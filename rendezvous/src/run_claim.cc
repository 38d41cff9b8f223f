#include "run_claim.h"

#include <numeric>

#include "ddp/common/error.h"
#include "ddp/store/store_capabilities.h"

namespace ddp::rendezvous_detail {
namespace {

// Whether some node of the job at P/current (or forming its first round) is alive.
bool job_alive(Store& s, const RunKeys& keys, Liveness& liveness) {
  std::vector<std::string> members;
  if (const auto current = read_current(s, keys)) {
    members = read_lineage(s, keys, current->round).members;
  } else {  // its first round is forming
    const std::string r = keys.round(0);
    std::vector<int> all(static_cast<std::size_t>(considered_arrivals(count_arrivals(s, r))));
    std::iota(all.begin(), all.end(), 0);
    for (const auto& arrival : read_records(s, r, all)) {
      if (arrival) members.push_back(arrival->member);
    }
  }
  return !members.empty() && liveness.any_alive(s, members);
}

}  // namespace

void claim_run_id(Store& s, const RunKeys& keys, const RendezvousParams& params, Liveness& liveness,
                  const std::string& store_name) {
  const std::string mine =
      params.job_signature.empty()
          ? "nnodes=" + std::to_string(params.min_nodes) + ":" + std::to_string(params.max_nodes)
          : params.job_signature;
  const std::string key = keys.config();
  std::string held = s.compare_set(key, "", mine);
  if (held == mine) return;
  // Another job's: refused while any of its nodes lives, taken over otherwise.
  // A store with prefix operations (etcd, shared and long-lived) deletes the
  // dead job's keys in the same step; elsewhere the rounds that follow delete
  // them as they go.
  if (!job_alive(s, keys, liveness)) {
    StorePrefixes* prefixes = s.prefixes();
    if (prefixes && prefixes->take_over(key, held, mine, keys.prefix())) return;
    held = prefixes ? s.compare_set(key, "", mine) : s.compare_set(key, held, mine);
  }
  if (held == mine) return;
  throw InvalidArgument(
      kDynamicOrigin, "run id '" + params.run_id + "' is in use on the store at " + store_name +
                          " by another running job (" + shown_value(held) + "); this node runs (" +
                          mine + "): use another --rdzv_id");
}

}  // namespace ddp::rendezvous_detail
