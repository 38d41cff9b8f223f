// `ddprun status`, its parts alone: the /status document parsed into the model
// (hand-made documents, hostile ones too), the view rendered from parsed
// documents at a given size, the command line, the token, and the fetch against
// sockets on loopback that refuse, never answer, answer 401, garbage or JSON.
// The whole command against real agents, in tmux: status_view_tmux_test.py.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "net_util.h"
#include "status_command.h"
#include "status_document.h"
#include "status_fetch.h"
#include "status_view.h"
#include "temp_dir.h"

namespace ddp::launcher::status {
namespace {

using nlohmann::json;

// An agent's /status as docs/using.md describes it: node `node` of a 2-node
// round `round`, 2 ranks a node, `peer_state` for the other node.
json agent_doc(int node, int round, const std::string& peer_state = "alive") {
  const int peer = 1 - node;
  json members = json::array();
  members.push_back({{"node", node},
                     {"host", "host" + std::to_string(node)},
                     {"addr", "10.0.0." + std::to_string(node + 1)},
                     {"ranks", {2 * node, 2 * node + 1}},
                     {"state", "self"},
                     {"last_heard_s", nullptr},
                     {"keep_alive_age_s", nullptr},
                     {"lost_after_s", nullptr}});
  members.push_back({{"node", peer},
                     {"host", "host" + std::to_string(peer)},
                     {"addr", "10.0.0." + std::to_string(peer + 1)},
                     {"ranks", {2 * peer, 2 * peer + 1}},
                     {"state", peer_state},
                     {"last_heard_s", 0.25},
                     // node 0 judges node 1's keep-alive, node 1 judges node 0's
                     {"keep_alive_age_s", 0.5 + node},
                     {"lost_after_s", 2.0}});
  json ranks = json::array();
  for (int r = 0; r < 4; ++r) {
    const bool own = r / 2 == node;
    ranks.push_back({{"rank", r},
                     {"local_rank", r % 2},
                     {"node", r / 2},
                     {"host", "host" + std::to_string(r / 2)},
                     {"pid", 1000 + r},
                     {"state", "running"},
                     {"steps", own ? 120 : 100},  // the own node's figures are fresher
                     {"step_time_s", 0.041},
                     {"compute_s", r == 3 ? 0.12 : 0.04},
                     {"straggler_score", r == 3 ? 0.33 : 1.0},
                     {"straggler", r == 3},
                     {"last_progress_s", 0.01},
                     {"where", "waits in allreduce #11"},
                     {"stale", !own}});
  }
  return {{"kind", "agent"},
          {"run_id", "job42"},
          {"backend", "c10d"},
          {"time", "2026-11-28T04:31:02Z"},
          {"uptime_s", 93.5},
          {"node",
           {{"host", "host" + std::to_string(node)},
            {"addr", "10.0.0.1"},
            {"group_rank", node},
            {"pid", 77 + node}}},
          {"nnodes", {{"min", 1}, {"max", 2}}},
          {"nproc_per_node", 2},
          {"state", "running"},
          {"state_s", 12.0},
          {"ready", true},
          {"ready_reason", ""},
          {"round",
           {{"number", round},
            {"attempt", 0},
            {"world_size", 4},
            {"group_world_size", 2},
            {"base_rank", 2 * node},
            {"formed_s_ago", 12.0}}},
          {"restarts",
           {{"spent", 1},
            {"max", 3},
            {"membership_changes", 2},
            {"by_cause", {{"worker_failure", 1}}}}},
          {"worker_exits", {{"succeeded", 0}}},
          {"members", members},
          {"ranks", ranks},
          {"events", json::array({{{"time", "2026-11-28T04:30:50Z"},
                                   {"age_s", 12.0},
                                   {"round", round},
                                   {"kind", "round_formed"},
                                   {"text", "round formed: 2 nodes, world size 4"}},
                                  {{"time", "2026-11-28T04:30:55Z"},
                                   {"age_s", 7.0 - node},
                                   {"round", round},
                                   {"kind", "straggler"},
                                   {"text", "seen by node " + std::to_string(node)}}})},
          {"incident", nullptr}};
}

// The incident of a hang rank 3 caused, found by node 1.
json hang_incident() {
  return {{"kind", "hang"},
          {"hang_kind", "collective"},
          {"summary", "rank 3 never reached allreduce #12"},
          {"culprits", {3}},
          {"node", 1},
          {"time", "2026-11-28T04:31:00Z"},
          {"file", "/logs/hang_0_node1.json"}};
}

AgentAnswer answer_of(const std::string& url, const json& doc) {
  ParsedDocument parsed = parse_status_document(doc.dump());
  EXPECT_TRUE(parsed.document) << parsed.error;
  AgentAnswer a;
  a.url = url;
  a.document = parsed.document;
  return a;
}

AgentAnswer unreachable(const std::string& url, const std::string& error,
                        std::optional<int> last_node = std::nullopt) {
  AgentAnswer a;
  a.url = url;
  a.error = error;
  a.last_node = last_node;
  a.last_host = last_node ? "host" + std::to_string(*last_node) : "";
  return a;
}

// The cells of the first line whose first cells are `first`.
std::vector<std::string> row(const std::vector<std::string>& lines,
                             const std::vector<std::string>& first) {
  for (const auto& line : lines) {
    std::vector<std::string> cells;
    std::string cell;
    for (char c : line + " ") {
      if (c == ' ') {
        if (!cell.empty()) cells.push_back(cell);
        cell.clear();
      } else {
        cell += c;
      }
    }
    if (cells.size() >= first.size() && std::equal(first.begin(), first.end(), cells.begin())) {
      return cells;
    }
  }
  return {};
}

std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  return text;
}

// ---- the document ---------------------------------------------------------------------

TEST(StatusDocument, ReadsEveryFieldTheAgentWrites) {
  const ParsedDocument parsed = parse_status_document(agent_doc(1, 3).dump());
  ASSERT_TRUE(parsed.document) << parsed.error;
  const auto& a = std::get<AgentStatus>(*parsed.document);
  EXPECT_EQ(a.run_id, "job42");
  EXPECT_EQ(a.backend, "c10d");
  EXPECT_EQ(a.state, "running");
  EXPECT_TRUE(a.ready);
  EXPECT_EQ(a.group_rank, 1);
  EXPECT_EQ(a.pid, 78);
  EXPECT_EQ(a.min_nodes, 1);
  EXPECT_EQ(a.max_nodes, 2);
  ASSERT_TRUE(a.round);
  EXPECT_EQ(a.round->number, 3);
  EXPECT_EQ(a.round->world_size, 4);
  EXPECT_EQ(a.restarts_spent, 1);
  EXPECT_EQ(a.max_restarts, 3);
  EXPECT_EQ(a.restarts_by_cause.at("worker_failure"), 1);
  ASSERT_EQ(a.members.size(), 2u);
  EXPECT_EQ(a.members[1].node, 0);
  EXPECT_EQ(a.members[1].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(a.members[1].keep_alive_age_s, 1.5);
  EXPECT_FALSE(a.members[0].keep_alive_age_s);
  ASSERT_EQ(a.ranks.size(), 4u);
  EXPECT_EQ(a.ranks[3].straggler_score, 0.33);
  EXPECT_TRUE(a.ranks[3].straggler);
  EXPECT_EQ(a.ranks[3].where, "waits in allreduce #11");
  ASSERT_EQ(a.events.size(), 2u);
  EXPECT_EQ(a.events[1].kind, "straggler");
  EXPECT_FALSE(a.incident);
}

TEST(StatusDocument, ReadsTheIncidentAndARoundNotFormedYet) {
  json doc = agent_doc(0, 1);
  doc["round"] = nullptr;
  doc["node"]["group_rank"] = nullptr;
  doc["incident"] = hang_incident();
  const ParsedDocument parsed = parse_status_document(doc.dump());
  ASSERT_TRUE(parsed.document);
  const auto& a = std::get<AgentStatus>(*parsed.document);
  EXPECT_FALSE(a.round);
  EXPECT_FALSE(a.group_rank);
  ASSERT_TRUE(a.incident);
  EXPECT_EQ(a.incident->culprits, std::vector<int>{3});
  EXPECT_EQ(a.incident->file, "/logs/hang_0_node1.json");
}

TEST(StatusDocument, ReadsTheDaemonsDocument) {
  const json doc = {{"kind", "daemon"},    {"address", "0.0.0.0:29400"},
                    {"state", "serving"},  {"uptime_s", 5.0},
                    {"ready", true},       {"clients", 3},
                    {"max_clients", 1024}, {"keys", 17}};
  const ParsedDocument parsed = parse_status_document(doc.dump());
  ASSERT_TRUE(parsed.document);
  const auto& d = std::get<DaemonStatus>(*parsed.document);
  EXPECT_EQ(d.address, "0.0.0.0:29400");
  EXPECT_EQ(d.clients, 3);
  EXPECT_EQ(d.keys, 17);
}

TEST(StatusDocument, RefusesWhatIsNotALiveViewsDocument) {
  EXPECT_EQ(parse_status_document("<html>nope</html>").error,
            "answered something that is not JSON");
  EXPECT_EQ(parse_status_document("").error, "answered something that is not JSON");
  EXPECT_EQ(parse_status_document("[1,2]").error,
            "answered JSON that is not a live view's document (not an object)");
  EXPECT_EQ(parse_status_document(R"({"health":"true"})").error,
            "answered JSON that is not a live view's document (no 'kind')");
  EXPECT_EQ(parse_status_document(R"({"kind":"etcd"})").error,
            "answered a document of kind 'etcd', neither an agent's nor the daemon's");
}

TEST(StatusDocument, FieldsOfTheWrongTypeReadAsAbsentAndTextIsMadePrintable) {
  json doc = agent_doc(0, 1);
  doc["run_id"] = "job\x1b[2J\n42";
  doc["restarts"] = "many";
  doc["members"][1]["ranks"] = {"a", 5, 1e300, -2};
  doc["members"][1]["keep_alive_age_s"] = "soon";
  doc["ranks"][0] = 17;  // not an object: skipped
  doc["ranks"][1]["pid"] = 1e30;
  doc["events"] = {{"deep", json::array({json::array({json::array()})})}};
  const ParsedDocument parsed = parse_status_document(doc.dump());
  ASSERT_TRUE(parsed.document) << parsed.error;
  const auto& a = std::get<AgentStatus>(*parsed.document);
  EXPECT_EQ(a.run_id, "job?[2J?42");
  EXPECT_EQ(a.restarts_spent, 0);
  EXPECT_EQ(a.members[1].ranks, (std::vector<int>{5, -2}));
  EXPECT_FALSE(a.members[1].keep_alive_age_s);
  ASSERT_EQ(a.ranks.size(), 3u);
  EXPECT_EQ(a.ranks[0].rank, 1);
  EXPECT_EQ(a.ranks[0].pid, 0);
  EXPECT_TRUE(a.events.empty());
}

TEST(StatusDocument, ADocumentNestedTooDeepIsCutNotFollowed) {
  std::string deep = R"({"kind":"agent","run_id":"r","x":)" + std::string(100000, '[') +
                     std::string(100000, ']') + "}";
  const ParsedDocument parsed = parse_status_document(deep);
  ASSERT_TRUE(parsed.document) << parsed.error;
  EXPECT_EQ(std::get<AgentStatus>(*parsed.document).run_id, "r");
}

// ---- the view -------------------------------------------------------------------------

TEST(StatusView, ShowsTheNodesRanksEventsOfTwoAgentsOfOneRound) {
  const std::vector<AgentAnswer> answers = {answer_of("http://n0:9400/", agent_doc(0, 2)),
                                            answer_of("http://n1:9400/", agent_doc(1, 2))};
  const auto lines = render_status_view(answers, {140, 0});
  EXPECT_EQ(lines[0],
            "ddprun status 2026-11-28T04:31:02Z | run job42 (c10d) | nnodes 1:2, nproc_per_node "
            "2 | round 2: 2 nodes, 4 ranks | restarts 1/3, re-forms 2");
  EXPECT_EQ(lines[1], "OK: every node answers (2 in the round)");
  EXPECT_EQ(
      row(lines, {"http://n0:9400/"}),
      (std::vector<std::string>{"http://n0:9400/", "0", "host0", "running", "2", "yes", "1m33s"}));
  EXPECT_EQ(row(lines, {"http://n1:9400/"})[1], "1");
  // As node 0 sees them (the first URL of the highest round); node 0's own
  // keep-alive age comes from node 1, which judges it.
  EXPECT_NE(joined(lines).find("NODES, as node 0 sees them"), std::string::npos);
  EXPECT_EQ(row(lines, {"0", "host0"}),
            (std::vector<std::string>{"0", "host0", "10.0.0.1", "0-1", "self", "-", "1.50s", "of",
                                      "2.00s"}));
  EXPECT_EQ(row(lines, {"1", "host1"}),
            (std::vector<std::string>{"1", "host1", "10.0.0.2", "2-3", "alive", "0.250s", "0.500s",
                                      "of", "2.00s"}));
  // Each rank from its own node's agent: 120 steps, not stale.
  for (int r = 0; r < 4; ++r) {
    const auto cells = row(lines, {std::to_string(r), std::to_string(r / 2)});
    ASSERT_GE(cells.size(), 10u) << joined(lines);
    EXPECT_EQ(cells[4], "running");
    EXPECT_EQ(cells[5], "120");
    EXPECT_EQ(cells[6], "0.041s");
  }
  EXPECT_EQ(row(lines, {"3", "1"})[8], "0.33");
  EXPECT_EQ(row(lines, {"3", "1"})[9], "STRAGGLER");
  // Events from both agents, oldest first, the round's forming once.
  const std::string text = joined(lines);
  EXPECT_NE(text.find("EVENTS, the last 3 of 3"), std::string::npos) << text;
  const auto formed = text.find("round formed: 2 nodes");
  const auto by0 = text.find("seen by node 0");
  const auto by1 = text.find("seen by node 1");
  ASSERT_NE(formed, std::string::npos);
  EXPECT_LT(formed, by0);
  EXPECT_LT(by0, by1);
  EXPECT_EQ(text.find("round formed", formed + 1), std::string::npos);
  EXPECT_EQ(lines.back(), "  none");
}

TEST(StatusView, AnUnreachableAgentAndALostNodeAreTheProblem) {
  const std::vector<AgentAnswer> answers = {
      answer_of("http://n0:9400/", agent_doc(0, 3, "lost")),
      unreachable("http://n1:9400/", "connection refused", 1)};
  const auto lines = render_status_view(answers, {120, 0});
  EXPECT_EQ(lines[1],
            "PROBLEM: agent http://n1:9400/ (node 1) does not answer; node 1 (host1) lost");
  EXPECT_EQ(row(lines, {"http://n1:9400/"}),
            (std::vector<std::string>{"http://n1:9400/", "1", "(last", "seen", "as)", "host1",
                                      "UNREACHABLE:", "connection", "refused"}));
  EXPECT_EQ(row(lines, {"1", "host1"})[4], "LOST");
  // Without the other agent, its ranks are as node 0 last had them, marked stale.
  EXPECT_EQ(row(lines, {"2", "1"})[4], "running");
  EXPECT_EQ(row(lines, {"2", "1"})[5], "(stale)");
  EXPECT_EQ(row(lines, {"2", "1"})[6], "100");
}

TEST(StatusView, TheTitleCountsOneNodeAndOneRankInTheSingular) {
  json doc = agent_doc(0, 4, "lost");
  doc["round"]["group_world_size"] = 1;
  doc["round"]["world_size"] = 1;
  const auto lines = render_status_view({answer_of("http://n0:9400/", doc)}, {200, 0});
  EXPECT_NE(lines[0].find(" | round 4: 1 node, 1 rank | "), std::string::npos) << lines[0];
}

TEST(StatusView, NoAgentAnsweringShowsOnlyTheAgents) {
  const auto lines =
      render_status_view({unreachable("http://a:1/", "no answer within 2 s"),
                          unreachable("http://b:2/", "401 Unauthorized: the token was refused")},
                         {100, 0});
  EXPECT_EQ(lines[0], "ddprun status");
  EXPECT_EQ(lines[1],
            "PROBLEM: agent http://a:1/ does not answer; agent http://b:2/ does not answer");
  EXPECT_EQ(row(lines, {"http://b:2/"}).back(), "refused");
  EXPECT_EQ(joined(lines).find("NODES"), std::string::npos);
}

TEST(StatusView, TheMostAdvancedAgentIsTheOneWhoseViewIsShown) {
  // Node 1 still reports round 2; node 0 is in round 3, where node 1 is unreachable.
  const auto lines =
      render_status_view({answer_of("http://n1:9400/", agent_doc(1, 2)),
                          answer_of("http://n0:9400/", agent_doc(0, 3, "unreachable"))},
                         {120, 0});
  EXPECT_NE(joined(lines).find("NODES, as node 0 sees them"), std::string::npos);
  EXPECT_EQ(row(lines, {"1", "host1"})[4], "UNREACHABLE");
  EXPECT_NE(lines[1].find("node 1 (host1) unreachable"), std::string::npos) << lines[1];
  // Node 1 is of another round: node 0's figures are shown, not its own.
  EXPECT_EQ(row(lines, {"2", "1"})[6], "100");
}

TEST(StatusView, ShowsTheLastIncidentAndTheDaemon) {
  json doc = agent_doc(0, 1);
  doc["incident"] = hang_incident();
  const json daemon = {{"kind", "daemon"},    {"address", "0.0.0.0:29400"},
                       {"state", "serving"},  {"uptime_s", 5.0},
                       {"ready", true},       {"clients", 3},
                       {"max_clients", 1024}, {"keys", 17}};
  const auto lines = render_status_view(
      {answer_of("http://n0:9400/", doc), answer_of("http://store:9500/", daemon)}, {120, 0});
  EXPECT_EQ(lines[1], "PROBLEM: hang: rank 3 never reached allreduce #12");
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(
      lines[lines.size() - 2],
      "  2026-11-28T04:31:00Z collective found by node 1: rank 3 never reached allreduce #12");
  EXPECT_EQ(lines.back(), "  culprit ranks 3; report /logs/hang_0_node1.json");
  const auto store = row(lines, {"http://store:9500/"});
  ASSERT_GE(store.size(), 4u);
  EXPECT_EQ(store[2], "0.0.0.0:29400");
  EXPECT_EQ(store[4], "daemon:");
}

TEST(StatusView, EveryLineFitsTheWidth) {
  const std::vector<AgentAnswer> answers = {answer_of("http://n0:9400/", agent_doc(0, 2)),
                                            unreachable("http://n1:9400/", "connection refused")};
  for (int width : {20, 47, 80, 200}) {
    const auto lines = render_status_view(answers, {width, 0});
    for (const auto& line : lines) {
      EXPECT_LE(line.size(), static_cast<std::size_t>(width)) << line;
    }
  }
  // Narrower than 20 columns is drawn at 20.
  for (const auto& line : render_status_view(answers, {5, 0})) EXPECT_LE(line.size(), 20u);
}

TEST(StatusView, ATerminalTooShortCutsTheRanksAndEventsToFit) {
  json doc = agent_doc(0, 2);
  for (int r = 4; r < 64; ++r) {
    json rank = doc["ranks"][0];
    rank["rank"] = r;
    doc["ranks"].push_back(rank);
  }
  for (int e = 0; e < 20; ++e) {
    doc["events"].push_back({{"time", "2026-11-28T04:31:00Z"},
                             {"age_s", 1.0},
                             {"round", 2},
                             {"kind", "restart"},
                             {"text", "event " + std::to_string(e)}});
  }
  const std::vector<AgentAnswer> answers = {answer_of("http://n0:9400/", doc)};
  const auto tall = render_status_view(answers, {120, 0});
  EXPECT_NE(joined(tall).find("EVENTS, the last 8 of 22"), std::string::npos);
  EXPECT_TRUE(!row(tall, {"63", "0"}).empty());
  const auto lines = render_status_view(answers, {120, 40});
  EXPECT_EQ(lines.size(), 40u) << joined(lines);
  const std::string text = joined(lines);
  EXPECT_NE(text.find("EVENTS, the last 3 of 22"), std::string::npos) << text;
  EXPECT_NE(text.find("event 19"), std::string::npos);  // the newest are kept
  // 10 lines above the ranks, 8 of titles, headers and blank lines, 1 of incident, 3 events
  EXPECT_NE(text.find("RANKS (18 of 64; a taller terminal shows more)"), std::string::npos) << text;
  EXPECT_EQ(lines.back(), "  none");
}

TEST(StatusView, DurationsReadAsPeopleWriteThem) {
  EXPECT_EQ(duration_text(std::nullopt), "-");
  EXPECT_EQ(duration_text(0.0412), "0.041s");
  EXPECT_EQ(duration_text(4.254), "4.25s");
  EXPECT_EQ(duration_text(12.34), "12.3s");
  EXPECT_EQ(duration_text(245), "4m05s");
  EXPECT_EQ(duration_text(7380), "2h03m");
  EXPECT_EQ(duration_text(-3), "0.000s");
}

// ---- the command line -----------------------------------------------------------------

TEST(StatusArgs, WatchTakesSecondsWhenTheNextArgumentIsANumber) {
  StatusArgs a = parse_status_args({"--watch", "http://h:9400/"});
  ASSERT_EQ(a.error, "");
  EXPECT_EQ(a.watch, kDefaultWatch);
  ASSERT_EQ(a.urls.size(), 1u);
  a = parse_status_args({"--watch", "1", "h:1", "h:2"});
  EXPECT_EQ(a.watch, std::chrono::milliseconds(1000));
  EXPECT_EQ(a.urls.size(), 2u);
  a = parse_status_args({"--watch=0.5", "h:1"});
  EXPECT_EQ(a.watch, std::chrono::milliseconds(500));
  EXPECT_FALSE(parse_status_args({"h:1"}).watch);
  EXPECT_EQ(parse_status_args({"--watch=soon", "h:1"}).error,
            "--watch: expected seconds, got 'soon'");
  EXPECT_EQ(parse_status_args({"--watch=0", "h:1"}).error,
            "--watch: the period must be more than 0 seconds");
}

TEST(StatusArgs, TokenTimeoutAndErrors) {
  StatusArgs a = parse_status_args({"--token", "s3cret", "--timeout=0.25", "h:1"});
  EXPECT_EQ(a.token, "s3cret");
  EXPECT_EQ(a.timeout, std::chrono::milliseconds(250));
  EXPECT_EQ(parse_status_args({"--token-file", "/t", "h:1"}).token_file, "/t");
  EXPECT_EQ(parse_status_args({"--token_file=/t", "h:1"}).token_file, "/t");
  EXPECT_EQ(parse_status_args({"h:1", "--token"}).error, "--token needs a value");
  EXPECT_EQ(parse_status_args({"--timeout", "0", "h:1"}).error,
            "--timeout: expected seconds (more than 0), got '0'");
  EXPECT_EQ(parse_status_args({"--nope", "h:1"}).error, "unknown option '--nope'");
  EXPECT_EQ(parse_status_args({}).error,
            "no URL: name the live view of at least one agent (http://HOST:PORT/)");
  EXPECT_TRUE(parse_status_args({"--help"}).help);
  // After "--" every argument is a URL.
  a = parse_status_args({"--", "--watch:1"});
  ASSERT_EQ(a.urls.size(), 1u) << a.error;
  EXPECT_EQ(a.urls[0].host, "--watch");
  EXPECT_FALSE(a.watch);
}

TEST(StatusArgs, UrlsNameTheLiveViewOrItsStatus) {
  StatusUrl u = parse_status_url("http://node0:9400/");
  EXPECT_EQ(u.host, "node0");
  EXPECT_EQ(u.port, "9400");
  EXPECT_EQ(u.target, "/status");
  EXPECT_EQ(parse_status_url("node0:9400").target, "/status");
  EXPECT_EQ(parse_status_url("http://node0:9400/status").target, "/status");
  EXPECT_EQ(parse_status_url("http://node0:9400/ddp/").target, "/ddp/status");
  u = parse_status_url("http://[::1]:9400/?token=abc&x=1");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.token, "abc");
  EXPECT_EQ(u.target, "/status");
  auto error_of = [](const std::string& url) {
    try {
      parse_status_url(url);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("https://node0:9400/"),
            "'https://node0:9400/': the live view speaks plain http, not https");
  EXPECT_EQ(error_of("node0"),
            "'node0' names no host and port (the live view is at "
            "http://HOST:PORT/, PORT the agent's --status_port)");
  EXPECT_EQ(error_of("node0:0"), "'node0:0': the port '0' is not a number from 1 to 65535");
  EXPECT_EQ(error_of("node0:70000"),
            "'node0:70000': the port '70000' is not a number from 1 to 65535");
  EXPECT_EQ(error_of("node0:94x"), "'node0:94x': the port '94x' is not a number from 1 to 65535");
}

TEST(StatusArgs, TheTokenComesFromTheOptionTheFileOrTheEnvironment) {
  test::TempDir dir;
  const std::string file = (dir.path() / "token").string();
  std::ofstream(file) << "from-file\n";
  StatusArgs a = parse_status_args({"--token_file", file, "h:1"});
  EXPECT_EQ(resolve_token(a, "from-env"), "from-file");
  a.token = "from-option";
  EXPECT_EQ(resolve_token(a, "from-env"), "from-option");
  EXPECT_EQ(resolve_token(parse_status_args({"h:1"}), "from-env"), "from-env");
  a = parse_status_args({"--token_file", file + ".missing", "h:1"});
  EXPECT_THROW(resolve_token(a, ""), std::exception);
}

// ---- the fetch ------------------------------------------------------------------------

// A loopback server that answers one connection with `reply` and keeps the
// request it read.
class OneReplyServer {
 public:
  explicit OneReplyServer(std::string reply) : reply_(std::move(reply)) {
    fd_ = test::listen_loopback(port_);
    thread_ = std::thread([this] {
      const int client = ::accept(fd_, nullptr, nullptr);
      if (client < 0) return;
      char buffer[4096];
      while (request_.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(client, buffer, sizeof buffer, 0);
        if (n <= 0) break;
        request_.append(buffer, static_cast<std::size_t>(n));
      }
      ::send(client, reply_.data(), reply_.size(), MSG_NOSIGNAL);
      ::close(client);
    });
  }
  ~OneReplyServer() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/"; }
  // Valid once the fetch returned.
  const std::string& request() const { return request_; }

 private:
  std::string reply_;
  std::uint16_t port_ = 0;
  int fd_ = -1;
  std::string request_;
  std::thread thread_;
};

std::string http_reply(const std::string& status, const std::string& body) {
  return "HTTP/1.1 " + status +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

FetchReply fetch_one(const std::string& url, const std::string& token,
                     std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  return fetch_statuses({parse_status_url(url)}, token, timeout).at(0);
}

TEST(StatusFetch, GetsTheStatusWithTheToken) {
  OneReplyServer server(http_reply("200 OK", R"({"kind":"agent"})"));
  const FetchReply reply = fetch_one(server.url(), "s3cret");
  ASSERT_TRUE(reply.body) << reply.error;
  EXPECT_EQ(*reply.body, R"({"kind":"agent"})");
  EXPECT_EQ(server.request().rfind("GET /status HTTP/1.1\r\n", 0), 0u) << server.request();
  EXPECT_NE(server.request().find("Authorization: Bearer s3cret\r\n"), std::string::npos);
}

TEST(StatusFetch, TheUrlsOwnTokenWinsAndNoTokenSendsNoHeader) {
  {
    OneReplyServer server(http_reply("200 OK", "{}"));
    fetch_one(server.url() + "?token=own", "other");
    EXPECT_NE(server.request().find("Authorization: Bearer own\r\n"), std::string::npos);
  }
  OneReplyServer server(http_reply("200 OK", "{}"));
  fetch_one(server.url(), "");
  EXPECT_EQ(server.request().find("Authorization"), std::string::npos) << server.request();
}

TEST(StatusFetch, SaysWhatWentWrong) {
  {
    OneReplyServer server(http_reply("401 Unauthorized", R"({"error":"unauthorized"})"));
    EXPECT_EQ(fetch_one(server.url(), "").error,
              "401 Unauthorized: the live view wants the store's token (--token, --token_file or "
              "DDP_STORE_TOKEN)");
  }
  {
    OneReplyServer server(http_reply("401 Unauthorized", ""));
    EXPECT_EQ(fetch_one(server.url(), "wrong").error, "401 Unauthorized: the token was refused");
  }
  {
    OneReplyServer server(http_reply("404 Not Found", "{}"));
    EXPECT_EQ(fetch_one(server.url(), "").error, "answered HTTP 404 Not Found");
  }
  {
    OneReplyServer server("SSH-2.0-OpenSSH_9.2\r\n");
    EXPECT_EQ(fetch_one(server.url(), "").error.rfind("answered something that is not HTTP", 0),
              0u);
  }
  {
    OneReplyServer server("");
    EXPECT_EQ(fetch_one(server.url(), "").error, "closed the connection without answering");
  }
  {
    OneReplyServer server(http_reply("200 OK", std::string(2000, 'x')));
    const FetchReply reply =
        fetch_statuses({parse_status_url(server.url())}, "", std::chrono::seconds(5), 1000).at(0);
    EXPECT_EQ(reply.error, "sent a reply over 1000 bytes");
  }
}

TEST(StatusFetch, ARefusedAndASilentAgentCostOneTimeoutTogether) {
  std::uint16_t closed_port = 0;
  ::close(test::bind_loopback(closed_port));  // nothing listens there
  std::uint16_t silent_port = 0;
  const int silent = test::listen_loopback(silent_port);  // never accepts, never answers
  OneReplyServer good(http_reply("200 OK", "{}"));
  const auto started = std::chrono::steady_clock::now();
  const auto replies = fetch_statuses(
      {parse_status_url("127.0.0.1:" + std::to_string(closed_port)),
       parse_status_url("127.0.0.1:" + std::to_string(silent_port)),
       parse_status_url("127.0.0.1:" + std::to_string(silent_port)), parse_status_url(good.url())},
      "", std::chrono::milliseconds(300));
  const auto took = std::chrono::steady_clock::now() - started;
  ::close(silent);
  ASSERT_EQ(replies.size(), 4u);
  EXPECT_EQ(replies[0].error, "connection refused");
  EXPECT_EQ(replies[1].error, "no answer within 0.3 s");
  EXPECT_EQ(replies[2].error, "no answer within 0.3 s");
  EXPECT_TRUE(replies[3].body);
  EXPECT_LT(took, std::chrono::milliseconds(550));  // together, not one after the other
}

}  // namespace
}  // namespace ddp::launcher::status
