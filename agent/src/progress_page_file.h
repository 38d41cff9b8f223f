// The agent's side of one worker's progress page (ddp/worker_contract/progress_page.h):
// a sealed one-page memfd the worker inherits (ProcessSpec::inherit_fds, named
// by DDP_PROGRESS_FD), mapped here to be read. Nothing outlives the two
// processes: no name in /dev/shm, no file.
//
// Ownership: owns the descriptor (close it with close_fd() once the worker
// started) and the mapping. Blocking: never. Thread-safety: read() may run
// while the worker writes (the page's atomics); one thread owns the object.
// Errors: create() throws InternalError when the kernel refuses a memfd.
#pragma once

#include <cstdint>
#include <memory>

#include "rank_status.h"

namespace ddp::agent {

class ProgressPageFile {
 public:
  static std::unique_ptr<ProgressPageFile> create();
  ~ProgressPageFile();
  ProgressPageFile(const ProgressPageFile&) = delete;
  ProgressPageFile& operator=(const ProgressPageFile&) = delete;

  // The descriptor to hand to the worker; -1 after close_fd().
  int fd() const { return fd_; }
  void close_fd();

  // Fills `out`'s progress fields (has_page, groups, steps, times) from the
  // page as it is now; `now_ns` is progress::now_ns(), `since_start` the
  // worker's age (the age of a time the worker never wrote, and the most any
  // age reads: a time before the worker started, or before a kept worker's
  // round began, counts from then). Every value is the worker's and
  // untrusted: names are cut to printable characters (ddp/common/text.h),
  // times in the future read as zero ages, counts that make no sense as zero.
  void read(RankStatus& out, std::int64_t now_ns, Millis since_start) const;

 private:
  ProgressPageFile(int fd, progress::Page* page) : fd_(fd), page_(page) {}
  int fd_;
  progress::Page* page_;
};

}  // namespace ddp::agent
