// The agent's live view without sockets: the board, /status, /metrics (checked
// by promtool), /livez and /readyz on a fake clock, and the routes.
#include "job_status.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "ddp/common/time.h"
#include "ddp/status_http/server.h"
#include "status_endpoint.h"

namespace ddp::agent {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

RankStatus rank_of(int rank, int node, std::string host) {
  RankStatus r;
  r.rank = rank;
  r.local_rank = rank % 2;
  r.node = node;
  r.host = std::move(host);
  r.pid = 1000 + rank;
  r.has_page = true;
  r.steps = 40;
  r.compute = 50ms;
  r.last_wall = 80ms;
  r.since_step = 300ms;
  GroupStatus g;
  g.name = "default";
  g.size = 4;
  g.rank = rank;
  g.issued = 12;
  g.completed = 11;
  g.last_kind = progress::Kind::kAllreduce;
  g.since_completed = 200ms;
  g.waiting = 150ms;
  r.groups.push_back(g);
  return r;
}

// A 2-node round, node 1 declared lost, one hang incident, a straggler.
void fill(JobBoard& board, FakeTime& time) {
  board.update([&](JobSnapshot& job) {
    job.facts.run_id = "job\"42";
    job.facts.backend = "c10d";
    job.facts.host = "node-a";
    job.facts.addr = "10.0.0.1";
    job.facts.pid = 77;
    job.facts.min_nodes = 1;
    job.facts.max_nodes = 2;
    job.facts.nproc_per_node = 2;
    job.facts.max_restarts = 3;
    job.facts.started = time.now();
  });
  time.advance(5s);
  board.update([&](JobSnapshot& job) {
    job.state = JobState::kRunning;
    job.state_since = time.now();
    job.round = RoundStatus{{3, 4, 4, 2, 0, 0, {}}, time.now()};
    job.rounds_formed = 4;
    job.job.restarts = 1;
    job.job.membership_changes = 2;
    job.restarts[RestartCause::kWorkerFailure] = 1;
    job.restarts[RestartCause::kNodeLost] = 2;
    job.exits[ExitReason::kStopped] = 6;
    job.hangs = 1;
    MemberStatus self{0, "node-a", "10.0.0.1", {0, 1}, "self", 0ms, std::nullopt, std::nullopt};
    MemberStatus lost{1, "node-\"b\"\n", "10.0.0.2", {2, 3}, "lost", 9s, 12s, 15s};
    job.members = {self, lost};
    job.ranks = {rank_of(0, 0, "node-a"), rank_of(1, 0, "node-a"), rank_of(2, 1, "node-\"b\"\n"),
                 rank_of(3, 1, "node-\"b\"\n")};
    job.ranks[3].compute = 125ms;
    job.scores = {{0, 1.0}, {1, 1.0}, {2, 1.0}, {3, 0.4}};
    job.stragglers = {3};
    job.incident = IncidentStatus{
        "behind", "rank 3 never reached allreduce #12", {3}, 1, 0, "/logs/hang_0_node1.json"};
  });
  board.event("round_formed", "round 3 formed");
  time.advance(2s);
  board.event("node_lost", "node 1 (node-b) was declared lost");
}

TEST(JobBoard, EventsAreStampedWithTheirRoundAndBounded) {
  FakeTime time;
  JobBoard board(time);
  board.event("done", "before any round");
  EXPECT_EQ(board.snapshot().events.back().round, -1);
  board.update([&](JobSnapshot& job) {
    job.round = RoundStatus{{7, 1, 2, 1, 0, 0, {}}, time.now()};
  });
  for (int i = 0; i < 250; ++i) board.event("restart", "restart " + std::to_string(i));
  const JobSnapshot job = board.snapshot();
  ASSERT_EQ(job.events.size(), JobSnapshot::kMaxEvents);
  EXPECT_EQ(job.events.front().text, "restart 50");
  EXPECT_EQ(job.events.back().text, "restart 249");
  EXPECT_EQ(job.events.back().round, 7);
}

TEST(JobBoard, TheStateKeepsTheTimeItWasEntered) {
  FakeTime time;
  JobBoard board(time);
  time.advance(5s);
  board.update([](JobSnapshot& job) { set_state(job, JobState::kRunning); });
  const auto entered = time.now();
  time.advance(2s);
  board.update([](JobSnapshot& job) { set_state(job, JobState::kRunning); });
  EXPECT_EQ(board.snapshot().state_since, entered);
  time.advance(1s);
  EXPECT_DOUBLE_EQ(
      json::parse(status_json(board.snapshot(), time.now(), 0))["state_s"].get<double>(), 3.0);
  board.update([](JobSnapshot& job) { set_state(job, JobState::kStopping); });
  EXPECT_EQ(board.snapshot().state_since, time.now());
}

TEST(JobStatus, StatusJsonHoldsTheJobAsThisNodeSeesIt) {
  FakeTime time;
  JobBoard board(time);
  fill(board, time);
  time.advance(1s);
  const json doc = json::parse(status_json(board.snapshot(), time.now(), 1'800'000'000));
  EXPECT_EQ(doc["kind"], "agent");
  EXPECT_EQ(doc["run_id"], "job\"42");
  EXPECT_EQ(doc["time"], "2027-01-15T08:00:00Z");
  EXPECT_DOUBLE_EQ(doc["uptime_s"].get<double>(), 8.0);
  EXPECT_EQ(doc["node"]["group_rank"], 0);
  EXPECT_EQ(doc["state"], "running");
  EXPECT_EQ(doc["ready"], true);
  EXPECT_EQ(doc["round"]["number"], 3);
  EXPECT_DOUBLE_EQ(doc["round"]["formed_s_ago"].get<double>(), 3.0);
  EXPECT_EQ(doc["restarts"]["spent"], 1);
  EXPECT_EQ(doc["restarts"]["max"], 3);
  EXPECT_EQ(doc["restarts"]["membership_changes"], 2);
  EXPECT_EQ(doc["restarts"]["in_a_row_without_progress"], 0);
  EXPECT_EQ(doc["restarts"]["by_cause"]["node_lost"], 2);
  EXPECT_EQ(doc["restarts"]["by_cause"]["hang"], 0);
  EXPECT_EQ(doc["worker_exits"]["stopped"], 6);
  ASSERT_EQ(doc["members"].size(), 2u);
  EXPECT_EQ(doc["members"][1]["state"], "lost");
  EXPECT_EQ(doc["members"][1]["host"], "node-\"b\"\n");
  EXPECT_EQ(doc["members"][1]["ranks"], json({2, 3}));
  EXPECT_DOUBLE_EQ(doc["members"][1]["keep_alive_age_s"].get<double>(), 12.0);
  EXPECT_DOUBLE_EQ(doc["members"][1]["lost_after_s"].get<double>(), 15.0);
  EXPECT_TRUE(doc["members"][0]["keep_alive_age_s"].is_null());
  ASSERT_EQ(doc["ranks"].size(), 4u);
  EXPECT_DOUBLE_EQ(doc["ranks"][3]["straggler_score"].get<double>(), 0.4);
  EXPECT_EQ(doc["ranks"][3]["straggler"], true);
  EXPECT_EQ(doc["ranks"][0]["straggler"], false);
  EXPECT_DOUBLE_EQ(doc["ranks"][0]["step_time_s"].get<double>(), 0.08);
  EXPECT_DOUBLE_EQ(doc["ranks"][0]["last_progress_s"].get<double>(), 0.2);
  // The hang report's words and numbering: the same collective is #11 in both.
  EXPECT_EQ(doc["ranks"][0]["where"],
            "waits in allreduce #11 (0 bytes) of group 'default' for 0.1 s");
  ASSERT_EQ(doc["events"].size(), 2u);
  EXPECT_EQ(doc["events"][1]["kind"], "node_lost");
  EXPECT_EQ(doc["events"][1]["round"], 3);
  EXPECT_DOUBLE_EQ(doc["events"][1]["age_s"].get<double>(), 1.0);
  EXPECT_EQ(doc["incident"]["culprits"], json({3}));
  EXPECT_EQ(doc["incident"]["file"], "/logs/hang_0_node1.json");
}

TEST(JobStatus, BeforeAnyRoundTheStatusSaysSoAndIsNotReady) {
  FakeTime time;
  JobBoard board(time);
  board.update([](JobSnapshot& job) { job.in_rendezvous = true; });
  const json doc = json::parse(status_json(board.snapshot(), time.now(), 0));
  EXPECT_EQ(doc["state"], "rendezvous");
  EXPECT_TRUE(doc["round"].is_null());
  EXPECT_EQ(doc["ready"], false);
  EXPECT_EQ(doc["ready_reason"], "waiting for the other nodes (the first round has not formed)");
  EXPECT_TRUE(doc["incident"].is_null());
  EXPECT_TRUE(doc["members"].empty());
}

TEST(JobStatus, ReadinessFollowsTheState) {
  JobSnapshot job;
  for (JobState s : {JobState::kRendezvous, JobState::kStopping, JobState::kRestarting,
                     JobState::kSucceeded, JobState::kFailed}) {
    job.state = s;
    const Health h = readiness(job);
    EXPECT_FALSE(h.ok) << to_string(s);
    EXPECT_FALSE(h.reason.empty()) << to_string(s);
  }
  job.state = JobState::kRunning;
  EXPECT_TRUE(readiness(job).ok);
  EXPECT_EQ(readiness(job).json(), R"({"health":"true","reason":""})");
  job.state = JobState::kFailed;
  EXPECT_EQ(readiness(job).json(),
            R"({"health":"false","reason":"the job failed; no workers run"})");
}

TEST(JobStatus, LivenessFailsWhenTheAgentLoopStopsWritingOutsideTheRendezvous) {
  FakeTime time;
  JobBoard board(time);
  board.update([](JobSnapshot&) {});
  time.advance(89s);
  EXPECT_TRUE(liveness(board.snapshot(), time.now(), 90s).ok);
  time.advance(2s);
  const Health stuck = liveness(board.snapshot(), time.now(), 90s);
  EXPECT_FALSE(stuck.ok);
  EXPECT_EQ(stuck.reason, "the agent's loop has not run for 91.0 s");
  board.update([](JobSnapshot& job) { job.in_rendezvous = true; });
  time.advance(1h);
  EXPECT_TRUE(liveness(board.snapshot(), time.now(), 90s).ok);  // a join may take that long
}

std::string exposition(FakeTime& time) {
  JobBoard board(time);
  fill(board, time);
  status_http::MetricsText text;
  write_job_metrics(board.snapshot(), text);
  return text.text();
}

TEST(JobMetrics, TheExpositionHasEveryFamilyWithItsSamples) {
  FakeTime time;
  const std::string text = exposition(time);
  for (const char* line : {
           "# TYPE ddprun_round gauge\n",
           "ddprun_round 3\n",
           "ddprun_round_nodes 2\n",
           "ddprun_world_size 4\n",
           "ddprun_state{state=\"running\"} 1\n",
           "ddprun_state{state=\"rendezvous\"} 0\n",
           "ddprun_ready 1\n",
           "ddprun_members{state=\"self\"} 1\n",
           "ddprun_members{state=\"lost\"} 1\n",
           "ddprun_members{state=\"alive\"} 0\n",
           "# TYPE ddprun_restarts_total counter\n",
           "ddprun_restarts_total{cause=\"worker_failure\"} 1\n",
           "ddprun_job_restarts 1\n",
           "ddprun_job_membership_changes 2\n",
           "ddprun_restarts_total{cause=\"node_lost\"} 2\n",
           "ddprun_restarts_total{cause=\"hang\"} 0\n",
           "ddprun_worker_exits_total{reason=\"stopped\"} 6\n",
           "ddprun_hangs_total 1\n",
           "ddprun_keepalive_age_seconds{node=\"1\"} 12\n",
           "ddprun_keepalive_lost_after_seconds{node=\"1\"} 15\n",
           "ddprun_node_last_heard_seconds{node=\"1\",host=\"node-\\\"b\\\"\\n\"} 9\n",
           "ddprun_rank_step_seconds{rank=\"0\",node=\"0\"} 0.08\n",
           "ddprun_rank_last_progress_seconds{rank=\"2\",node=\"1\"} 0.2\n",
           "ddprun_rank_straggler_score{rank=\"3\",node=\"1\"} 0.4\n",
           "ddprun_rank_steps{rank=\"1\",node=\"0\"} 40\n",
           "ddprun_info{run_id=\"job\\\"42\",backend=\"c10d\",host=\"node-a\",addr=\"10.0.0.1\"} "
           "1\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << "missing: " << line << "in:\n" << text;
  }
}

// promtool's verdict on `text` (its exit status and output), or nullopt
// when promtool is not installed.
std::optional<std::pair<int, std::string>> promtool_check(const std::string& text) {
  if (::access("/usr/bin/promtool", X_OK) != 0) return std::nullopt;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("ddp_job_status_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto input = dir / "metrics.txt";
  std::ofstream(input) << text;
  const std::string command = "/usr/bin/promtool check metrics < '" + input.string() + "' 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string output;
  char buffer[512];
  while (pipe != nullptr && std::fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  const int status = pipe != nullptr ? ::pclose(pipe) : -1;
  std::filesystem::remove_all(dir);
  return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, output);
}

TEST(JobMetrics, PromtoolAcceptsTheExpositionWithTheProcessFamilies) {
  FakeTime time;
  JobBoard board(time);
  fill(board, time);
  const auto response = answer(status_http::Request{"GET", "/metrics", "/metrics", ""}, board, 90s);
  EXPECT_EQ(response.status, 200);
  EXPECT_NE(response.body.find("process_resident_memory_bytes "), std::string::npos);
  auto verdict = promtool_check(response.body);
  if (!verdict) GTEST_SKIP() << "promtool is not installed (scripts/setup installs prometheus)";
  EXPECT_EQ(verdict->first, 0) << verdict->second;
  EXPECT_EQ(verdict->second, "") << "promtool has remarks";
  // The check can fail: a counter without _total is refused.
  auto bad = promtool_check("# HELP x_bytes a\n# TYPE x_bytes counter\nx_bytes 1\n");
  ASSERT_TRUE(bad);
  EXPECT_NE(bad->second, "");
}

TEST(StatusRoutes, EachPathAnswersWithItsStatusAndType) {
  FakeTime time;
  JobBoard board(time);
  fill(board, time);
  auto get = [&](const std::string& path) {
    return answer(status_http::Request{"GET", path, path, ""}, board, 90s);
  };
  auto status = get("/status");
  EXPECT_EQ(status.status, 200);
  EXPECT_EQ(status.content_type, "application/json");
  EXPECT_EQ(json::parse(status.body)["round"]["number"], 3);
  EXPECT_EQ(get("/readyz").status, 200);
  EXPECT_EQ(get("/readyz").body, "{\"health\":\"true\",\"reason\":\"\"}\n");
  EXPECT_EQ(get("/livez").status, 200);
  time.advance(2min);
  auto stuck = get("/livez");
  EXPECT_EQ(stuck.status, 503);
  EXPECT_NE(stuck.body.find("has not run for"), std::string::npos) << stuck.body;
  board.update([](JobSnapshot& job) { job.state = JobState::kRestarting; });
  auto restarting = get("/readyz");
  EXPECT_EQ(restarting.status, 503);
  EXPECT_EQ(restarting.body, "{\"health\":\"false\",\"reason\":\"restarting the workers\"}\n");
  auto page = get("/");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_NE(page.body.find("<html"), std::string::npos);
  bool csp = false;
  for (const auto& [name, value] : page.headers) csp = csp || name == "Content-Security-Policy";
  EXPECT_TRUE(csp);
  auto missing = get("/nope");
  EXPECT_EQ(missing.status, 404);
  EXPECT_NE(missing.body.find("/metrics"), std::string::npos);
}

// docs/using.md's description of /status: the text from "`/status` holds:"
// to the next blank line after its list.
std::string documented_status() {
  std::ifstream in(std::filesystem::path(DDP_SOURCE_DIR) / "docs" / "using.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const auto start = doc.find("`/status` holds:");
  EXPECT_NE(start, std::string::npos) << "docs/using.md no longer describes /status";
  if (start == std::string::npos) return "";
  const auto end = doc.find("\n\n", doc.find("\n- ", start));
  return doc.substr(start, end - start);
}

// Every object key of `doc`, recursively, but for the keys of by_cause and
// worker_exits, which are values (causes, reasons) listed elsewhere.
void collect_keys(const json& doc, std::set<std::string>& keys) {
  if (doc.is_array()) {
    for (const auto& item : doc) collect_keys(item, keys);
  } else if (doc.is_object()) {
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      keys.insert(it.key());
      if (it.key() != "by_cause" && it.key() != "worker_exits") collect_keys(it.value(), keys);
    }
  }
}

TEST(JobStatus, TheDocumentedStatusNamesEveryKeyAndEveryEventKind) {
  FakeTime time;
  JobBoard board(time);
  fill(board, time);
  const std::string documented = documented_status();
  std::set<std::string> keys;
  collect_keys(json::parse(status_json(board.snapshot(), time.now(), 0)), keys);
  for (const auto& key : keys) {
    EXPECT_NE(documented.find("`" + key + "`"), std::string::npos)
        << "/status has '" << key << "', which docs/using.md does not name";
  }
  // The kinds: exactly kEventKinds, as the sentence "The kinds are ..." lists them.
  const auto from = documented.find("The kinds are");
  ASSERT_NE(from, std::string::npos) << documented;
  const std::string sentence = documented.substr(from, documented.find(';', from) - from);
  std::set<std::string> listed;
  for (std::size_t at = sentence.find('`'); at != std::string::npos;
       at = sentence.find('`', sentence.find('`', at + 1) + 1)) {
    listed.insert(sentence.substr(at + 1, sentence.find('`', at + 1) - at - 1));
  }
  EXPECT_EQ(listed, std::set<std::string>(kEventKinds.begin(), kEventKinds.end())) << sentence;
  EXPECT_THROW(board.event("no_such_kind", "x"), std::logic_error);
}

}  // namespace
}  // namespace ddp::agent
