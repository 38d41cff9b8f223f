// torch's file timer served for this node's workers
// (TORCHELASTIC_ENABLE_FILE_TIMER=1): the agent reads their requests from the
// named pipe (file_timer.h) at each look, and an expired scope gets its worker
// signalled as torch's FileTimerServer does (the worker's pid, the earliest
// expired scope's signal; then all its timers go).
//
// Ownership: borrows the options, the worker group and the events (they must
// outlive it); owns the server and its pipe while started. Blocking: never.
// Thread-safety: the agent's thread only. Errors: start() returns false after
// telling the events why; serve() logs a read error and goes on.
#pragma once

#include <memory>

#include <spdlog/logger.h>

#include "ddp/agent/agent_events.h"
#include "ddp/agent/worker_spec.h"
#include "file_timer.h"
#include "worker_group.h"

namespace ddp::agent {

class FileTimerService {
 public:
  FileTimerService(const AgentOptions& options, WorkerGroup& group, AgentEvents& events);
  ~FileTimerService();
  FileTimerService(const FileTimerService&) = delete;
  FileTimerService& operator=(const FileTimerService&) = delete;

  // Serves the pipe of WatchOptions::timer_file (none when it is empty) and
  // tells the worker group its path; false when it cannot.
  bool start();
  // Stops serving (the pipe goes).
  void stop();
  bool active() const { return timer_ != nullptr; }
  // Reads the workers' requests and signals the workers whose timers expired.
  void serve();

 private:
  const AgentOptions& options_;
  WorkerGroup& group_;
  AgentEvents& events_;
  std::shared_ptr<spdlog::logger> logger_;
  std::unique_ptr<FileTimerServer> timer_;
};

}  // namespace ddp::agent
