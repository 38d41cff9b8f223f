// The live views against clients that never read, in real time (about 20 s
// each, label `slow`): 70 clients pipelining GET / without reading (each
// connecting again whenever it is closed) must not keep a scraper from any
// answer. Once on the agent's endpoint (StatusEndpoint, as ddprun serves it)
// and once on `ddp-rendezvous --status-port` (a real process). The server's
// own tests (tests/status_http) check the same with short deadlines; these
// run the endpoints with the deadlines users get.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>

#include "daemon_process.h"
#include "ddp/common/time.h"
#include "http_attackers.h"
#include "job_status.h"
#include "status_endpoint.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
namespace attack = test::http_attack;

constexpr int kAttackers = 70;  // more than the 64 connections a live view holds
constexpr auto kAttack = 20s;
constexpr auto kScrapePeriod = 1s;
// A scrape's own limit: generous (the machine may be loaded); an answered
// scrape takes milliseconds.
constexpr auto kScrapeTimeout = 5s;

// 20 s of attack with a scrape a second; every scrape must be answered.
void expect_every_scrape_answered(std::uint16_t port) {
  attack::PipeliningNonReaders attackers(port, kAttackers, "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                                         kAttack + 30s);
  // The attack under way: every attacker connected once at least.
  const auto patience = Clock::now() + 10s;
  while (attackers.connections() < kAttackers && Clock::now() < patience) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_GE(attackers.connections(), static_cast<std::uint64_t>(kAttackers));
  std::this_thread::sleep_for(2s);  // the slots filled and the first deadlines passed
  const auto log =
      attack::scrape_every(port, "/metrics", "", kScrapePeriod, kAttack, kScrapeTimeout);
  attackers.stop();
  EXPECT_EQ(log.answered, log.asked) << log.failures;
  EXPECT_GE(log.asked, 20);
  // The attackers were closed and came back throughout, and sent all along.
  EXPECT_GT(attackers.closed_by_server(), static_cast<std::uint64_t>(kAttackers));
  ::testing::Test::RecordProperty("slowest_scrape_ms", static_cast<int>(log.slowest.count()));
  ::testing::Test::RecordProperty("attacker_connections",
                                  static_cast<int>(attackers.connections()));
  std::printf("%d of %d scrapes answered (slowest %lld ms) during %llu attacker connections\n",
              log.answered, log.asked, static_cast<long long>(log.slowest.count()),
              static_cast<unsigned long long>(attackers.connections()));
}

TEST(LiveViewLockout, AgentEndpointAnswersEveryScrapeThrough20sOf70PipeliningNonReaders) {
  agent::JobBoard board(real_runtime());
  agent::StatusOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  agent::StatusEndpoint endpoint(options, "", board, std::chrono::minutes(1));
  expect_every_scrape_answered(endpoint.port());
}

// DDP_BUILD_BIN names the bin folder (tests and binaries share build/bin).
std::string daemon_path() {
  const char* bin = std::getenv("DDP_BUILD_BIN");
  return std::string(bin != nullptr && *bin != '\0' ? bin : "build/bin") + "/ddp-rendezvous";
}

TEST(LiveViewLockout, DaemonEndpointAnswersEveryScrapeThrough20sOf70PipeliningNonReaders) {
  test::DaemonProcess daemon(daemon_path(), {"--status-port", "0"});
  // The daemon logs "live view at http://127.0.0.1:PORT/".
  const std::regex url("live view at http://127\\.0\\.0\\.1:([0-9]+)/");
  std::smatch match;
  std::string log;
  const auto patience = Clock::now() + 10s;
  while (!std::regex_search(log = daemon.log_tail(), match, url) && Clock::now() < patience) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(std::regex_search(log, match, url)) << log;
  expect_every_scrape_answered(static_cast<std::uint16_t>(std::stoi(match[1].str())));
  EXPECT_EQ(daemon.stop(), "exited with status 0") << daemon.log_tail();
}

}  // namespace
}  // namespace ddp
