#include "progress_page_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <string_view>

#include "ddp/common/error.h"
#include "ddp/common/text.h"

namespace ddp::agent {
namespace {

// How long ago `then_ns` was, at most `since_start` (a time never written, or
// one before the worker started, reads as the worker's age).
Millis age(std::int64_t now_ns, std::int64_t then_ns, Millis since_start) {
  if (then_ns <= 0) return since_start;
  if (then_ns >= now_ns) return Millis(0);
  return std::min(Millis((now_ns - then_ns) / 1000000), since_start);
}

// Total compute over `timed` steps, per step; zero when either is not a
// positive count (both are the worker's to write: any 64-bit pattern).
Millis mean_of(std::int64_t total_ns, std::uint64_t timed) {
  if (total_ns <= 0 || timed == 0) return Millis(0);
  return Millis(static_cast<std::int64_t>(static_cast<std::uint64_t>(total_ns) / timed / 1000000));
}

}  // namespace

std::unique_ptr<ProgressPageFile> ProgressPageFile::create() {
  const int fd = ::memfd_create("ddprun-progress", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    throw InternalError("progress page", std::string("memfd_create: ") + std::strerror(errno));
  }
  void* memory = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(progress::kPageBytes)) == 0 &&
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) == 0) {
    memory = ::mmap(nullptr, progress::kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (memory == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    throw InternalError("progress page",
                        std::string("cannot set up a memfd page: ") + std::strerror(err));
  }
  auto* page = new (memory) progress::Page();  // magic and version; the rest zero
  return std::unique_ptr<ProgressPageFile>(new ProgressPageFile(fd, page));
}

ProgressPageFile::~ProgressPageFile() {
  close_fd();
  ::munmap(page_, progress::kPageBytes);
}

void ProgressPageFile::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void ProgressPageFile::read(RankStatus& out, std::int64_t now_ns, Millis since_start) const {
  const progress::Page& page = *page_;
  out.has_page = page.pid.load(std::memory_order_acquire) != 0;
  out.groups.clear();
  if (!out.has_page) return;
  out.steps = page.steps.load(std::memory_order_relaxed);
  out.no_sync_steps = page.no_sync_steps.load(std::memory_order_relaxed);
  out.since_step = age(now_ns, page.last_step_ns.load(std::memory_order_acquire), since_start);
  out.compute = Millis(std::max<std::int64_t>(0, page.compute_ns.load() / 1000000));
  out.last_wall = Millis(std::max<std::int64_t>(0, page.last_wall_ns.load() / 1000000));
  out.mean_compute = mean_of(page.total_compute_ns.load(), page.timed_steps.load());
  for (const auto& slot : page.groups) {
    if (slot.in_use.load(std::memory_order_acquire) == 0) continue;
    GroupStatus g;
    const std::string_view name(slot.name, sizeof(slot.name));
    g.name = printable(name.substr(0, std::min(name.find('\0'), name.size())));
    g.size = static_cast<int>(std::min<std::uint32_t>(slot.size.load(), 1u << 24));
    g.rank = slot.rank.load();
    g.completed = slot.completed.load();
    g.issued = std::max(slot.issued.load(), g.completed);
    g.last_kind = progress::kind_of(slot.last_kind.load()).value_or(progress::Kind::kNone);
    g.last_bytes = slot.last_bytes.load();
    g.since_issued = age(now_ns, slot.last_issued_ns.load(), since_start);
    g.since_completed = age(now_ns, slot.last_completed_ns.load(), since_start);
    g.waiting =
        g.in_collective() ? age(now_ns, slot.waiting_since_ns.load(), since_start) : Millis(0);
    out.groups.push_back(std::move(g));
  }
}

}  // namespace ddp::agent
