// ddp::in_place (ddp/worker/recovery.h): in-place recovery for a program that
// makes its own groups, over the same ControlClient that init_process_group
// opens.
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "ddp/common/env.h"
#include "ddp/common/error.h"
#include "ddp/worker/recovery.h"
#include "ddp/worker_contract/env_names.h"
#include "recovery/abortable_store.h"
#include "recovery/control_client.h"
#include "recovery/reform.h"

namespace ddp::in_place {
namespace {

std::mutex local_rank_mutex;
int opened_local_rank = 0;  // this worker's slot on its node, for wait_next_round's check

detail::ControlClient* require_open(const char* origin) {
  auto* control = detail::ControlClient::get();
  if (control == nullptr) {
    throw InvalidArgument(origin,
                          "this worker does not recover in place (ddp::in_place::open() found no "
                          "agent's control channel, or was not called)");
  }
  return control;
}

}  // namespace

bool open() {
  if (const auto addr = env::get(env_names::kStoreAddr); !addr || addr->empty()) {
    return is_open();  // not ddprun's worker (init_process_group may have opened it)
  }
  std::string problem;
  const auto round =
      contract::decode_environment([](const char* name) { return env::get(name); }, &problem);
  if (!round) throw InvalidArgument("ddp::in_place::open", problem + " (ddprun sets them)");
  {
    std::lock_guard lock(local_rank_mutex);
    opened_local_rank = round->local_rank;
  }
  return detail::ControlClient::open(round->change_grace) != nullptr;
}

bool is_open() { return detail::ControlClient::get() != nullptr; }

RoundNow current_round() {
  RoundNow now;
  auto* control = detail::ControlClient::get();
  if (control == nullptr) return now;
  const auto current = control->current();
  now.generation = current.generation;
  now.number = current.number;
  now.ended = current.ended;
  now.why = current.why;
  return now;
}

int round_number(int generation) {
  auto* control = detail::ControlClient::get();
  return control == nullptr ? -1 : control->round_number(generation);
}

void track(const std::shared_ptr<ProcessGroup>& group) {
  if (auto* control = detail::ControlClient::get(); control != nullptr && group) {
    control->track(group);
  }
}

std::function<std::exception_ptr(std::exception_ptr)> failure_explainer() {
  auto* control = detail::ControlClient::get();
  if (control == nullptr) return {};
  return [control](std::exception_ptr error) { return control->explain(std::move(error)); };
}

std::shared_ptr<Store> round_store(std::shared_ptr<Store> base) {
  auto* control = detail::ControlClient::get();
  if (control == nullptr) return base;
  return std::make_shared<detail::AbortableStore>(std::move(base), control->signal());
}

contract::WorkerRound wait_next_round(std::chrono::milliseconds timeout) {
  auto* control = require_open("ddp::in_place::wait_next_round");
  int local_rank = 0;
  {
    std::lock_guard lock(local_rank_mutex);
    local_rank = opened_local_rank;
  }
  return detail::named_round(control->wait_next_round(timeout), local_rank);
}

bool report_reformed(const contract::WorkerRound& round, double wait_seconds,
                     double build_seconds) {
  auto* control = detail::ControlClient::get();
  if (control == nullptr) return false;
  return control->send(
      contract::encode(contract::Reformed{round.round, round.rank, wait_seconds, build_seconds}));
}

}  // namespace ddp::in_place
