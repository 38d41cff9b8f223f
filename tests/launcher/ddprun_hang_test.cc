// Hang and straggler detection end to end: two real ddprun agents on this host
// (--rdzv_backend=c10d, --nnodes=2, --nproc_per_node=2, --hang_timeout=3) run
// ddprun_progress_worker (progress_worker.cc), which injects one fault on its
// first attempt. --node_rank orders the group ranks with c10d, so node 0 runs
// ranks 0 and 1 and node 1 ranks 2 and 3: a culprit on node 1 is named by node
// 0 from the summaries the agents exchange through the store, and the other way
// round. Each test checks both agents' reports, incident files and exit codes.
// Waits are bounded (a loaded 2-core machine: generous), except the detection
// bound, which is the feature's promise: hang_timeout + 2 s from the fault.
#include <sys/stat.h>

#include <chrono>
#include <deque>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "net_util.h"
#include "process_util.h"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;

std::string ddprun() { return bin_dir() + "/ddprun"; }
std::string worker() { return bin_dir() + "/ddprun_progress_worker"; }

constexpr double kHangTimeout = 3.0;
const std::string kRule(72, '=');

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The modification time of `path`, in CLOCK_REALTIME seconds; 0 when it is missing.
double mtime_of(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<double>(st.st_mtim.tv_sec) + static_cast<double>(st.st_mtim.tv_nsec) * 1e-9;
}

// The hang report in `err`: from the rule before "ddprun: HANG" to the rule
// that closes it (both included); empty when there is none.
std::string hang_report(const std::string& err) {
  const auto head = err.find(kRule + "\nddprun: HANG");
  if (head == std::string::npos) return "";
  const auto tail = err.find("\n" + kRule + "\n", head + kRule.size());
  if (tail == std::string::npos) return err.substr(head);
  return err.substr(head, tail + kRule.size() + 2 - head);
}

// Every line of `text` that contains `part`.
std::vector<std::string> lines_with(const std::string& text, const std::string& part) {
  std::vector<std::string> found;
  for (const auto& line : lines_of(text)) {
    if (contains(line, part)) found.push_back(line);
  }
  return found;
}

class HangTest : public ::testing::Test {
 protected:
  ~HangTest() override { kill_children(agents_); }

  // Starts the job: node 0 (which hosts the store) first, node 1 once the store
  // listens. `options` are ddprun's beyond the common ones; `worker_args` follow
  // the worker's mode, culprit and step.
  void start(const std::string& mode, int culprit, int step,
             const std::vector<std::string>& options, const std::vector<std::string>& worker_args) {
    for (int node = 0; node < 2; ++node) {
      std::vector<std::string> argv{ddprun(),
                                    "--nnodes=2",
                                    "--nproc_per_node=2",
                                    "--node_rank=" + std::to_string(node),
                                    "--rdzv_backend=c10d",
                                    "--rdzv_endpoint=127.0.0.1:" + std::to_string(port_),
                                    "--rdzv_id=" + run_id_,
                                    "--no_python",
                                    "--log_dir",
                                    log_dir().string(),
                                    "--hang_timeout=3"};
      argv.insert(argv.end(), options.begin(), options.end());
      argv.insert(argv.end(), {worker(), mode, std::to_string(culprit), std::to_string(step),
                               "--mark_dir", mark_dir().string()});
      argv.insert(argv.end(), worker_args.begin(), worker_args.end());
      agents_.push_back(spawn(argv, base_env(), dir_.path(), "node" + std::to_string(node),
                              SpawnOptions{.own_group = true}));
      if (node == 0) {
        ASSERT_TRUE(eventually([&] { return port_listens(port_); }, 30s)) << logs();
      }
    }
  }

  // Waits up to `timeout` for both agents: true when both ended (the
  // destructor kills what still runs).
  bool wait_agents(std::chrono::milliseconds timeout = 90s) {
    return wait_children(agents_, std::chrono::steady_clock::now() + timeout);
  }

  int code(int node) const { return agents_.at(static_cast<std::size_t>(node)).code(); }
  std::string err(int node) const {
    return read_text(agents_.at(static_cast<std::size_t>(node)).err);
  }
  std::string out(int node) const {
    return read_text(agents_.at(static_cast<std::size_t>(node)).out);
  }

  // Both agents' stderr (the tail of each), for failure messages.
  std::string logs() const { return stderr_of(agents_, 30000); }

  fs::path log_dir() const { return dir_.path() / "logs"; }
  fs::path mark_dir() const { return dir_.path(); }
  // `relative` in the agents' run folders (each agent makes its own
  // <log_dir>/<run_id>_<random>): the first that exists, else a path that
  // does not.
  fs::path in_run_dirs(const fs::path& relative) const {
    if (fs::exists(log_dir())) {
      for (const auto& entry : fs::directory_iterator(log_dir())) {
        if (entry.path().filename().string().rfind(run_id_ + "_", 0) != 0) continue;
        if (fs::exists(entry.path() / relative)) return entry.path() / relative;
      }
    }
    return log_dir() / (run_id_ + "_none") / relative;
  }
  fs::path attempt_dir(int attempt) const {
    return in_run_dirs("attempt_" + std::to_string(attempt));
  }
  fs::path incident(int node, int attempt = 0) const {
    return in_run_dirs(
        fs::path("attempt_" + std::to_string(attempt)) /
        ("hang_" + std::to_string(attempt) + "_node" + std::to_string(node) + ".json"));
  }
  nlohmann::json read_incident(int node) const {
    return nlohmann::json::parse(read_text(incident(node)));
  }
  // When the culprit's fault began (CLOCK_REALTIME seconds, from its mark file).
  double stall_time(int rank) const {
    return std::stod(read_text(mark_dir() / ("stall_" + std::to_string(rank))));
  }

  // Every hang_*.json under the log directory.
  std::vector<std::string> incident_files() const {
    std::vector<std::string> found;
    if (!fs::exists(log_dir())) return found;
    for (const auto& entry : fs::recursive_directory_iterator(log_dir())) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("hang_", 0) == 0 && entry.path().extension() == ".json")
        found.push_back(entry.path().string());
    }
    return found;
  }

  // The checks every node's report of a hang passes: the header, the culprit,
  // the ranks block with all four ranks on their nodes, the incident file it
  // names, and the stacks only on the culprit's node.
  void expect_report(int node, const std::string& kind, int culprit) {
    SCOPED_TRACE("node " + std::to_string(node));
    const std::string text = err(node);
    const std::string report = hang_report(text);
    ASSERT_FALSE(report.empty()) << "no hang report\n" << logs();
    EXPECT_TRUE(contains(
        report, "ddprun: HANG (" + kind + ") detected by node " + std::to_string(node) + " ("))
        << report;
    EXPECT_TRUE(contains(report, "\n  culprit rank(s): " + std::to_string(culprit) +
                                     "; hang timeout 3.0 s; action: "))
        << report;
    EXPECT_TRUE(contains(report, "\n  ranks:\n")) << report;
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_TRUE(contains(report, "\n    rank " + std::to_string(rank) + " (node " +
                                       std::to_string(rank / 2) + ", host "))
          << "rank " << rank << " missing from the ranks block\n"
          << report;
    }
    const int culprit_node = culprit / 2;
    EXPECT_EQ(contains(report, "  native stacks of rank " + std::to_string(culprit) + " ("),
              node == culprit_node)
        << "stacks belong in the culprit's node's report only\n"
        << report;
    if (node != culprit_node) {
      EXPECT_TRUE(contains(report, "action: none on this node")) << report;
    }
    EXPECT_TRUE(contains(text, "ddprun: incident written to " + incident(node).string() + "\n"))
        << text;
  }

  // The checks every node's incident file passes.
  void expect_incident(int node, const std::string& kind, int culprit) {
    SCOPED_TRACE("incident of node " + std::to_string(node));
    ASSERT_TRUE(fs::exists(incident(node))) << incident(node) << "\n" << logs();
    const auto doc = read_incident(node);
    EXPECT_EQ(doc.at("kind"), "hang");
    EXPECT_EQ(doc.at("hang_kind"), kind);
    EXPECT_EQ(doc.at("culprits"), nlohmann::json::array({culprit})) << doc.dump(1);
    EXPECT_EQ(doc.at("node"), node);
    EXPECT_EQ(doc.at("attempt"), 0);
    EXPECT_DOUBLE_EQ(doc.at("hang_timeout_s").get<double>(), kHangTimeout);
    EXPECT_EQ(doc.at("unreachable"), nlohmann::json::array()) << doc.dump(1);
    EXPECT_EQ(doc.at("ranks").size(), 4u) << doc.dump(1);
    const int culprit_node = culprit / 2;
    if (node == culprit_node) {
      EXPECT_FALSE(contains(doc.at("action").get<std::string>(), "none")) << doc.at("action");
    } else {
      EXPECT_TRUE(contains(doc.at("action").get<std::string>(), "none on this node"))
          << doc.at("action");
      EXPECT_TRUE(doc.at("stacks").empty()) << doc.at("stacks").dump(1);
    }
  }

  // The culprit's stacks in its node's incident file: taken without error and
  // showing `function`.
  void expect_stack(int culprit, const std::string& function) {
    const auto doc = read_incident(culprit / 2);
    const std::string key = std::to_string(culprit);
    ASSERT_TRUE(doc.at("stacks").contains(key)) << doc.at("stacks").dump(1);
    const auto& stack = doc.at("stacks").at(key);
    EXPECT_EQ(stack.at("error"), "") << stack.dump(1);
    EXPECT_TRUE(contains(stack.at("text").get<std::string>(), function)) << stack.dump(1);
  }

  TempDir dir_{"ddprun-hang"};
  std::uint16_t port_ = free_port();
  std::string run_id_ = "hang" + std::to_string(port_);
  std::vector<Child> agents_;
};

// Rank 2 (node 1) blocks before step 8's all-reduce: both nodes name it, node
// 1 takes its stacks and kills it, and the restart succeeds.
TEST_F(HangTest, ARankThatNeverReachesACollectiveIsNamedByBothNodesAndTheRestartSucceeds) {
  ASSERT_NO_FATAL_FAILURE(
      start("sleep_before", 2, 8, {"--on_hang=restart", "--max_restarts=1"}, {"--steps", "30"}));
  ASSERT_TRUE(wait_agents()) << "the job did not end\n" << logs();
  EXPECT_EQ(code(0), 0) << logs();
  EXPECT_EQ(code(1), 0) << logs();
  for (int node = 0; node < 2; ++node) {
    expect_report(node, "behind", 2);
    expect_incident(node, "behind", 2);
    const std::string report = hang_report(err(node));
    EXPECT_TRUE(contains(report, "rank 2 never reached allreduce #")) << report;
    EXPECT_TRUE(std::regex_search(report, std::regex("\n    rank 2 \\(node 1, host [^,]+, pid "
                                                     "[0-9]+\\): is not in a collective")))
        << report;
    EXPECT_TRUE(std::regex_search(report, std::regex("\n    rank 0 \\(node 0, host [^,]+, pid "
                                                     "[0-9]+\\): waits in allreduce #")))
        << report;
    const auto doc = read_incident(node);
    EXPECT_EQ(doc.at("collective"), "allreduce");
    EXPECT_EQ(doc.at("group"), "default");
    EXPECT_GT(doc.at("collective_seq").get<int>(), 0);
  }
  EXPECT_TRUE(contains(read_incident(1).at("action").get<std::string>(), "restart"));
  expect_stack(2, "progress_worker_blocks_forever");
  // Detected within the timeout and a 2 s margin of the fault, on both nodes.
  const double stalled = stall_time(2);
  for (int node = 0; node < 2; ++node) {
    const double after = mtime_of(incident(node)) - stalled;
    EXPECT_GE(after, kHangTimeout - 0.5) << "node " << node;
    EXPECT_LE(after, kHangTimeout + 2.0) << "node " << node << ": detected late\n" << logs();
  }
  EXPECT_TRUE(fs::is_directory(attempt_dir(1))) << logs();
  EXPECT_TRUE(contains(err(1), "restarting the worker group (1/1 restarts)")) << logs();
  EXPECT_FALSE(fs::exists(incident(0, 1))) << "the restarted group is healthy";
}

// Rank 3 (node 1) skips one all-reduce, so it finishes early and lingers
// outside any collective while the others wait: --on_hang=fail ends the job.
TEST_F(HangTest, ARankThatSkipsACollectiveIsNamedAndOnHangFailEndsTheJob) {
  ASSERT_NO_FATAL_FAILURE(start("skip", 3, 8, {"--on_hang=fail", "--max_restarts=3"},
                                {"--steps", "30", "--linger_ms", "20000"}));
  ASSERT_TRUE(wait_agents()) << "the job did not end\n" << logs();
  EXPECT_NE(code(0), 0) << logs();
  EXPECT_NE(code(1), 0) << logs();
  for (int node = 0; node < 2; ++node) {
    expect_report(node, "behind", 3);
    expect_incident(node, "behind", 3);
    EXPECT_TRUE(contains(hang_report(err(node)), "rank 3 never reached allreduce #"))
        << hang_report(err(node));
  }
  EXPECT_TRUE(contains(hang_report(err(1)), "action: fail (--on_hang=fail)"))
      << hang_report(err(1));
  EXPECT_TRUE(contains(err(1), "traceback : ended by ddprun after a hang: rank 3 never reached"))
      << err(1);
  EXPECT_FALSE(fs::exists(attempt_dir(1))) << "--on_hang=fail must not restart\n" << logs();
  EXPECT_FALSE(contains(err(0) + err(1), "restarting the worker group")) << logs();
}

// Rank 1 (node 0) stops issuing collectives and spins: node 1 names a culprit
// on the other node, node 0 shows it spinning.
TEST_F(HangTest, ASpinningRankIsNamedAndItsStackShowsTheSpin) {
  ASSERT_NO_FATAL_FAILURE(start("stop", 1, 8, {"--max_restarts=0"}, {"--steps", "30"}));
  ASSERT_TRUE(wait_agents()) << "the job did not end\n" << logs();
  EXPECT_NE(code(0), 0) << logs();
  EXPECT_NE(code(1), 0) << logs();
  for (int node = 0; node < 2; ++node) {
    expect_report(node, "behind", 1);
    expect_incident(node, "behind", 1);
  }
  expect_stack(1, "progress_worker_spins_forever");
  EXPECT_TRUE(contains(hang_report(err(0)), "progress_worker_spins_forever"))
      << hang_report(err(0));
  EXPECT_TRUE(contains(err(0), "traceback : ended by ddprun after a hang: rank 1")) << err(0);
}

// Rank 2 (node 1) computes 3x longer each step: a straggler, not a hang.
TEST_F(HangTest, AStragglerIsNamedAndScoredButIsNotAHang) {
  ASSERT_NO_FATAL_FAILURE(
      start("slow", 2, 0, {"--max_restarts=0"}, {"--steps", "120", "--step_ms", "60"}));
  ASSERT_TRUE(wait_agents()) << "the job did not end\n" << logs();
  EXPECT_EQ(code(0), 0) << logs();
  EXPECT_EQ(code(1), 0) << logs();
  for (int node = 0; node < 2; ++node) {
    SCOPED_TRACE("node " + std::to_string(node));
    EXPECT_FALSE(contains(err(node) + out(node), "HANG")) << logs();
    const auto warnings = lines_with(err(node), "straggler: rank ");
    ASSERT_FALSE(warnings.empty()) << logs();
    for (const auto& line : warnings) {
      EXPECT_TRUE(std::regex_search(
          line, std::regex("straggler: rank 2 \\(node 1, host [^,]+, pid [0-9]+\\) has scored "
                           "below 0\\.7 for 5 s: ")))
          << line;
    }
    const auto scores = lines_with(err(node), "ddprun: straggler scores of the last round");
    ASSERT_EQ(scores.size(), 1u) << logs();
    EXPECT_TRUE(std::regex_search(scores[0], std::regex("rank 2 0\\.[0-9]+ \\(straggler\\)")))
        << scores[0];
    for (int rank : {0, 1, 3}) {
      EXPECT_TRUE(std::regex_search(
          scores[0], std::regex("rank " + std::to_string(rank) + " [01]\\.[0-9]+(,|$)")))
          << "rank " << rank << " missing or marked\n"
          << scores[0];
    }
  }
  EXPECT_EQ(incident_files(), std::vector<std::string>{}) << logs();
}

// Every rank finishes; rank 3 (node 1) never exits. Node 1 names it, takes its
// stacks and ends it. Node 0 sees node 1's exits through node 1's summaries
// (an exit is published at once), and whichever node finds the hang first
// puts it in its summary: node 0 reports it too, even when node 1 ended the
// culprit before node 0's own look reached the timeout.
TEST_F(HangTest, ARankThatNeverExitsIsNamedAsNotExitingByEveryNode) {
  ASSERT_NO_FATAL_FAILURE(start("no_exit", 3, 0, {"--max_restarts=0"}, {"--steps", "20"}));
  ASSERT_TRUE(wait_agents()) << "the job did not end\n" << logs();
  EXPECT_NE(code(0), 0) << logs();
  EXPECT_NE(code(1), 0) << logs();
  for (int node : {1, 0}) {
    expect_report(node, "not_exiting", 3);
    expect_incident(node, "not_exiting", 3);
    EXPECT_TRUE(contains(hang_report(err(node)), "rank 3 still running")) << hang_report(err(node));
  }
  expect_stack(3, "progress_worker_blocks_forever");
  EXPECT_TRUE(contains(err(1), "traceback : ended by ddprun after a hang: rank 3 still running"))
      << err(1);
}

// --max_no_progress_restarts: rank 1 fails before its first step on every
// attempt, so no restart brings progress. After the second restart in a row
// without a step, both nodes stop the job with exit code 93 and say why,
// though restarts are left.
TEST_F(HangTest, RestartsWithoutAStepInARowStopTheJobWithItsOwnExitCode) {
  ASSERT_NO_FATAL_FAILURE(
      start("fail", 1, 0, {"--max_restarts=5", "--max_no_progress_restarts=2"}, {}));
  ASSERT_TRUE(wait_agents()) << "the job did not end\n" << logs();
  for (int node = 0; node < 2; ++node) {
    SCOPED_TRACE("node " + std::to_string(node));
    EXPECT_EQ(code(node), 93) << logs();
    const std::string text = err(node);
    EXPECT_TRUE(contains(text,
                         "ddprun: stopping the job: its last 2 restarts each came after a "
                         "round in which no rank completed a step "
                         "(--max_no_progress_restarts=2); exit code 93"))
        << text;
    EXPECT_TRUE(contains(text, "  restart 1 of the job, after round 0: ")) << text;
    EXPECT_TRUE(contains(text, "  restart 2 of the job, after round 1: ")) << text;
    EXPECT_TRUE(contains(text, "; no rank completed a step\n")) << text;
  }
  EXPECT_TRUE(contains(err(0), "node 0's workers failed (exit code 3)")) << err(0);
  // Rounds 0 and 1 ran and failed; no third attempt was started.
  EXPECT_TRUE(fs::is_directory(attempt_dir(1))) << logs();
  EXPECT_FALSE(fs::exists(attempt_dir(2))) << logs();
}

// The same failure after two steps: the round made progress, so the rule
// (at 1) lets the restart happen; --max_restarts ends the job, with the
// worker's exit code.
TEST_F(HangTest, RestartsAfterStepsAreNotStoppedByTheNoProgressRule) {
  ASSERT_NO_FATAL_FAILURE(
      start("fail", 1, 2, {"--max_restarts=1", "--max_no_progress_restarts=1"}, {}));
  ASSERT_TRUE(wait_agents()) << "the job did not end\n" << logs();
  // Node 0 runs the failing rank; node 1's ranks may fail of its loss first
  // (their collective breaks), so its code is theirs.
  EXPECT_EQ(code(0), 3) << logs();
  EXPECT_NE(code(1), 0) << logs();
  for (int node = 0; node < 2; ++node) {
    EXPECT_NE(code(node), 93) << logs();
    EXPECT_FALSE(contains(err(node), "--max_no_progress_restarts=1)")) << err(node);
  }
  EXPECT_TRUE(fs::is_directory(attempt_dir(1))) << logs();
  EXPECT_TRUE(contains(err(0), "restarting the worker group (1/1 restarts)")) << err(0);
  EXPECT_FALSE(fs::exists(attempt_dir(2))) << logs();
}

// A healthy job with a slow first step and a checkpoint pause, each shorter
// than the timeout: nothing is reported.
TEST_F(HangTest, ASlowFirstStepAndACheckpointPauseAreNotHangs) {
  ASSERT_NO_FATAL_FAILURE(
      start("checkpoint", 0, 20, {"--max_restarts=0"},
            {"--first_ms", "2000", "--pause_ms", "2000", "--steps", "60", "--step_ms", "50"}));
  ASSERT_TRUE(wait_agents()) << "the job did not end\n" << logs();
  EXPECT_EQ(code(0), 0) << logs();
  EXPECT_EQ(code(1), 0) << logs();
  for (int node = 0; node < 2; ++node) {
    EXPECT_FALSE(contains(err(node) + out(node), "HANG")) << logs();
  }
  EXPECT_EQ(incident_files(), std::vector<std::string>{}) << logs();
  EXPECT_FALSE(fs::exists(attempt_dir(1)));
}

}  // namespace
}  // namespace ddp::test
