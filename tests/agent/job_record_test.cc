// The job's record on a fake clock in a temporary folder: events.jsonl (a
// line of JSON per event, appended at once, rotated once at its limit, whole
// lines after a SIGKILL), status.json (the live view's document, renamed into
// place, bounded) and the one warning of a record that cannot be written.
#include "job_record.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/common/time.h"
#include "temp_dir.h"

namespace ddp::agent {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nlohmann::json;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every line of `path`, each required to end in '\n'.
std::vector<std::string> lines_of(const fs::path& path) {
  const std::string text = read_file(path);
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    if (end == std::string::npos) {
      ADD_FAILURE() << "a line without its newline: " << text.substr(start);
      break;
    }
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

std::vector<json> events_of(const fs::path& path) {
  std::vector<json> events;
  for (const auto& line : lines_of(path)) events.push_back(json::parse(line));
  return events;
}

class JobRecordTest : public ::testing::Test {
 protected:
  fs::path run() const { return dir_.path() / "run"; }
  fs::path events_file() const { return run() / JobRecord::kEventsFile; }
  fs::path status_file() const { return run() / JobRecord::kStatusFile; }
  std::unique_ptr<JobRecord> record(JobRecord::Limits limits = {}) {
    return std::make_unique<JobRecord>(
        run().string(), "hostA", board_, [this](const std::string& w) { warnings_.push_back(w); },
        limits);
  }

  test::TempDir dir_{"ddp-job-record"};
  FakeTime time_;
  JobBoard board_{time_};
  std::vector<std::string> warnings_;
};

TEST_F(JobRecordTest, EveryEventIsALineOfJsonOnDiskAsSoonAsItIsCalled) {
  auto rec = record();
  rec->joining();
  auto events = events_of(events_file());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["kind"], "joining");
  EXPECT_EQ(events[0]["time"], "2026-01-01T00:00:00.000Z");
  EXPECT_EQ(events[0]["host"], "hostA");
  EXPECT_TRUE(events[0]["node"].is_null()) << "no group rank before the first round";
  EXPECT_TRUE(events[0]["round"].is_null());

  time_.advance(1500ms);
  rec->round_formed(RoundFormed{3, 1, 8, 2, 1, 4, {}});
  events = events_of(events_file());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1]["time"], "2026-01-01T00:00:01.500Z");
  EXPECT_EQ(events[1]["kind"], "round_formed");
  EXPECT_EQ(events[1]["node"], 1);
  EXPECT_EQ(events[1]["round"], 3);
  EXPECT_EQ(events[1]["attempt"], 1);
  EXPECT_EQ(events[1]["world_size"], 8);
  EXPECT_EQ(events[1]["group_world_size"], 2);
  EXPECT_EQ(events[1]["base_rank"], 4);

  rec->worker_failed(WorkerExit{5, 1, 1, 4242, -9, ExitReason::kSignaled});
  rec->restarting(Restart{RestartCause::kWorkerFailure, JobCounts{1, 2, 0}, 3});
  rec->membership_changed(MembershipChange{true, 0, "its keep-alive stopped"});
  rec->hang(HangReport{{"collective", "rank 2 waits", {2}, 0, 0, "/x/hang.json"}, "text\n"});
  rec->notice("a \"quoted\" line\twith a tab");
  events = events_of(events_file());
  ASSERT_EQ(events.size(), 7u);
  EXPECT_EQ(events[2]["kind"], "worker_failed");
  EXPECT_EQ(events[2]["rank"], 5);
  EXPECT_EQ(events[2]["pid"], 4242);
  EXPECT_EQ(events[2]["status"], -9);
  EXPECT_EQ(events[2]["reason"], "signaled");
  EXPECT_EQ(events[3]["kind"], "restarting");
  EXPECT_EQ(events[3]["cause"], "worker_failure");
  EXPECT_EQ(events[3]["restarts_spent"], 1);
  EXPECT_EQ(events[3]["membership_changes"], 2);
  EXPECT_EQ(events[3]["max_restarts"], 3);
  EXPECT_EQ(events[4]["kind"], "node_lost");
  EXPECT_EQ(events[4]["member"], 0);
  EXPECT_EQ(events[4]["node"], 1) << "the line's node stays this node";
  EXPECT_EQ(events[5]["kind"], "hang");
  EXPECT_EQ(events[5]["culprits"], json::array({2}));
  EXPECT_EQ(events[5]["file"], "/x/hang.json");
  EXPECT_EQ(events[6]["text"], "a \"quoted\" line\twith a tab");
  for (const auto& e : events) {
    EXPECT_NE(std::find(kRecordKinds.begin(), kRecordKinds.end(), e["kind"].get<std::string>()),
              kRecordKinds.end())
        << e;
  }
  EXPECT_FALSE(fs::exists(status_file())) << "status.json is written when the job ends";
  EXPECT_TRUE(warnings_.empty());
}

TEST_F(JobRecordTest, AFullEventsFileIsRotatedOnceAndKeepsTheNewest) {
  JobRecord::Limits limits;
  limits.events_bytes = 2000;
  auto rec = record(limits);
  const int total = 100;
  for (int i = 0; i < total; ++i) rec->notice("notice number " + std::to_string(i));

  const fs::path rotated = run() / JobRecord::kRotatedEventsFile;
  ASSERT_TRUE(fs::exists(rotated));
  EXPECT_LE(fs::file_size(events_file()), limits.events_bytes);
  EXPECT_LE(fs::file_size(rotated), limits.events_bytes);
  EXPECT_FALSE(fs::exists(run() / "events.jsonl.2"));
  const auto events = events_of(events_file());
  const auto older = events_of(rotated);
  ASSERT_GE(events.size(), 2u);
  ASSERT_FALSE(older.empty());
  EXPECT_EQ(events.front()["kind"], "rotated");
  EXPECT_EQ(events.front()["previous"], "events.jsonl.1");
  EXPECT_EQ(events.back()["text"], "notice number " + std::to_string(total - 1));
  // lines_before counts every line before this file: nothing is lost unseen.
  EXPECT_EQ(events.front()["lines_before"].get<int>() + static_cast<int>(events.size()) - 1, total);
  // The rotated file ends where this one begins.
  const std::string last_older = older.back()["text"];
  const int last = std::stoi(last_older.substr(last_older.rfind(' ') + 1));
  EXPECT_EQ(events[1]["text"], "notice number " + std::to_string(last + 1));
  EXPECT_TRUE(warnings_.empty());
}

TEST_F(JobRecordTest, ALongFieldIsCutAndSaysHowMuch) {
  JobRecord::Limits limits;
  limits.field_bytes = 100;
  auto rec = record(limits);
  rec->report(std::string(1000, 'x'));
  const auto events = events_of(events_file());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["text"], std::string(100, 'x') + "... [900 bytes cut]");
}

TEST_F(JobRecordTest, TheEndWritesTheLiveViewsStatusDocumentWhole) {
  auto rec = record();
  board_.update([&](JobSnapshot& job) {
    job.facts.run_id = "job7";
    job.facts.started = time_.now();
    set_state(job, JobState::kFailed);
  });
  board_.event("failed", "the job ended with exit code 3");
  time_.advance(2s);
  rec->job_ended(3);

  const json status = json::parse(read_file(status_file()));
  EXPECT_EQ(status,
            json::parse(status_json(board_.snapshot(), time_.now(),
                                    std::chrono::system_clock::to_time_t(time_.wall_now()))));
  EXPECT_EQ(status["state"], "failed");
  EXPECT_EQ(status["run_id"], "job7");
  EXPECT_EQ(status["events"].back()["kind"], "failed");
  EXPECT_FALSE(fs::exists(run() / "status.json.tmp"));
  const auto events = events_of(events_file());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["kind"], "job_ended");
  EXPECT_EQ(events[0]["exit_code"], 3);
  EXPECT_EQ(events[0]["succeeded"], false);
  EXPECT_TRUE(warnings_.empty());
}

TEST_F(JobRecordTest, AStatusThatCannotBeWrittenLeavesTheOldOneWholeAndWarnsOnce) {
  fs::create_directories(run());
  std::ofstream(status_file()) << "{\"old\": true}\n";
  // The temporary file cannot be made (a directory is in its place).
  fs::create_directories(run() / "status.json.tmp");
  auto rec = record();
  rec->job_ended(0);
  rec->job_ended(0);
  EXPECT_EQ(read_file(status_file()), "{\"old\": true}\n");
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find("status.json.tmp"), std::string::npos) << warnings_[0];
  EXPECT_NE(warnings_[0].find("the job goes on without it"), std::string::npos) << warnings_[0];
  EXPECT_EQ(events_of(events_file()).size(), 2u) << "the events go on";
}

TEST_F(JobRecordTest, AStatusOverItsLimitLosesItsListsFirst) {
  JobRecord::Limits limits;
  limits.status_bytes = 2500;
  auto rec = record(limits);
  board_.update([&](JobSnapshot& job) {
    job.facts.run_id = "big";
    for (int r = 0; r < 64; ++r) {
      RankStatus rank;
      rank.rank = r;
      rank.host = "a-rather-long-host-name-" + std::to_string(r);
      job.ranks.push_back(rank);
    }
    set_state(job, JobState::kSucceeded);
  });
  ASSERT_GT(status_json(board_.snapshot(), time_.now(), 0).size(), limits.status_bytes);
  rec->job_ended(0);
  const std::string text = read_file(status_file());
  EXPECT_LE(text.size(), limits.status_bytes + 1);  // and its newline
  const json status = json::parse(text);
  EXPECT_EQ(status["omitted"]["ranks"], 64);
  EXPECT_EQ(status["ranks"], json::array());
  EXPECT_EQ(status["state"], "succeeded");
  EXPECT_EQ(status["run_id"], "big");
}

TEST_F(JobRecordTest, AFolderThatCannotBeMadeWarnsOnceAndNothingStops) {
  std::ofstream(dir_.path() / "a_file") << "x";
  JobRecord rec((dir_.path() / "a_file" / "run").string(), "hostA", board_,
                [this](const std::string& w) { warnings_.push_back(w); });
  rec.joining();
  rec.round_formed(RoundFormed{0, 0, 1, 1, 0, 0, {}});
  rec.notice("still here");
  rec.job_ended(0);
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find("cannot write the job's record"), std::string::npos) << warnings_[0];
  EXPECT_NE(warnings_[0].find("events.jsonl"), std::string::npos) << warnings_[0];
}

TEST_F(JobRecordTest, NoFolderNoRecord) {
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_.path());
  {
    JobRecord rec("", "hostA", board_, [this](const std::string& w) { warnings_.push_back(w); });
    rec.joining();
    rec.job_ended(0);
  }
  fs::current_path(cwd);
  EXPECT_TRUE(fs::is_empty(dir_.path()));
  EXPECT_TRUE(warnings_.empty());
}

TEST_F(JobRecordTest, AnAgentKilledMidJobLeavesEveryLineItWrote) {
  const int count = 200;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    JobRecord rec(run().string(), "hostA", board_, [](const std::string&) { ::_exit(3); });
    rec.round_formed(RoundFormed{0, 0, 2, 1, 0, 0, {}});
    // Lines of several pages each: more than one write of the page cache.
    for (int i = 1; i < count; ++i) rec.report(std::to_string(i) + std::string(9000, 'r'));
    ::raise(SIGKILL);
    ::_exit(4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  const auto events = events_of(events_file());
  ASSERT_EQ(events.size(), static_cast<std::size_t>(count));
  EXPECT_EQ(events[0]["kind"], "round_formed");
  for (int i = 1; i < count; ++i) {
    EXPECT_EQ(events[i]["text"], std::to_string(i) + std::string(9000, 'r'));
  }
  EXPECT_FALSE(fs::exists(status_file())) << "no end, no final status";
}

// docs/using.md's section on the record, up to the next section.
std::string documented_record() {
  const std::string doc = read_file(fs::path(DDP_SOURCE_DIR) / "docs" / "using.md");
  const auto start = doc.find("### The job's record");
  EXPECT_NE(start, std::string::npos) << "docs/using.md no longer describes the record";
  if (start == std::string::npos) return "";
  return doc.substr(start, doc.find("\n### ", start + 1) - start);
}

TEST_F(JobRecordTest, TheDocumentedRecordNamesEveryKindAndEveryField) {
  JobRecord::Limits limits;
  limits.events_bytes = 1500;  // a rotation too
  auto rec = record(limits);
  rec->notice("n");
  rec->report("r\n");
  rec->joining();
  rec->round_formed(RoundFormed{0, 0, 2, 1, 0, 0, {}});
  rec->workers_running();
  rec->workers_stopping();
  rec->membership_changed(MembershipChange{true, 1, "lost"});
  rec->membership_changed(MembershipChange{false, 2, "joins"});
  rec->worker_exited(WorkerExit{0, 0, 0, 1, 0, ExitReason::kSucceeded});
  rec->worker_failed(WorkerExit{1, 1, 0, 2, 1, ExitReason::kFailed});
  rec->restarting(Restart{RestartCause::kHang, JobCounts{1, 0, 0}, 2});
  rec->hang(HangReport{{"step", "s", {1}, 0, 0, "f"}, "t\n"});
  rec->recovering("why");
  rec->recovered("ok");
  rec->job_ended(0);
  std::vector<json> events = events_of(run() / JobRecord::kRotatedEventsFile);
  for (auto& e : events_of(events_file())) events.push_back(std::move(e));
  std::set<std::string> kinds;
  std::set<std::string> keys;
  for (const auto& e : events) {
    kinds.insert(e["kind"].get<std::string>());
    for (auto it = e.begin(); it != e.end(); ++it) keys.insert(it.key());
  }
  EXPECT_EQ(kinds, std::set<std::string>(kRecordKinds.begin(), kRecordKinds.end()))
      << "every kind, and only kRecordKinds";
  const std::string documented = documented_record();
  for (const auto& kind : kRecordKinds) {
    EXPECT_NE(documented.find("`" + std::string(kind) + "`"), std::string::npos)
        << "the record has kind '" << kind << "', which docs/using.md does not name";
  }
  for (const auto& key : keys) {
    EXPECT_NE(documented.find("`" + key + "`"), std::string::npos)
        << "the record has '" << key << "', which docs/using.md does not name";
  }
}

}  // namespace
}  // namespace ddp::agent
