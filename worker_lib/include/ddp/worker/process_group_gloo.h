// The Gloo backend: CPU collectives over Gloo's TCP transport, full mesh, and
// all-reduce and broadcast through shared memory when every rank of the group is
// on this host.
//
// make_gloo_process_group() blocks until every rank of the group has exchanged
// its address through `store` and connected (at most options.timeout), then
// returns a ProcessGroup whose collectives run, in issue order, on the group's
// own worker thread. Buffers must be CPU buffers.
//
// Same-host fast path: unless turned off (GlooOptions::shared_memory, or
// DDP_SHM_DISABLE=1 like NCCL_SHM_DISABLE), the group also sets up a POSIX
// shared-memory segment (rank 0 creates it in /dev/shm; 2 x shm_slot_bytes per rank).
// When every rank could map it, all-reduce (and reduce_scatter, which is built
// on it), broadcast and broadcast_many bypass TCP (broadcast_is_fast() is then
// true); otherwise the group quietly keeps to TCP. A group over several hosts
// (GlooOptions::host_id) has no group-wide segment; when some host has several
// ranks, all-reduce is hierarchical instead (GlooOptions::hierarchical). Allgather, reduce, gather,
// scatter, alltoall, barrier and send/recv always use TCP.
//
// Every collective supports float32, float64, float16, bfloat16, int32, int64,
// uint8, int8 and bool, and the reductions SUM, AVG, MIN, MAX, PRODUCT, and
// BAND, BOR, BXOR on the integer dtypes and bool (float16/bfloat16 reduce in
// float and round once per step; integer AVG truncates toward zero; integer
// SUM/PRODUCT wrap like PyTorch's; on bool SUM is logical or, PRODUCT logical
// and, AVG is refused). Every path of the all-reduce (shared memory, direct,
// ring, bcube) takes every dtype and reduction.
//
// gather and scatter are Gloo's. alltoall first exchanges every rank's counts
// (a small allgather) and fails on every rank with InvalidArgument naming the
// ranks and counts that disagree (the group stays usable); then each rank sends
// and receives only the chunks that hold data. Its output and input must not
// overlap. recv_any receives from whichever other rank's send with its tag
// arrives first (Gloo's receive from a set of ranks) and names it in
// Work::source_rank().
//
// Failures: a collective that does not complete within options.timeout fails
// its Work with TimeoutError("ProcessGroupGloo::<op>", "... seq N ... ranks that
// did not arrive: [..]"); a peer whose connection broke gives NetworkError with
// the same details. After such a failure the group is unusable: every later
// operation fails with BackendError (create a new group). With debug_detail,
// ranks calling different collectives / sizes / dtypes / ops / roots get
// InvalidArgument naming each rank's call, and the group stays usable.
//
// Sequence numbers: collectives are numbered 0, 1, 2, ... per group; send, recv
// and recv_any are numbered separately (they are not collectives: only two ranks take part).
//
// Abort (ProcessGroup::abort, from any thread): queued operations and every
// later one fail at once with GroupChanged naming the reason. The operation in
// flight is woken at once (every TCP connection of the group is closed with a
// reset, the shared-memory segment is marked aborted) and fails with
// GroupChanged too; a Work that had completed stays completed. The peers'
// operations that wait on this rank fail with NetworkError, and so does the
// rest of their group: every group has a watcher thread that, within 100 ms of
// one of its connections being reset by a peer (a peer that aborted, or died
// with data unread), fails every connection of the group (with a reset too, so
// the failure spreads to every rank of the old group) and the shared-memory
// all-reduce fails on every rank once one rank aborted. A connection closed in
// order (a peer that destroyed its group) still fails only the operations that
// use it. The destructor of an aborted group returns promptly.
//
// Destruction fails queued operations with ShutdownError and waits for the one
// in flight (bounded by options.timeout).
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ddp/worker/process_group.h"

namespace ddp {

class Store;

enum class AllreduceAlgorithm : std::uint8_t {
  kAuto,          // kSharedMemory when the group has a segment; else kDirect while
                  // bytes x (size - 1) <= GlooOptions::direct_max_bytes, else kRing
  kRing,          // Gloo's ring (reduce-scatter + allgather), bandwidth-optimal
  kBcube,         // Gloo's bcube (recursive halving/doubling)
  kDirect,        // every rank sends its buffer to every other, one round trip, latency-optimal
  kSharedMemory,  // through the group's shared-memory segment (same host only)
  kHierarchical,  // ranks over several hosts, some sharing one: shared memory within each
                  // host, a ring of the hosts' leaders between them (see below)
};
const char* to_string(AllreduceAlgorithm algorithm);

struct GlooOptions {
  // Bound of the connection setup and of every collective.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  // Address the TCP transport binds and advertises to peers. Empty hostname and
  // iface: Gloo looks up this host's name. `iface` (e.g. "eth0", like
  // GLOO_SOCKET_IFNAME) takes precedence over hostname.
  std::string hostname;
  std::string iface;
  // The DDP_DEBUG=DETAIL consistency check before each collective: the ranks
  // exchange a small descriptor of the call (through the shared-memory segment
  // when the group has one, else Gloo's TCP all-gather) and all fail with
  // InvalidArgument naming the difference. nullopt: on when the environment
  // has DDP_DEBUG=DETAIL.
  std::optional<bool> debug_detail;
  AllreduceAlgorithm allreduce_algorithm = AllreduceAlgorithm::kAuto;
  // With kAuto, kDirect is used while buffer bytes x (size - 1) (what each rank
  // sends) is at most this: on loopback with 2 ranks one round trip beats the
  // ring's two up to about 512 KiB (bench/allreduce).
  std::size_t direct_max_bytes = 512 * 1024;
  // Largest send/recv of Gloo's ring (two are in flight per peer). Gloo's default is 1 MiB.
  std::size_t max_segment_bytes = 1024 * 1024;
  // The same-host shared-memory segment. nullopt: on unless the environment has
  // DDP_SHM_DISABLE=1. With allreduce_algorithm kSharedMemory it must be on, and
  // creating the group fails with BackendError when the ranks cannot share memory.
  std::optional<bool> shared_memory;
  // Bytes each rank stages per step of the shared-memory all-reduce (a multiple
  // of 64, at least 4096); larger buffers go through in several steps.
  std::size_t shm_slot_bytes = 1024 * 1024;
  // The hierarchical all-reduce, for a group over several hosts where some host
  // has several ranks: within each host the shared-memory path reduces a chunk,
  // the hosts' leaders (lowest rank of each) all-reduce it in a ring over TCP
  // while the host reduces the next chunk, and the leader shares the result
  // through shared memory. nullopt: on unless the environment has
  // DDP_HIERARCHICAL_ALLREDUCE=0. Needs shared_memory on every rank. With kAuto
  // it is chosen whenever it applies; with allreduce_algorithm kHierarchical
  // creating the group fails with BackendError when it does not apply.
  std::optional<bool> hierarchical;
  // Bytes per chunk of the hierarchical all-reduce's pipeline.
  std::size_t hierarchical_chunk_bytes = 4 * 1024 * 1024;
  // This rank's host as the group sees it: ranks with the same host id are on
  // one host (they share memory). Empty: the environment's DDP_HOST_ID, else
  // the host's name, boot id, and this process's IPC and network namespaces
  // (so network namespaces on one machine are hosts). No ',' ';' or newline.
  std::string host_id;
  // Name used in logs and error messages.
  std::string name = "default";
  // Called on the group's thread with a collective's failure (a broken
  // connection, a timeout; not an abort) before its Work fails with it;
  // returns the error to report. The worker library's in-place recovery
  // waits there for the agent's word, so that a failure a change of
  // membership caused reads GroupChanged. Empty: the failure as it is.
  std::function<std::exception_ptr(std::exception_ptr)> on_failure;
};

// Creates the group: `store` is this group's own namespace (a PrefixStore per
// group), shared by all its ranks. Throws InvalidArgument for a bad rank/size,
// TimeoutError when the peers do not all show up within options.timeout,
// NetworkError/BackendError when the transport cannot be set up.
std::shared_ptr<ProcessGroup> make_gloo_process_group(std::shared_ptr<Store> store, int rank,
                                                      int size, GlooOptions options = {});

// The algorithm the group's last all-reduce (or reduce_scatter) ran: kAuto
// before the first; never kAuto after one. For tests and benchmarks. Throws
// InvalidArgument when `group` is not a Gloo group. Thread-safe.
AllreduceAlgorithm last_allreduce_algorithm(const ProcessGroup& group);

}  // namespace ddp
