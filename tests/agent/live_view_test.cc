// The agent's live view as the agent fills it: restarts by cause, exits by
// reason and events, read over HTTP while the agent runs (FakeEventLoop, a
// single node on MemoryStore), and the port closed when run() returns.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

#include "ddp/agent/agent.h"
#include "ddp/rendezvous/rendezvous.h"
#include "ddp/store/memory_store.h"
#include "fake_event_loop.h"
#include "temp_dir.h"

namespace ddp::agent {
namespace {

using test::FakeEventLoop;

// One GET on 127.0.0.1:port; the whole response (the server closes with
// Connection: close), or "" when nothing listens.
std::string http_get(std::uint16_t port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
  EXPECT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string reply;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof(buffer))) > 0;) reply.append(buffer, n);
  ::close(fd);
  return reply;
}

std::string body_of(const std::string& reply) {
  const auto end = reply.find("\r\n\r\n");
  return end == std::string::npos ? "" : reply.substr(end + 4);
}

TEST(AgentLiveView, RestartsExitsAndEventsAreServedWhileTheAgentRuns) {
  ::ddp::test::TempDir dir("ddp-agent-live-view");
  RendezvousParams params;
  params.run_id = "live";
  params.local_world_size = 2;
  params.worker_master_port = 4321;
  RendezvousStore rs(std::make_shared<MemoryStore>());
  rs.at("10.1.2.3", 1234);
  auto rdzv = make_static_rendezvous(params, rs);

  AgentOptions options;
  options.spec.local_world_size = 2;
  options.spec.argv = {"/bin/worker"};
  options.spec.max_restarts = 2;
  options.run_log_dir = (dir.path() / "logs").string();
  options.hostname = "testhost";
  options.stop_grace = std::chrono::seconds(2);
  options.status.port = 0;

  Agent* agent_ptr = nullptr;
  std::string status, metrics, readyz;
  std::uint16_t served_on = 0;
  FakeEventLoop launcher;
  // Attempt 0: local rank 1 fails (rank 0 is stopped). Attempt 1: once both
  // run, the live view is read; then both succeed.
  launcher.on_launch = [&](FakeEventLoop& l, const FakeEventLoop::Launch& launch) {
    const int restart = std::stoi(launch.env.at("TORCHELASTIC_RESTART_COUNT"));
    const int local_rank = std::stoi(launch.env.at("LOCAL_RANK"));
    if (restart == 0 && local_rank == 1) l.exit(launch.pid, 3);
    if (restart == 1 && local_rank == 1) {
      const auto port = agent_ptr->status_port();
      ASSERT_TRUE(port.has_value());
      served_on = *port;
      status = http_get(*port, "/status");
      metrics = http_get(*port, "/metrics");
      readyz = http_get(*port, "/readyz");
      for (const auto& l2 : l.launches()) {
        if (std::stoi(l2.env.at("TORCHELASTIC_RESTART_COUNT")) == 1) l.exit(l2.pid, 0);
      }
    }
  };
  Agent agent(options, *rdzv, launcher);
  agent_ptr = &agent;
  EXPECT_FALSE(agent.status_port().has_value());  // before run()
  EXPECT_EQ(agent.run(), 0);

  ASSERT_TRUE(status.starts_with("HTTP/1.1 200")) << status;
  const auto doc = nlohmann::json::parse(body_of(status));
  EXPECT_EQ(doc["run_id"], "live");
  EXPECT_EQ(doc["state"], "running");
  EXPECT_EQ(doc["round"]["number"], 1);
  // The n of the round's attempt_<n> log folder, which its workers' error files are in.
  EXPECT_EQ(doc["round"]["attempt"], 1);
  for (const auto& launch : launcher.launches()) {
    if (launch.env.at("TORCHELASTIC_RESTART_COUNT") == "1") {
      EXPECT_NE(launch.env.at("TORCHELASTIC_ERROR_FILE").find("/attempt_1/"), std::string::npos)
          << launch.env.at("TORCHELASTIC_ERROR_FILE");
    }
  }
  EXPECT_EQ(doc["restarts"]["spent"], 1);
  EXPECT_EQ(doc["restarts"]["by_cause"]["worker_failure"], 1);
  EXPECT_EQ(doc["restarts"]["by_cause"]["node_lost"], 0);
  EXPECT_EQ(doc["worker_exits"]["failed"], 1);
  EXPECT_EQ(doc["worker_exits"]["stopped"], 1);  // rank 0, SIGTERMed for the restart
  std::vector<std::string> kinds;
  for (const auto& e : doc["events"]) kinds.push_back(e["kind"]);
  EXPECT_EQ(kinds,
            (std::vector<std::string>{"round_formed", "worker_failed", "restart", "round_formed"}));
  EXPECT_EQ(doc["members"].size(), 1u);
  EXPECT_EQ(doc["members"][0]["state"], "self");
  EXPECT_EQ(doc["members"][0]["ranks"], nlohmann::json({0, 1}));
  EXPECT_NE(metrics.find("ddprun_restarts_total{cause=\"worker_failure\"} 1\n"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("ddprun_worker_exits_total{reason=\"failed\"} 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("ddprun_round 1\n"), std::string::npos);
  EXPECT_TRUE(readyz.starts_with("HTTP/1.1 200")) << readyz;
  // The endpoint went with run(): its port is closed.
  EXPECT_FALSE(agent.status_port().has_value());
  ASSERT_NE(served_on, 0);
  EXPECT_EQ(http_get(served_on, "/livez"), "");
}

TEST(AgentLiveView, APortInUseIsAClearErrorAndNothingStarts) {
  ::ddp::test::TempDir dir("ddp-agent-live-view");
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  RendezvousParams params;
  RendezvousStore rs(std::make_shared<MemoryStore>());
  auto rdzv = make_static_rendezvous(params, rs);
  AgentOptions options;
  options.spec.argv = {"/bin/worker"};
  options.run_log_dir = (dir.path() / "logs").string();
  options.status.port = ntohs(addr.sin_port);
  FakeEventLoop launcher;
  Agent agent(options, *rdzv, launcher);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(agent.run(), 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("cannot serve the live view (--status_port)"), std::string::npos) << err;
  EXPECT_NE(err.find("127.0.0.1:" + std::to_string(ntohs(addr.sin_port))), std::string::npos)
      << err;
  EXPECT_TRUE(launcher.launches().empty());
  ::close(fd);
}

}  // namespace
}  // namespace ddp::agent
