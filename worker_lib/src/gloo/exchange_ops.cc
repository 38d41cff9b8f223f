#include "gloo/exchange_ops.h"

#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <gloo/allgather.h>
#include <gloo/gather.h>
#include <gloo/scatter.h>

#include "ddp/common/error.h"

namespace ddp::detail {

namespace {

// Byte offsets of chunks laid back to back, `counts` elements each.
std::vector<std::size_t> byte_offsets(const std::vector<std::uint64_t>& counts,
                                      std::size_t element_bytes) {
  std::vector<std::size_t> offsets(counts.size());
  std::size_t at = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    offsets[i] = at;
    at += counts[i] * element_bytes;
  }
  return offsets;
}

}  // namespace

void gather_into_root(const std::shared_ptr<gloo::Context>& context, const Buffer& output,
                      const Buffer& input, int root, std::uint32_t tag,
                      std::chrono::milliseconds timeout) {
  gloo::GatherOptions opts(context);
  opts.setInput(static_cast<std::uint8_t*>(input.data), input.nbytes());
  if (context->rank == root)
    opts.setOutput(static_cast<std::uint8_t*>(output.data), output.nbytes());
  opts.setRoot(root);
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::gather(opts);
}

void scatter_from_root(const std::shared_ptr<gloo::Context>& context, const Buffer& output,
                       const Buffer& input, int root, std::uint32_t tag,
                       std::chrono::milliseconds timeout) {
  gloo::ScatterOptions opts(context);
  if (context->rank == root) {
    std::vector<std::uint8_t*> chunks;
    for (int r = 0; r < context->size; ++r) {
      chunks.push_back(static_cast<std::uint8_t*>(input.data) +
                       static_cast<std::size_t>(r) * output.nbytes());
    }
    opts.setInputs(chunks, output.nbytes());
  }
  opts.setOutput(static_cast<std::uint8_t*>(output.data), output.nbytes());
  opts.setRoot(root);
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::scatter(opts);
}

void check_alltoall_counts(const std::shared_ptr<gloo::Context>& context,
                           const AlltoallCounts& mine, std::uint32_t tag,
                           std::chrono::milliseconds timeout, const std::string& origin,
                           const std::string& context_text) {
  const auto n = static_cast<std::size_t>(context->size);
  auto words = mine.encode();
  std::vector<std::uint64_t> all(n * words.size());
  gloo::AllgatherOptions opts(context);
  opts.setInput(words.data(), words.size());
  opts.setOutput(all.data(), all.size());
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allgather(opts);
  std::vector<AlltoallCounts> per_rank;
  for (std::size_t r = 0; r < n; ++r) {
    per_rank.push_back(AlltoallCounts::decode(all.data() + r * words.size(), n));
  }
  auto mismatch = find_alltoall_mismatch(per_rank);
  if (!mismatch.empty()) throw InvalidArgument(origin, context_text + ": " + mismatch);
}

void alltoall_exchange(const std::shared_ptr<gloo::Context>& context, const Buffer& output,
                       const Buffer& input, const AlltoallCounts& counts, std::uint64_t slot,
                       std::chrono::milliseconds timeout) {
  const int n = context->size;
  const int me = context->rank;
  const std::size_t esize = element_size(input.dtype);
  const auto in_at = byte_offsets(counts.input, esize);
  const auto out_at = byte_offsets(counts.output, esize);
  auto* in_bytes = static_cast<std::uint8_t*>(input.data);
  auto* out_bytes = static_cast<std::uint8_t*>(output.data);
  const auto own = static_cast<std::size_t>(me);
  if (counts.input[own] > 0) {
    std::memmove(out_bytes + out_at[own], in_bytes + in_at[own], counts.input[own] * esize);
  }
  if (n == 1) return;
  // Unbound buffers only over memory that exists (an empty buffer may be null).
  std::unique_ptr<gloo::transport::UnboundBuffer> send_buf;
  std::unique_ptr<gloo::transport::UnboundBuffer> recv_buf;
  if (input.nbytes() > 0) send_buf = context->createUnboundBuffer(input.data, input.nbytes());
  if (output.nbytes() > 0) recv_buf = context->createUnboundBuffer(output.data, output.nbytes());
  int receives = 0;
  int sends = 0;
  for (int i = 1; i < n; ++i) {
    // Staggered, so that not every rank starts with rank 0.
    const auto from = static_cast<std::size_t>((me + n - i) % n);
    const auto to = static_cast<std::size_t>((me + i) % n);
    if (counts.output[from] > 0) {
      recv_buf->recv(static_cast<int>(from), slot, out_at[from], counts.output[from] * esize);
      ++receives;
    }
    if (counts.input[to] > 0) {
      send_buf->send(static_cast<int>(to), slot, in_at[to], counts.input[to] * esize);
      ++sends;
    }
  }
  for (int i = 0; i < receives; ++i) recv_buf->waitRecv(timeout);
  for (int i = 0; i < sends; ++i) send_buf->waitSend(timeout);
}

}  // namespace ddp::detail
