// Every event to several AgentEvents, in the order they were added (the
// printer, the live view, then the record, which writes the live view's board). Borrows them: they must outlive the fan-out.
// Thread-safety and blocking: those of its members.
#pragma once

#include <initializer_list>
#include <vector>

#include "ddp/agent/agent_events.h"

namespace ddp::agent {

class AgentEventsFanout final : public AgentEvents {
 public:
  AgentEventsFanout(std::initializer_list<AgentEvents*> to) : to_(to) {}

  void notice(const std::string& line) override {
    for (auto* e : to_) e->notice(line);
  }
  void report(const std::string& text) override {
    for (auto* e : to_) e->report(text);
  }
  void joining() override {
    for (auto* e : to_) e->joining();
  }
  void health_check(const std::string& failure) override {
    for (auto* e : to_) e->health_check(failure);
  }
  void round_formed(const RoundFormed& round) override {
    for (auto* e : to_) e->round_formed(round);
  }
  void workers_running() override {
    for (auto* e : to_) e->workers_running();
  }
  void workers_stopping() override {
    for (auto* e : to_) e->workers_stopping();
  }
  void membership_changed(const MembershipChange& change) override {
    for (auto* e : to_) e->membership_changed(change);
  }
  void worker_exited(const WorkerExit& exit) override {
    for (auto* e : to_) e->worker_exited(exit);
  }
  void worker_failed(const WorkerExit& exit) override {
    for (auto* e : to_) e->worker_failed(exit);
  }
  void restarting(const Restart& restart) override {
    for (auto* e : to_) e->restarting(restart);
  }
  void hang(const HangReport& hang) override {
    for (auto* e : to_) e->hang(hang);
  }
  void recovering(const std::string& why) override {
    for (auto* e : to_) e->recovering(why);
  }
  void recovered(const std::string& line) override {
    for (auto* e : to_) e->recovered(line);
  }
  void job_ended(int exit_code) override {
    for (auto* e : to_) e->job_ended(exit_code);
  }

 private:
  std::vector<AgentEvents*> to_;
};

}  // namespace ddp::agent
