#include "recovery/abortable_store.h"

#include <algorithm>

#include "ddp/common/error.h"
#include "ddp/common/time.h"

namespace ddp::detail {

AbortableStore::AbortableStore(std::shared_ptr<Store> base,
                               std::shared_ptr<const AbortSignal> signal)
    : Store(base->timeout()), base_(std::move(base)), signal_(std::move(signal)) {}

void AbortableStore::throw_if_aborted(const char* op) const {
  if (signal_->is_set()) {
    throw GroupChanged(std::string("AbortableStore::") + op,
                       "the round ended while this worker waited in the store: " + signal_->why());
  }
}

template <typename Call>
auto AbortableStore::in_slices(const char* op, Duration timeout, Call&& call) {
  const Deadline deadline(timeout);
  for (;;) {
    throw_if_aborted(op);
    const Duration slice = std::min<Duration>(kSlice, deadline.remaining());
    try {
      return call(std::max(slice, Duration(1)));
    } catch (const TimeoutError&) {
      if (deadline.expired()) throw;
    }
  }
}

void AbortableStore::set(const std::string& key, const std::string& value) {
  throw_if_aborted("set");
  base_->set(key, value);
}

std::string AbortableStore::get(const std::string& key, Duration timeout) {
  return in_slices("get", timeout, [&](Duration slice) { return base_->get(key, slice); });
}

std::int64_t AbortableStore::add(const std::string& key, std::int64_t delta) {
  throw_if_aborted("add");
  return base_->add(key, delta);
}

std::string AbortableStore::compare_set(const std::string& key, const std::string& expected,
                                        const std::string& desired) {
  throw_if_aborted("compare_set");
  return base_->compare_set(key, expected, desired);
}

void AbortableStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  in_slices("wait", timeout, [&](Duration slice) {
    base_->wait(keys, slice);
    return 0;
  });
}

bool AbortableStore::check(const std::vector<std::string>& keys) {
  throw_if_aborted("check");
  return base_->check(keys);
}

bool AbortableStore::delete_key(const std::string& key) {
  throw_if_aborted("delete_key");
  return base_->delete_key(key);
}

std::int64_t AbortableStore::num_keys() {
  throw_if_aborted("num_keys");
  return base_->num_keys();
}

std::vector<std::string> AbortableStore::multi_get(const std::vector<std::string>& keys,
                                                   Duration timeout) {
  return in_slices("multi_get", timeout,
                   [&](Duration slice) { return base_->multi_get(keys, slice); });
}

void AbortableStore::multi_set(const std::vector<std::string>& keys,
                               const std::vector<std::string>& values) {
  throw_if_aborted("multi_set");
  base_->multi_set(keys, values);
}

void AbortableStore::append(const std::string& key, const std::string& value) {
  throw_if_aborted("append");
  base_->append(key, value);
}

}  // namespace ddp::detail
