#include "progress_recorder.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

#include "ddp/worker/step_recorder.h"
#include "ddp/worker_contract/env_names.h"

namespace ddp::detail {

// The agent's page: a sealed (no grow, no shrink) memfd of exactly one page
// that starts with the magic. Anything else is left alone: a stray
// DDP_PROGRESS_FD must never make the library write into some file.
progress::Page* map_progress_page(const char* text) {
  if (text == nullptr || *text == '\0') return nullptr;
  char* end = nullptr;
  const long fd = std::strtol(text, &end, 10);
  if (*end != '\0' || fd < 3 || fd > 1 << 20) return nullptr;
  const int seals = ::fcntl(static_cast<int>(fd), F_GET_SEALS);
  struct stat st {};
  if (seals < 0 || (seals & (F_SEAL_GROW | F_SEAL_SHRINK)) != (F_SEAL_GROW | F_SEAL_SHRINK) ||
      ::fstat(static_cast<int>(fd), &st) != 0 ||
      st.st_size != static_cast<off_t>(progress::kPageBytes)) {
    spdlog::debug("{}={} is not an agent's progress page; progress is not recorded",
                  env_names::kProgressFd, text);
    return nullptr;
  }
  void* memory = ::mmap(nullptr, progress::kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                        static_cast<int>(fd), 0);
  if (memory == MAP_FAILED) return nullptr;
  auto* page = static_cast<progress::Page*>(memory);
  if (page->magic != progress::kMagic || page->version != progress::kVersion) {
    ::munmap(memory, progress::kPageBytes);
    return nullptr;
  }
  // The mapping is all we need: the descriptor goes, so that programs this
  // worker starts do not inherit it.
  ::close(static_cast<int>(fd));
  page->pid.store(static_cast<std::int32_t>(::getpid()), std::memory_order_release);
  return page;
}

progress::Page* progress_page() {
  static progress::Page* const page = map_progress_page(std::getenv(env_names::kProgressFd));
  return page;
}

GroupProgress::GroupProgress(const std::string& name, int rank, int size) {
  progress::Page* page = progress_page();
  if (page == nullptr) return;
  const auto index = page->groups_claimed.fetch_add(1, std::memory_order_relaxed);
  if (index >= static_cast<std::uint32_t>(progress::kMaxGroups)) return;
  progress::GroupSlot& slot = page->groups[index];
  std::memset(slot.name, 0, sizeof(slot.name));
  std::memcpy(slot.name, name.data(), std::min(name.size(), sizeof(slot.name)));
  slot.size.store(static_cast<std::uint32_t>(size), std::memory_order_relaxed);
  slot.rank.store(rank, std::memory_order_relaxed);
  slot.in_use.store(1, std::memory_order_release);
  slot_ = &slot;
}

void release_group_progress() {
  progress::Page* page = progress_page();
  if (page == nullptr) return;
  for (auto& slot : page->groups) {
    slot.in_use.store(0, std::memory_order_release);  // first: readers skip the slot
    slot.issued.store(0, std::memory_order_relaxed);
    slot.completed.store(0, std::memory_order_relaxed);
    slot.last_kind.store(0, std::memory_order_relaxed);
    slot.last_bytes.store(0, std::memory_order_relaxed);
    slot.last_issued_ns.store(0, std::memory_order_relaxed);
    slot.last_completed_ns.store(0, std::memory_order_relaxed);
    slot.waiting_since_ns.store(0, std::memory_order_relaxed);
  }
  page->groups_claimed.store(0, std::memory_order_release);
}

void StepProgress::gradients_ready() {
  if (progress_page() == nullptr) return;
  ready_ns_ = progress::now_ns();
}

void StepProgress::step_end(bool synchronized) {
  progress::Page* page = progress_page();
  if (page == nullptr) return;
  const std::int64_t now = progress::now_ns();
  if (!synchronized) {
    page->no_sync_steps.fetch_add(1, std::memory_order_relaxed);
    page->last_step_ns.store(now, std::memory_order_release);
    return;  // its compute counts towards the synchronized step that follows
  }
  if (last_end_ns_ != 0 && ready_ns_ >= last_end_ns_) {
    const std::int64_t compute = ready_ns_ - last_end_ns_;
    const std::int64_t smoothed = page->compute_ns.load(std::memory_order_relaxed);
    // An exponential average over about the last five steps.
    page->compute_ns.store(smoothed == 0 ? compute : smoothed + (compute - smoothed) / 5,
                           std::memory_order_relaxed);
    page->last_compute_ns.store(compute, std::memory_order_relaxed);
    page->last_wall_ns.store(now - last_end_ns_, std::memory_order_relaxed);
    page->total_compute_ns.fetch_add(compute, std::memory_order_relaxed);
    page->timed_steps.fetch_add(1, std::memory_order_relaxed);
  }
  last_end_ns_ = now;
  page->steps.fetch_add(1, std::memory_order_relaxed);
  page->last_step_ns.store(now, std::memory_order_release);
}

}  // namespace ddp::detail

namespace ddp {

StepRecorder::StepRecorder() : progress_(std::make_unique<detail::StepProgress>()) {}
StepRecorder::~StepRecorder() = default;

void StepRecorder::gradients_ready() { progress_->gradients_ready(); }
void StepRecorder::step_end(bool synchronized) { progress_->step_end(synchronized); }

}  // namespace ddp
