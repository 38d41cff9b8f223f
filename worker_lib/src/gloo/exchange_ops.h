// The data movement behind ProcessGroupGloo's gather, scatter and all-to-all,
// on the group's Gloo context. Each runs on the group's worker thread, blocks
// until this rank's part is done (at most `timeout` per wait) and throws Gloo's
// exceptions (gloo::IoException, gloo::EnforceNotMet) as they come, for the
// group to diagnose. Arguments were checked by the caller (ProcessGroupGloo).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <gloo/context.h>

#include "ddp/worker/process_group.h"
#include "gloo/collective_check.h"

namespace ddp::detail {

// Every rank's `input` lands in `root`'s `output` at rank x input bytes;
// `output` is only touched on `root`. Gloo's gather.
void gather_into_root(const std::shared_ptr<gloo::Context>& context, const Buffer& output,
                      const Buffer& input, int root, std::uint32_t tag,
                      std::chrono::milliseconds timeout);

// `root`'s `input` chunk r (output bytes each) lands in rank r's `output`;
// `input` is only read on `root`. Gloo's scatter.
void scatter_from_root(const std::shared_ptr<gloo::Context>& context, const Buffer& output,
                       const Buffer& input, int root, std::uint32_t tag,
                       std::chrono::milliseconds timeout);

// Exchanges every rank's all-to-all counts (Gloo's allgather) and throws
// InvalidArgument (origin `origin`, message starting with `context_text`) on
// every rank when they disagree (find_alltoall_mismatch). Every rank calls it
// before alltoall_exchange, so that no rank waits for a transfer that never comes.
void check_alltoall_counts(const std::shared_ptr<gloo::Context>& context,
                           const AlltoallCounts& mine, std::uint32_t tag,
                           std::chrono::milliseconds timeout, const std::string& origin,
                           const std::string& context_text);

// Sends input chunk j (counts.input[j] elements, chunks back to back in rank
// order) to rank j and receives rank j's into output chunk j, posting only the
// transfers that carry data (counts agreed by check_alltoall_counts), on Gloo
// slot `slot`.
void alltoall_exchange(const std::shared_ptr<gloo::Context>& context, const Buffer& output,
                       const Buffer& input, const AlltoallCounts& counts, std::uint64_t slot,
                       std::chrono::milliseconds timeout);

}  // namespace ddp::detail
