#include "file_timer_service.h"

#include <csignal>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/common/logging.h"

namespace ddp::agent {

FileTimerService::FileTimerService(const AgentOptions& options, WorkerGroup& group,
                                   AgentEvents& events)
    : options_(options), group_(group), events_(events), logger_(log::get("ddprun")) {}

FileTimerService::~FileTimerService() { stop(); }

bool FileTimerService::start() {
  if (options_.watch.timer_file.empty()) return true;
  try {
    timer_ = std::make_unique<FileTimerServer>(options_.watch.timer_file);
  } catch (const std::exception& e) {
    events_.notice(std::string("cannot serve the file timer: ") + e.what());
    return false;
  }
  logger_->info("serving torch's file timer on {}", timer_->path());
  group_.set_timer(timer_.get());
  return true;
}

void FileTimerService::stop() {
  group_.set_timer(nullptr);
  timer_.reset();
}

// Requests from our running workers only; torch's reaping otherwise.
void FileTimerService::serve() {
  std::set<int> pids;
  for (const auto& w : group_.workers()) {
    if (w.running) pids.insert(w.pid);
  }
  try {
    timer_->drain(pids);
  } catch (const std::exception& e) {
    logger_->warn("file timer: {}", e.what());
  }
  for (const Reap& reap : plan_reaps(timer_->take_expired(options_.runtime->wall_now()))) {
    // torch clears every timer of a reaped pid, expired or not.
    timer_->forget_pid(reap.pid);
    Worker* found = group_.find(reap.pid);
    if (found == nullptr || !found->running) continue;
    Worker& worker = *found;
    // torch logs this line at its default level: so does ddprun.
    events_.notice(fmt::format("Reaping worker_pid=[{}]. Expired timers: [{}]", reap.pid,
                               fmt::join(reap.scopes, ", ")));
    if (!reap.signal_from) {
      logger_->info("No signal specified with worker=[{}]. Do not reap it.", reap.pid);
      continue;
    }
    const ExpiredTimer& first = *reap.signal_from;
    worker.ended_by_agent = "the file timer of scope '" + first.scope_id +
                            "' expired (torch.distributed.elastic.timer.expires): ddprun sent " +
                            signal_name(first.signal);
    events_.notice(fmt::format(
        "timer of scope '{}' expired on rank {} (local rank {}, pid {}): "
        "sending {}",
        first.scope_id, worker.rank, worker.local_rank, reap.pid, signal_name(first.signal)));
    ::kill(reap.pid, first.signal);  // our unreaped child: the pid cannot be reused
  }
}

}  // namespace ddp::agent
