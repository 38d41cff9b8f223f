// The progress page: one small shared-memory page per worker, created by the
// agent (a memfd, so nothing is left behind when either side dies) and passed
// to the worker as an inherited descriptor named by DDP_PROGRESS_FD. The worker
// library writes it on its hot path (plain atomic stores, no system call);
// the agent reads it to tell a worker that progresses from one that is stuck.
//
// What is written:
//   - per process group (at most kMaxGroups, claimed in creation order): its
//     name, size and this worker's rank in it; how many collectives were
//     issued and completed (sequence numbers are 0, 1, 2... in issue order, so
//     `issued` is the next sequence number); the kind and size of the last one
//     issued, when (steady clock) the last was issued and the last completed,
//     and since when the oldest outstanding one has been waiting;
//   - DDP step boundaries: synchronized steps and no_sync steps taken, when the
//     last one ended, and a smoothed compute time per synchronized step (from
//     the end of one step to the moment the next one asked for its gradients,
//     so time spent waiting for slower ranks is not in it).
//
// Contract between the two sides: every field is a lock-free atomic; the
// worker is the only writer, the agent only reads. A group slot's name, size
// and rank are written before `in_use` is set (release); a reader reads them
// only after it saw `in_use` (acquire). Fields of one slot are not read as one
// snapshot: a reader may see `issued` of a newer collective than `last_kind`
// describes. The agent must treat every value as untrusted (the worker runs
// user code): names are bounded and need not be NUL-terminated, counters may
// be anything.
//
// Times are steady-clock nanoseconds (CLOCK_MONOTONIC), comparable between
// processes of one host only.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace ddp::progress {

inline constexpr std::uint32_t kMagic = 0x50504444;  // "DDPP"
inline constexpr std::uint32_t kVersion = 1;
inline constexpr int kMaxGroups = 8;
inline constexpr std::size_t kNameBytes = 32;

// What a collective was (the worker library's operations).
enum class Kind : std::uint32_t {
  kNone = 0,
  kAllreduce,
  kBroadcast,
  kAllgather,
  kReduceScatter,
  kReduce,
  kBarrier,
  kAlltoall,
  kGather,
  kScatter,
};
const char* to_string(Kind kind);
// The Kind a number written by someone else names, or nullopt when it names none.
std::optional<Kind> kind_of(std::int64_t value);

struct GroupSlot {
  std::atomic<std::uint32_t> in_use{0};
  std::atomic<std::uint32_t> size{0};
  std::atomic<std::int32_t> rank{0};
  char name[kNameBytes] = {};
  std::atomic<std::uint64_t> issued{0};     // collectives issued: the next sequence number
  std::atomic<std::uint64_t> completed{0};  // collectives completed, in issue order
  std::atomic<std::uint32_t> last_kind{0};  // Kind of the last collective issued
  std::atomic<std::uint64_t> last_bytes{0};
  std::atomic<std::int64_t> last_issued_ns{0};
  std::atomic<std::int64_t> last_completed_ns{0};
  // When the oldest collective still outstanding began to wait: its issue, or
  // the completion of the one before it, whichever came last. Meaningful while
  // issued > completed.
  std::atomic<std::int64_t> waiting_since_ns{0};
};

struct Page {
  std::uint32_t magic = kMagic;  // written by the agent before the worker starts
  std::uint32_t version = kVersion;
  std::atomic<std::int32_t> pid{0};  // the writer, set when it attaches
  std::atomic<std::uint32_t> groups_claimed{0};
  std::atomic<std::uint64_t> steps{0};           // synchronized DDP steps
  std::atomic<std::uint64_t> no_sync_steps{0};   // steps under no_sync
  std::atomic<std::int64_t> last_step_ns{0};     // when the last step of either kind ended
  std::atomic<std::int64_t> compute_ns{0};       // smoothed compute time of a synchronized step
  std::atomic<std::int64_t> last_compute_ns{0};  // compute time of the last synchronized step
  std::atomic<std::int64_t> last_wall_ns{0};     // end to end time of the last synchronized step
  // Compute time summed over the synchronized steps whose compute is known
  // (every one after the first), and how many those are.
  std::atomic<std::int64_t> total_compute_ns{0};
  std::atomic<std::uint64_t> timed_steps{0};
  GroupSlot groups[kMaxGroups];
};

// The mapping's size: one page.
inline constexpr std::size_t kPageBytes = 4096;

static_assert(sizeof(Page) <= kPageBytes, "the progress page must fit one page");
static_assert(std::atomic<std::uint64_t>::is_always_lock_free &&
                  std::atomic<std::int64_t>::is_always_lock_free &&
                  std::atomic<std::uint32_t>::is_always_lock_free,
              "the progress page is shared between processes: its atomics must be lock-free");

// Steady-clock nanoseconds, the page's time base.
std::int64_t now_ns();

}  // namespace ddp::progress
