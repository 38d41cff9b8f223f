#include "spare.h"

#include "ddp/common/error.h"

namespace ddp::rendezvous_detail {
std::optional<std::string> SpareWait::look(Store& store, Liveness& liveness,
                                           Clock::time_point now) {
  if (!end_) end_ = try_get(store, RunKeys::end(prefix_));
  if (end_) return end_;
  if (!try_get(store, keys_.current()))
    throw ShutdownError(kDynamicOrigin, "the job ended while this node waited as a spare");
  const auto members = read_lineage(store, keys_, round_).members;
  if (members.empty() || liveness.any_alive_now(store, members, now, seen_)) return std::nullopt;
  RoundEnd lost;
  lost.kind = RoundEnd::Kind::kNodeLost;
  lost.node = 0;
  lost.member = members.front();
  end_ = end_round_once(store, prefix_, lost);
  return end_;
}

void SpareWait::wait(Store& store, Duration wait) {
  try {
    end_ = store.get(RunKeys::end(prefix_), wait);
  } catch (const TimeoutError&) {
  } catch (const NetworkError& e) {
    throw ShutdownError(kDynamicOrigin,
                        std::string("the store went away while this node waited as a "
                                    "spare (the job ended, or its store host died): ") +
                            e.what());
  }
}

}  // namespace ddp::rendezvous_detail
