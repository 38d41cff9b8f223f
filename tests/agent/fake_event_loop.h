// A scripted WorkerEventLoop: no processes, just events. A test decides how
// each launched "process" behaves (on_launch may queue its exit); signalled
// processes die of the signal unless told to ignore it.
#pragma once

#include <condition_variable>
#include <csignal>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "ddp/agent/worker_event_loop.h"

namespace ddp::agent::test {

class FakeEventLoop final : public WorkerEventLoop {
 public:
  struct Launch {
    int pid;
    ProcessSpec spec;
    std::map<std::string, std::string> env;
  };

  // Called after each launch with the launch (under no lock; may call exit()).
  std::function<void(FakeEventLoop&, const Launch&)> on_launch;
  // Signals that launched processes survive (SIGKILL always kills).
  std::set<int> ignored_signals;

  int launch(const ProcessSpec& spec) override {
    Launch launch;
    {
      std::lock_guard lock(mutex_);
      launch.pid = next_pid_++;
      launch.spec = spec;
      for (const auto& var : spec.env) {
        auto eq = var.find('=');
        launch.env[var.substr(0, eq)] = var.substr(eq + 1);
      }
      launches_.push_back(launch);
      alive_.insert(launch.pid);
    }
    if (on_launch) on_launch(*this, launch);
    return launch.pid;
  }

  void signal_group(int pid, int signo) override {
    std::lock_guard lock(mutex_);
    signals_.emplace_back(pid, signo);
    if (alive_.count(pid) && (signo == SIGKILL || !ignored_signals.count(signo))) {
      queue_exit_locked(pid, -signo);
    }
  }

  LoopEvent next_event(Clock::time_point deadline) override {
    std::unique_lock lock(mutex_);
    // A test must never hang: an endless wait turns into a timeout after 10 s.
    auto limit = std::min(deadline, Clock::now() + std::chrono::seconds(10));
    changed_.wait_until(lock, limit, [&] { return !events_.empty(); });
    if (events_.empty()) {
      LoopEvent timeout;
      timeout.kind = LoopEvent::Kind::kTimeout;
      if (deadline == Clock::time_point::max()) ++stuck_;
      return timeout;
    }
    LoopEvent event = events_.front();
    events_.pop_front();
    return event;
  }

  void wake() override {
    LoopEvent event;
    event.kind = LoopEvent::Kind::kWake;
    push(event);
  }

  // Makes a launched process exit with `status` (exit code, or -signal).
  void exit(int pid, int status) {
    std::lock_guard lock(mutex_);
    if (alive_.count(pid)) queue_exit_locked(pid, status);
  }

  void signal_agent(int signo) {
    LoopEvent event;
    event.kind = LoopEvent::Kind::kSignal;
    event.signo = signo;
    push(event);
  }

  std::vector<Launch> launches() const {
    std::lock_guard lock(mutex_);
    return launches_;
  }
  std::vector<std::pair<int, int>> signals() const {
    std::lock_guard lock(mutex_);
    return signals_;
  }
  // The pid the next launch gets (then counting up). Tests whose agent looks
  // a worker up in /proc (stacks of a hung worker) pick pids above pid_max, so
  // that no real process is ever named.
  void set_next_pid(int pid) {
    std::lock_guard lock(mutex_);
    next_pid_ = pid;
  }
  // Times the agent waited forever with nothing to come (a bug).
  int stuck() const {
    std::lock_guard lock(mutex_);
    return stuck_;
  }

 private:
  void queue_exit_locked(int pid, int status) {
    alive_.erase(pid);
    LoopEvent event;
    event.kind = LoopEvent::Kind::kExited;
    event.pid = pid;
    event.status = status;
    events_.push_back(event);
    changed_.notify_all();
  }
  void push(const LoopEvent& event) {
    std::lock_guard lock(mutex_);
    events_.push_back(event);
    changed_.notify_all();
  }

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<LoopEvent> events_;
  std::vector<Launch> launches_;
  std::vector<std::pair<int, int>> signals_;
  std::set<int> alive_;
  int next_pid_ = 1000;
  int stuck_ = 0;
};

}  // namespace ddp::agent::test
