#include "in_place_recovery.h"

#include <cstdio>

#include "ddp/common/error.h"
#include "ddp/worker/init.h"
#include "ddp/worker/recovery.h"

namespace ddp::examples {

void register_replica_state(Training& t) {
  for (std::size_t i = 0; i < t.model.num_params(); ++i) {
    t.replica.add(t.model.name(i), Buffer::of(t.model.value(i)));
  }
  for (std::size_t i = 0; i < t.model.num_params(); ++i) {
    t.replica.add(t.model.name(i) + ".momentum", Buffer::of(t.model.momentum(i)));
  }
  t.replica.add("epoch", &t.progress.epoch);
  t.replica.add("position", &t.progress.position);
  t.replica.add("global_step", &t.progress.global_step);
}

void report_sync(const Training& t, const SyncResult& got) {
  if (t.flags.step_times) {
    std::printf("state-sync rank=%d root=%d received=%d live=%d bytes=%zu seconds=%.6f t=%.6f\n",
                t.pg->rank(), got.root, got.received ? 1 : 0, got.from_live ? 1 : 0, got.bytes,
                got.seconds, monotonic_seconds());
    std::fflush(stdout);
  }
  if (!got.from_live) return;
  std::printf(
      "rank %d: %s the state of rank %d (%.2f MiB in %.3f s): epoch %lld, sample %lld, "
      "global step %lld\n",
      t.pg->rank(), got.received ? "received" : "kept", got.root,
      static_cast<double>(got.bytes) / kMiB, got.seconds,
      static_cast<long long>(t.progress.epoch + 1), static_cast<long long>(t.progress.position),
      static_cast<long long>(t.progress.global_step));
  std::fflush(stdout);
}

void recover_in_place(Training& t, const std::string& why) {
  for (;;) {
    try {
      const Reformed r = reform();
      t.pg = default_group();
      t.ddp->reform(t.pg);
      t.refresh_grads();
      t.model.zero_grad();  // what the interrupted step accumulated
      const auto got = t.replica.sync(*t.pg);
      if (t.lead()) {
        // The agent's reason, short; what the program caught says the same at more length.
        std::printf("re-formed in place (%s): round %d, %d ranks (was %d) in %.3f s\n",
                    r.why.empty() ? why.c_str() : r.why.c_str(), r.round, r.world_size,
                    r.previous_world_size, r.seconds);
      }
      report_sync(t, got);
      return;
    } catch (const GroupChanged&) {
      // Yet another change while re-forming: the round after it.
    }
  }
}

}  // namespace ddp::examples
