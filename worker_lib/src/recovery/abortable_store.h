// A store whose blocking calls end early when the round they serve ends: they
// wait in slices and, once the round's abort is signalled, throw
// GroupChanged naming why. A worker that recovers in place builds the groups
// of a new round through one, so that yet another change of membership in
// the meantime does not leave it waiting for peers that will never come.
//
// Ownership: shares the base store and the signal. Blocking: as the base
// store's calls, plus at most one slice after the abort. Thread-safety: as
// the base store (every method may be called from several threads); the
// signal may be set from any thread. Errors: the base store's, and
// GroupChanged after the abort.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/store/forwarding_store.h"

namespace ddp::detail {

// Set once, by whoever learns that the round ended.
class AbortSignal {
 public:
  void set(const std::string& why) {
    std::lock_guard lock(mutex_);
    if (set_.load()) return;  // the first reason stays
    why_ = why;
    set_.store(true);
  }
  bool is_set() const { return set_.load(); }
  std::string why() const {
    std::lock_guard lock(mutex_);
    return why_;
  }

 private:
  mutable std::mutex mutex_;
  std::atomic<bool> set_{false};
  std::string why_;
};

class AbortableStore final : public ForwardingStore {
 public:
  // How long one slice of a blocking call waits in the base store.
  static constexpr Duration kSlice = std::chrono::milliseconds(200);

  AbortableStore(std::shared_ptr<Store> base, std::shared_ptr<const AbortSignal> signal);

 private:
  // Throws GroupChanged once the signal is set.
  void before_call(const char* op) override;
  // Runs `call(slice)` until it returns, the signal is set or `timeout` passed.
  void run_blocking(const char* op, Duration timeout, const BlockingCall& call) override;

  std::shared_ptr<const AbortSignal> signal_;
};

}  // namespace ddp::detail
