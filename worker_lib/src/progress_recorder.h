// The worker's side of the progress page (ddp/worker_contract/progress_page.h): maps
// the page the agent passed in DDP_PROGRESS_FD (once, on first use) and records
// collectives and DDP steps into it with atomic stores only.
//
// Without a page (no agent, an agent that does not watch progress, or a
// descriptor that is not an agent's sealed one-page memfd) every call is a
// no-op costing one branch. Thread-safety: GroupProgress::issued is called under
// the group's issue lock and completed() from the thread that completes work in
// issue order; step_*() from the thread driving the Reducer. Never throws.
#pragma once

#include <cstdint>
#include <string>

#include "ddp/worker_contract/progress_page.h"

namespace ddp::detail {

// The process' page, or null. Maps it on the first call (thread-safe).
progress::Page* progress_page();

// Maps the page named by `fd_text` (DDP_PROGRESS_FD's value): an agent's
// sealed one-page memfd with the magic, whose descriptor it then closes.
// Null (and the descriptor left alone) for anything else. Exposed for tests.
progress::Page* map_progress_page(const char* fd_text);

// Frees every group slot of the page (in-place recovery: the groups of the
// round that ended are gone, the next round's claim slots from the first).
// Groups made before must not record afterwards (aborted ones do not).
void release_group_progress();

// One process group's slot of the page (null when none is left or no page).
class GroupProgress {
 public:
  GroupProgress() = default;
  GroupProgress(const std::string& name, int rank, int size);

  // The issue and completion sides may run on two threads. Each stores its
  // counter, then reads the other's (sequentially consistent), so at least one
  // of them sees that `seq` became the oldest outstanding collective and
  // stamps waiting_since_ns.
  void issued(std::uint64_t seq, progress::Kind kind, std::uint64_t bytes) {
    if (slot_ == nullptr) return;
    const std::int64_t now = progress::now_ns();
    slot_->last_kind.store(static_cast<std::uint32_t>(kind), std::memory_order_relaxed);
    slot_->last_bytes.store(bytes, std::memory_order_relaxed);
    slot_->last_issued_ns.store(now, std::memory_order_relaxed);
    slot_->issued.store(seq + 1);
    if (slot_->completed.load() == seq) slot_->waiting_since_ns.store(now);
  }
  void completed(std::uint64_t seq) {
    if (slot_ == nullptr) return;
    const std::int64_t now = progress::now_ns();
    slot_->last_completed_ns.store(now, std::memory_order_relaxed);
    slot_->completed.store(seq + 1);
    if (slot_->issued.load() > seq + 1) slot_->waiting_since_ns.store(now);
  }

 private:
  progress::GroupSlot* slot_ = nullptr;
};

// DDP step boundaries (the Reducer calls these).
class StepProgress {
 public:
  // The backward pass asked for its gradients (finalize() began).
  void gradients_ready();
  // finalize() returned; `synchronized` is false under no_sync.
  void step_end(bool synchronized);

 private:
  std::int64_t last_end_ns_ = 0;
  std::int64_t ready_ns_ = 0;
};

}  // namespace ddp::detail
