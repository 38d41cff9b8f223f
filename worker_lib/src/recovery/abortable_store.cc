#include "recovery/abortable_store.h"

#include <algorithm>

#include "ddp/common/error.h"
#include "ddp/common/time.h"

namespace ddp::detail {

AbortableStore::AbortableStore(std::shared_ptr<Store> base,
                               std::shared_ptr<const AbortSignal> signal)
    : ForwardingStore(std::move(base), "AbortableStore"), signal_(std::move(signal)) {}

void AbortableStore::before_call(const char* op) {
  if (signal_->is_set()) {
    throw GroupChanged(std::string("AbortableStore::") + op,
                       "the round ended while this worker waited in the store: " + signal_->why());
  }
}

void AbortableStore::run_blocking(const char* op, Duration timeout, const BlockingCall& call) {
  const Deadline deadline(timeout);
  for (;;) {
    before_call(op);
    const Duration slice = std::min<Duration>(kSlice, deadline.remaining());
    try {
      return call(std::max(slice, Duration(1)));
    } catch (const TimeoutError&) {
      if (deadline.expired()) throw;
    }
  }
}

}  // namespace ddp::detail
