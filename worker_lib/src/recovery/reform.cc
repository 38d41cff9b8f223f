#include "recovery/reform.h"

#include <chrono>

#include <fmt/format.h>

#include "ddp/common/error.h"
#include "ddp/common/logging.h"
#include "ddp/store/prefix_store.h"
#include "ddp/worker/recovery.h"
#include "progress_recorder.h"
#include "recovery/abortable_store.h"
#include "recovery/control_client.h"

namespace ddp {

namespace detail {

// A group of the current round: with in-place recovery, aborted when the round ends.
std::shared_ptr<ProcessGroup> round_group(InitState& s, std::shared_ptr<ProcessGroup> group) {
  if (s.control != nullptr && group) s.control->track(group);
  return group;
}

// The round's store: `base` inside `prefix`, its waits ended by the round's
// abort when this worker recovers in place.
std::shared_ptr<Store> round_store(const InitState& s, std::shared_ptr<Store> base,
                                   const std::string& prefix) {
  if (s.control != nullptr) {
    base = std::make_shared<detail::AbortableStore>(std::move(base), s.control->signal());
  }
  return prefix.empty() ? base : std::make_shared<PrefixStore>(prefix, std::move(base));
}

contract::WorkerRound named_round(const ControlClient::NextRound& next, int local_rank) {
  if (!next.round) {
    throw ProtocolError("ddp::reform",
                        "the agent's round message is malformed (a field missing or out of range)");
  }
  if (next.round->local_rank != local_rank) {
    throw ProtocolError("ddp::reform",
                        fmt::format("the agent's round names local rank {} for local rank {}",
                                    next.round->local_rank, local_rank));
  }
  return *next.round;
}

}  // namespace detail

bool recovers_in_place() {
  auto& s = detail::init_state();
  std::lock_guard lock(s.mutex);
  return s.initialized && s.control != nullptr;
}

Reformed reform() {
  auto& s = detail::init_state();
  std::lock_guard lock(s.mutex);
  const char* origin = "ddp::reform";
  detail::initialized_state(origin);
  if (s.control == nullptr) {
    throw InvalidArgument(origin,
                          "this worker does not recover in place (it needs "
                          "InitOptions::recover_in_place and an agent's control channel: ddprun)");
  }
  const auto started = std::chrono::steady_clock::now();
  Reformed reformed;
  reformed.previous_rank = s.rank;
  reformed.previous_world_size = s.world_size;
  if (const auto ended = s.control->signal(); ended && ended->is_set()) reformed.why = ended->why();
  // The ended round's groups go (aborted: their destructors do not wait for
  // peers), and with them their slots of the progress page.
  s.subgroups.clear();
  s.group.reset();
  s.next_group = 0;
  detail::release_group_progress();
  auto next = s.control->wait_next_round(s.options.timeout);
  const auto named = std::chrono::steady_clock::now();
  const contract::WorkerRound facts = detail::named_round(next, s.local_rank);
  try {
    if (facts.store_addr != s.store_addr || facts.store_port != s.store_port) {
      // The store moved (its host was lost): the round's agents name the new one.
      s.base_store = detail::connect_store(facts.store_addr, facts.store_port, s.store_token,
                                           s.options.timeout);
      s.store_addr = facts.store_addr;
      s.store_port = facts.store_port;
    }
    s.store = detail::round_store(s, s.base_store, facts.store_prefix);
    s.group = detail::round_group(
        s,
        detail::make_group(s.options.backend, std::make_shared<PrefixStore>("pg/default", s.store),
                           facts.rank, facts.world_size, s.options, s.local_rank, "default"));
  } catch (const std::exception& e) {
    if (!next.signal->is_set()) throw;
    throw GroupChanged(origin, fmt::format("round {} ended while this worker joined it ({}): {}",
                                           facts.round, next.signal->why(), e.what()));
  }
  s.rank = facts.rank;
  s.world_size = facts.world_size;
  s.local_world_size = facts.local_world_size;
  s.logger = log::init(fmt::format("rank {}", s.rank), spdlog::level::info);
  reformed.round = facts.round;
  reformed.rank = facts.rank;
  reformed.world_size = facts.world_size;
  reformed.group_rank = facts.group_rank;
  reformed.group_world_size = facts.group_world_size;
  reformed.restart_count = facts.restart_count;
  reformed.master_addr = facts.master_addr;
  reformed.master_port = facts.master_port;
  const auto built = std::chrono::steady_clock::now();
  reformed.seconds = std::chrono::duration<double>(built - started).count();
  in_place::report_reformed(facts, std::chrono::duration<double>(named - started).count(),
                            std::chrono::duration<double>(built - named).count());
  s.logger->info("re-formed in place: round {}, rank {}/{} (was {}/{}), {:.3f} s", facts.round,
                 facts.rank, facts.world_size, reformed.previous_rank, reformed.previous_world_size,
                 reformed.seconds);
  return reformed;
}

}  // namespace ddp
