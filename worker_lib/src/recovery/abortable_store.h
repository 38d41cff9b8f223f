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

#include "ddp/store/store.h"

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

class AbortableStore final : public Store {
 public:
  // How long one slice of a blocking call waits in the base store.
  static constexpr Duration kSlice = std::chrono::milliseconds(200);

  AbortableStore(std::shared_ptr<Store> base, std::shared_ptr<const AbortSignal> signal);

  void set(const std::string& key, const std::string& value) override;
  using Store::get;
  std::string get(const std::string& key, Duration timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  std::int64_t num_keys() override;
  using Store::multi_get;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     Duration timeout) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;
  void append(const std::string& key, const std::string& value) override;

 private:
  // Throws GroupChanged once the signal is set.
  void throw_if_aborted(const char* op) const;
  // Runs `call(slice)` until it returns, the signal is set or `timeout` passed.
  template <typename Call>
  auto in_slices(const char* op, Duration timeout, Call&& call);

  std::shared_ptr<Store> base_;
  std::shared_ptr<const AbortSignal> signal_;
};

}  // namespace ddp::detail
