// The agent's events: what ddprun's printer writes on stderr for each (the
// lines tests elsewhere grep), and the fan-out's order.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "agent_events_fanout.h"
#include "ddp/agent/agent_events.h"

namespace ddp::agent {
namespace {

std::string printed(const std::function<void(StderrPrinter&)>& say) {
  StderrPrinter printer;
  testing::internal::CaptureStderr();
  say(printer);
  return testing::internal::GetCapturedStderr();
}

TEST(StderrPrinterTest, ANoticeIsOneLineBehindTheProgramName) {
  EXPECT_EQ(printed([](StderrPrinter& p) { p.notice("rendezvous failed: boom"); }),
            "ddprun: rendezvous failed: boom\n");
}

TEST(StderrPrinterTest, AReportAndAHangAreWrittenAsTheyAre) {
  EXPECT_EQ(printed([](StderrPrinter& p) { p.report("train.py FAILED\n  rank 0\n"); }),
            "train.py FAILED\n  rank 0\n");
  HangReport hang;
  hang.summary = "rank 1 never reached allreduce #3";
  hang.text = "ddprun: hang\nddprun: incident written to /tmp/x\n";
  EXPECT_EQ(printed([&](StderrPrinter& p) { p.hang(hang); }), hang.text);
}

TEST(StderrPrinterTest, ARecoveryIsOneLine) {
  EXPECT_EQ(printed([](StderrPrinter& p) { p.recovered("in-place recovery from round 1"); }),
            "ddprun: in-place recovery from round 1\n");
}

TEST(StderrPrinterTest, EventsOnlyTheLiveViewShowsPrintNothing) {
  EXPECT_EQ(printed([](StderrPrinter& p) {
              p.joining();
              p.round_formed(RoundFormed{});
              p.workers_running();
              p.workers_stopping();
              p.membership_changed(MembershipChange{true, 1, "node 1 lost"});
              p.worker_exited(WorkerExit{});
              p.worker_failed(WorkerExit{});
              p.restarting(Restart{});
              p.recovering("why");
              p.job_ended(1);
            }),
            "");
}

// Records what it is told, as "<who>:<event>".
class Recorder final : public AgentEvents {
 public:
  Recorder(std::string who, std::vector<std::string>& log) : who_(std::move(who)), log_(log) {}
  void notice(const std::string& line) override { log_.push_back(who_ + ":notice " + line); }
  void worker_failed(const WorkerExit& exit) override {
    log_.push_back(who_ + ":failed " + std::to_string(exit.rank));
  }
  void job_ended(int code) override { log_.push_back(who_ + ":ended " + std::to_string(code)); }

 private:
  std::string who_;
  std::vector<std::string>& log_;
};

TEST(AgentEventsFanoutTest, EveryEventReachesEveryListenerInTheOrderGiven) {
  std::vector<std::string> log;
  Recorder printer("printer", log);
  Recorder view("view", log);
  AgentEventsFanout events({&printer, &view});
  events.notice("hello");
  WorkerExit exit;
  exit.rank = 3;
  events.worker_failed(exit);
  events.joining();  // neither shows it
  events.job_ended(0);
  EXPECT_EQ(log, (std::vector<std::string>{"printer:notice hello", "view:notice hello",
                                           "printer:failed 3", "view:failed 3", "printer:ended 0",
                                           "view:ended 0"}));
}

}  // namespace
}  // namespace ddp::agent
