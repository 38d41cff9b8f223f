// The workers of this node in the current round: their states, starting them
// (their log directories, streams, progress pages, control channels and the
// environment they get), resuming those kept through an in-place recovery,
// telling them control messages, their exits and failures, and stopping them.
// The round loop (agent.cc) decides when; the group does it.
//
// Ownership: borrows the options, the rendezvous handler, the event loop, the
// progress watch and the events (all must outlive it); owns the workers'
// control channels. Blocking: stop() waits for the workers' exits (the stop
// grace, then SIGKILL); everything else returns at once. Thread-safety: the
// agent's thread only. Errors: start() throws InvalidArgument when a log
// directory cannot be made or a program cannot be executed, InternalError when
// the event loop fails.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include <spdlog/logger.h>

#include "ddp/agent/agent_events.h"
#include "ddp/agent/failure_report.h"
#include "ddp/agent/worker_event_loop.h"
#include "ddp/agent/worker_spec.h"
#include "ddp/rendezvous/rendezvous.h"
#include "ddp/worker_contract/worker_contract.h"
#include "file_timer.h"
#include "progress_watch.h"
#include "worker_control.h"

namespace ddp::agent {

struct Worker {
  int local_rank = 0;
  int rank = 0;
  int pid = 0;
  bool running = false;
  std::string error_file;
  // Why the agent ended it, when it did (a hang): the failure's message.
  std::string ended_by_agent;
  // Kept through the last in-place recovery (a process of an earlier round).
  bool kept = false;
};

// Whether the workers run under a Python interpreter (ddprun's python3 -u, or
// a command naming one): they get PYTHONFAULTHANDLER and SIGABRT on a hang.
bool runs_python(const std::vector<std::string>& argv);

class WorkerGroup {
 public:
  WorkerGroup(const AgentOptions& options, RendezvousHandler& rendezvous, WorkerEventLoop& loop,
              ProgressWatch& watch, AgentEvents& events);
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // A new round begins (`round` must outlive it, until the next begin_round):
  // the workers of the last one are forgotten, or, with `keep` (they recover
  // in place), those still running are kept. `attempt` numbers its
  // attempt_<n> directory, plus one; `restart_count` (this agent's restarts)
  // and `job` (the job's counts) are what workers are told.
  void begin_round(const Round& round, int attempt, int restart_count, const JobCounts& job,
                   bool keep);

  // Starts a worker in every local slot without a running one; a worker kept
  // through an in-place recovery is told the new round instead.
  void start();

  // Sends `signo` to every running worker's process group, SIGKILL after the
  // grace, and waits until all have exited. A second handled signal escalates
  // to SIGKILL at once.
  void stop(int signo);

  // Marks the exited worker; returns it (or null when the pid is not ours).
  Worker* on_exit(const LoopEvent& event);

  // The worker's exit is a failure of the round: recorded for the report.
  void record_failure(const Worker& worker, const LoopEvent& event);
  const std::vector<ProcessFailure>& failures() const { return failures_; }
  void clear_failures() { failures_.clear(); }

  // Sends `message` to a running worker on its control channel, never waiting
  // for it to read. A worker whose channel is full (it has not read what it
  // was told before), or that cannot be told (refused), is a failed worker:
  // ended with SIGKILL, its failure saying why. A closed channel is a worker
  // on its way out: its exit says the rest.
  control::Sent tell(Worker& worker, const control::Message& message);

  // Sends `signo` to a worker's process group.
  void signal(const Worker& worker, int signo);

  std::size_t running_count() const;
  // The worker launched as `pid` in this round (or kept), or null.
  Worker* find(int pid);
  std::vector<Worker>& workers() { return workers_; }
  const std::vector<Worker>& workers() const { return workers_; }
  WorkerControl& control() { return control_; }
  const WorkerControl& control() const { return control_; }

  const RendezvousInfo& round_info() const { return round_->info(); }
  // The n of this round's attempt_<n> log directory (0 in the first round
  // this node ran workers in), and that directory's name below run_log_dir.
  int attempt() const { return attempt_ - 1; }
  std::string attempt_subdir_name() const;
  // The job's restarts when this round formed (what --max_restarts limits).
  int job_restarts() const { return job_.restarts; }
  // The workers run under Python.
  bool python() const { return python_; }
  // torch's file timer the workers are told of (null: none); must outlive
  // the group or be reset.
  void set_timer(FileTimerServer* timer) { timer_ = timer; }

 private:
  std::string attempt_subdir(int local_rank) const;
  Worker* running_worker(int local_rank);
  void start_worker(int local_rank);
  void resume_worker(Worker& worker);
  std::chrono::milliseconds change_grace() const;
  // What `worker` learns of the round (its environment, or its `round` message when kept).
  contract::WorkerRound round_of(const Worker& worker) const;
  std::vector<std::string> worker_env(const Worker& worker) const;
  ExitReason exit_reason(const Worker& worker, int status) const;
  WorkerExit exit_of(const Worker& worker, int status) const;

  const AgentOptions& options_;
  RendezvousHandler& rdzv_;
  WorkerEventLoop& loop_;
  ProgressWatch& watch_;
  AgentEvents& events_;
  std::shared_ptr<spdlog::logger> logger_;
  const bool python_;
  const Round* round_ = nullptr;
  int attempt_ = 0;
  int restart_count_ = 0;
  JobCounts job_;
  FileTimerServer* timer_ = nullptr;
  std::vector<Worker> workers_;
  std::map<int, std::size_t> pid_to_worker_;
  std::vector<ProcessFailure> failures_;
  // Workers are being stopped (their exits are not failures of their own).
  bool stopping_ = false;
  // The workers' control channels (in-place recovery).
  WorkerControl control_;
};

}  // namespace ddp::agent
