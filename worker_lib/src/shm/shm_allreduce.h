// The same-host fast path of the Gloo backend: all-reduce through one POSIX
// shared-memory segment that every rank of a group maps. No sockets, no kernel
// copies, no Gloo thread: the role NCCL's SHM transport plays for GPUs on one node.
//
// Setup (ShmAllreduce::create, a collective of the group): rank 0 creates the
// segment, reserves its pages (posix_fallocate, so a full /dev/shm is an error
// now and not a SIGBUS later) and publishes its name and a random nonce in the
// group's store; every rank maps it and checks the nonce. The fast path is used
// only when every rank could map it: on another host, in another IPC namespace
// or with /dev/shm too small, create() returns nullptr on every rank alike and
// the caller keeps using TCP. Rank 0 unlinks the name as soon as every rank has
// answered, so the memory goes away with the last process however it ends.
//
// Algorithm, per chunk of at most slot_bytes:
//   - small buffers (at most kSmallBytes): every rank copies its buffer into its
//     slot; barrier; every rank reduces all slots in rank order itself.
//   - larger: every rank copies the parts the others reduce into its slot;
//     barrier; rank r reduces part r over all ranks in rank order (dividing for
//     AVG) and publishes it; barrier; every rank copies the other parts back.
// Two slot sets alternate, so a chunk never overwrites a slot that a slower rank
// still reads from the chunk before. Every rank ends with identical bits.
//
// Broadcast of a list of buffers, read as one stream, per chunk of at most
// size x slot_bytes (a whole slot set): the root copies the chunk in; barrier;
// every other rank copies it out. One copy in and one out a rank, against the
// all-reduce's three passes, and no staging memory: what moves a replica's state
// to a newcomer (ReplicaState).
//
// Waiting: a short spin, then a futex sleep. While asleep the waiter checks every
// 50 ms that the awaited peer's process still exists (its /proc/<pid>/stat, with
// the start time it had at setup, and not a zombie), so a dead peer gives
// NetworkError at once instead of a timeout after the group's full timeout.
// Peers this rank cannot see (threads of one process, another PID namespace)
// are not watched.
//
// Abort (abort(), from any thread, while another runs allreduce()): marks the
// segment aborted by this rank and wakes every sleeping waiter. Every rank's
// waits, this one's and its peers', check the mark on their slow path (after the
// spin, around each sleep; the spin itself is untouched) and once at the end of
// every barrier, and fail: GroupChanged on the rank that aborted, NetworkError
// naming it on the others. A sleeping waiter sees it within one sleep slice
// (50 ms) at the latest; a rank that arrives after the abort fails at its first
// barrier even when every peer had published that phase before aborting.
//
// Stale segments: before creating one, rank 0 removes this user's segments
// whose creator pid no longer exists and that are over a minute old (a creator
// killed between creating and unlinking the name).
//
// Thread-safety: one thread at a time calls allreduce() or broadcast(), and every
// rank calls them for the same buffers in the same order (the Gloo group's worker
// thread does);
// abort() may be called from any thread at any time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/worker/process_group.h"
#include "reduce_functions.h"

namespace ddp {
class Store;
class Deadline;
}  // namespace ddp

namespace ddp::detail {

class ShmAllreduce {
 public:
  // Buffers up to this size take the one-barrier path.
  static constexpr std::size_t kSmallBytes = 32 * 1024;

  // Slot sizes must be multiples of 64 (every part starts on a cache line) and
  // at least 4096.
  static constexpr bool valid_slot_bytes(std::size_t bytes) {
    return bytes >= 4096 && bytes % 64 == 0;
  }

  struct Options {
    // false: this rank does not take part and says so (the others then fall back
    // too). Every rank calls create() either way, so no rank waits for nothing.
    bool enabled = true;
    std::size_t slot_bytes = 1024 * 1024;                        // per rank and slot set; >= 4096
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // of the setup's store calls
    std::string group_name = "default";                          // for logs and errors
  };

  // Collective: every rank of the group calls it with the same slot_bytes,
  // `store` being the group's own, fresh namespace (as for Gloo's rendezvous).
  // nullptr when some rank cannot share the segment or is not enabled; the
  // reasons go to `why_not` (when given) and to the log at info level on rank 0
  // and on each rank that failed. Throws what the store throws (TimeoutError
  // when a rank never shows up).
  static std::unique_ptr<ShmAllreduce> create(Store& store, int rank, int size,
                                              const Options& options,
                                              std::string* why_not = nullptr);

  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // In-place all-reduce of `count` elements of `dtype` at `data` with `fn`; then
  // divides by `divisor` when it is above 1 (AVG). Throws TimeoutError when the
  // peers do not all arrive before `deadline`, NetworkError when a peer's process
  // is gone (both name the rank).
  void allreduce(void* data, std::size_t count, DType dtype, ReduceFn fn, int divisor,
                 const Deadline& deadline);

  struct Part {
    void* data;
    std::size_t bytes;
  };
  // Copies the bytes of `parts` on `root` into every other rank's `parts` (the
  // same sizes in the same order on every rank). Errors as allreduce()'s.
  void broadcast(const std::vector<Part>& parts, int root, const Deadline& deadline);

  // Ends the all-reduce for every rank of the group (see above). Thread-safe,
  // idempotent (the first rank to abort is the one named), never blocks.
  void abort();

  std::size_t slot_bytes() const { return slot_bytes_; }
  const std::string& segment_name() const { return name_; }

 private:
  ShmAllreduce(int rank, int size, const Options& options);

  std::string create_segment();                      // rank 0; "" or why it failed
  std::string attach(const std::string& published);  // other ranks; "" or why it failed
  std::string map(int fd, std::size_t bytes);        // sets base_; "" or why it failed
  std::uint8_t* slot(std::size_t set, int rank) const;
  // Publishes this rank's next phase and waits until every peer reached it.
  void barrier(const Deadline& deadline, const char* what);
  void wait_for(int peer, std::uint32_t phase, const Deadline& deadline, const char* what);
  bool peer_alive(int peer) const;
  [[noreturn]] void throw_aborted(int by, const char* what) const;
  void chunk_small(std::uint8_t* data, std::size_t nbytes, std::size_t esize, DType dtype,
                   ReduceFn fn, int divisor, const Deadline& deadline);
  void chunk_split(std::uint8_t* data, std::size_t nbytes, std::size_t esize, DType dtype,
                   ReduceFn fn, int divisor, const Deadline& deadline);

  const int rank_;
  const int size_;
  const std::size_t slot_bytes_;
  const std::string group_name_;
  std::string name_;
  std::uint64_t nonce_ = 0;
  bool unlinked_ = true;  // rank 0 owns the name until every rank answered
  void* base_ = nullptr;
  std::size_t mapped_bytes_ = 0;
  std::uint32_t phase_ = 0;      // barriers passed; the same on every rank
  std::uint64_t rounds_ = 0;     // chunks reduced; selects the slot set
  std::vector<bool> checkable_;  // peers whose process this rank can watch
};

}  // namespace ddp::detail
