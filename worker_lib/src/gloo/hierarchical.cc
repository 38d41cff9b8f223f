#include "gloo/hierarchical.h"

#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <gloo/transport/unbound_buffer.h>

#include "ddp/common/error.h"
#include "ddp/store/store.h"

namespace ddp::detail {

namespace {

std::string read_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string link_target(const char* path) {
  char target[PATH_MAX];
  const ssize_t n = ::readlink(path, target, sizeof(target) - 1);
  return n > 0 ? std::string(target, static_cast<std::size_t>(n)) : std::string("?");
}

// A block of the ring: elements [offset, offset + count) of the buffer.
struct Block {
  std::size_t offset;
  std::size_t count;
};

Block block_of(std::size_t count, std::size_t blocks, std::size_t b) {
  const std::size_t base = count / blocks, extra = count % blocks;
  return {b * base + std::min(b, extra), base + (b < extra ? 1 : 0)};
}

}  // namespace

std::string this_host_id() {
  char name[HOST_NAME_MAX + 1] = {};
  ::gethostname(name, sizeof(name) - 1);
  std::string id = name;
  id += '/';
  id += read_line("/proc/sys/kernel/random/boot_id");
  id += '/';
  id += link_target("/proc/self/ns/ipc");
  id += '/';
  id += link_target("/proc/self/ns/net");
  return id;
}

void check_host_id(const std::string& host_id) {
  if (host_id.empty() || host_id.find_first_of(",\n;") != std::string::npos) {
    throw InvalidArgument(
        "ProcessGroupGloo",
        fmt::format("host id '{}' must be non-empty, without ',' ';' or newline", host_id));
  }
}

HostPlan plan_hosts(Store& store, int rank, int size, const std::string& host_id,
                    bool want_hierarchical, bool want_shared_memory,
                    std::chrono::milliseconds timeout) {
  check_host_id(host_id);
  std::string mine;
  mine += want_hierarchical ? '1' : '0';
  mine += want_shared_memory ? '1' : '0';
  mine += host_id;
  store.set(fmt::format("hier/host/{}", rank), mine);
  if (rank == 0) {
    std::vector<std::string> keys;
    keys.reserve(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) keys.push_back(fmt::format("hier/host/{}", r));
    const auto answers = store.multi_get(keys, timeout);
    bool hierarchical = true, shared_memory = true;
    std::map<std::string, int> index;
    std::string hosts;
    for (const auto& answer : answers) {
      hierarchical = hierarchical && answer.size() > 2 && answer[0] == '1';
      shared_memory = shared_memory && answer.size() > 2 && answer[1] == '1';
      const auto [it, added] = index.emplace(answer.size() > 2 ? answer.substr(2) : answer,
                                             static_cast<int>(index.size()));
      hosts += ',';
      hosts += std::to_string(it->second);
    }
    std::string plan;
    plan += hierarchical ? '1' : '0';
    plan += shared_memory ? '1' : '0';
    plan += hosts;
    store.set("hier/plan", plan);
  }
  const std::string plan = store.get("hier/plan", timeout);
  HostPlan out;
  out.shared_memory = plan.size() > 1 && plan[1] == '1';
  std::vector<int> host_of;
  host_of.reserve(static_cast<std::size_t>(size));
  for (std::size_t pos = 2; pos < plan.size();) {
    const std::size_t end = std::min(plan.find(',', pos + 1), plan.size());
    host_of.push_back(std::stoi(plan.substr(pos + 1, end - pos - 1)));
    pos = end;
  }
  if (static_cast<int>(host_of.size()) != size) {
    throw BackendError(
        "ProcessGroupGloo",
        fmt::format("the group's host plan names {} ranks, not {}", host_of.size(), size));
  }
  out.host = host_of[static_cast<std::size_t>(rank)];
  out.local_size = 0;
  bool crowded = false;
  std::vector<int> count;
  for (int r = 0; r < size; ++r) {
    const int h = host_of[static_cast<std::size_t>(r)];
    if (h >= static_cast<int>(out.leaders.size())) {
      out.leaders.push_back(r);
      count.push_back(0);
    }
    if (r == rank) out.local_rank = count[static_cast<std::size_t>(h)];
    if (++count[static_cast<std::size_t>(h)] > 1) crowded = true;
  }
  out.hosts = static_cast<int>(out.leaders.size());
  out.local_size = count[static_cast<std::size_t>(out.host)];
  out.hierarchical = plan[0] == '1' && out.shared_memory && out.hosts > 1 && crowded;
  return out;
}

void ring_allreduce(gloo::Context& context, const std::vector<int>& ring, void* data,
                    std::size_t count, std::size_t esize, ReduceFn fn, std::uint64_t slot,
                    std::chrono::milliseconds timeout, std::vector<std::uint8_t>& scratch) {
  const std::size_t n = ring.size();
  if (n < 2 || count == 0) return;
  const auto me =
      static_cast<std::size_t>(std::find(ring.begin(), ring.end(), context.rank) - ring.begin());
  const int next = ring[(me + 1) % n], prev = ring[(me + n - 1) % n];
  const std::size_t largest = block_of(count, n, 0).count * esize;
  if (scratch.size() < largest) scratch.resize(largest);
  auto* bytes = static_cast<std::uint8_t*>(data);
  auto buffer = context.createUnboundBuffer(data, count * esize);
  auto incoming = context.createUnboundBuffer(scratch.data(), scratch.size());
  // Reduce-scatter: at step s, send block me - s and add block me - s - 1 from
  // prev. Then this rank holds block me + 1 reduced over the whole ring.
  for (std::size_t s = 0; s + 1 < n; ++s) {
    const Block out = block_of(count, n, (me + n - s) % n);
    const Block in = block_of(count, n, (me + 2 * n - s - 1) % n);
    if (in.count > 0) incoming->recv(prev, slot, 0, in.count * esize);
    if (out.count > 0) buffer->send(next, slot, out.offset * esize, out.count * esize);
    if (in.count > 0) incoming->waitRecv(timeout);
    if (out.count > 0) buffer->waitSend(timeout);
    if (in.count > 0) {
      std::uint8_t* at = bytes + in.offset * esize;
      fn(at, at, scratch.data(), in.count);
    }
  }
  // All-gather: at step s, send block me + 1 - s and receive block me - s in place.
  for (std::size_t s = 0; s + 1 < n; ++s) {
    const Block out = block_of(count, n, (me + 1 + n - s) % n);
    const Block in = block_of(count, n, (me + n - s) % n);
    if (in.count > 0) buffer->recv(prev, slot, in.offset * esize, in.count * esize);
    if (out.count > 0) buffer->send(next, slot, out.offset * esize, out.count * esize);
    if (in.count > 0) buffer->waitRecv(timeout);
    if (out.count > 0) buffer->waitSend(timeout);
  }
}

}  // namespace ddp::detail
