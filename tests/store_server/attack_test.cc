// The store server under attack, in-process and small enough for ctest (a few
// seconds): idle half-open connections, a client sending garbage at full speed
// and a client pipelining gets of a large value without reading the replies, all
// at once. Honest TcpStore clients must keep working (every operation done in
// time, no error) and the server's memory must stay bounded: the replies the
// pipelining client never reads may not pile up without limit.
//
// `store_bench --attack` runs the full-size version against the daemon; both use
// the same attackers (bench/store/attackers.h, included by its path because the
// benchmark and this test share it and neither owns the other).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../../bench/store/attackers.h"
#include "ddp/common/error.h"
#include "ddp/store_server/store_server.h"
#include "ddp/store/tcp_store.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// This process's resident memory in MiB (/proc/self/status, VmRSS).
double rss_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  }
  ADD_FAILURE() << "no VmRSS line in /proc/self/status";
  return 0;
}

constexpr int kIdleConnections = 200;
constexpr int kHonestClients = 8;
constexpr int kHonestRounds = 200;  // each a set and a get
// The pipelining client's value and how many gets of it it sends: 2 GiB of
// replies asked for, all in about 8 KiB of requests. A server that answers every
// frame it has read, whatever its queue already holds, goes far past the bound
// below; bounding the gets bounds what such a server can take from the machine
// (unbounded, one grew by 16 GiB in seconds).
constexpr std::size_t kValueBytes = 8 << 20;
constexpr std::uint64_t kPipelinedGets = 256;
// What this process (server and clients) may grow by under the attack: the
// stored value, the attacker's own copies of it while it sets it, the bounded
// output queue of one connection (PROTOCOL.md states the limit), socket and
// session buffers, with a wide margin.
constexpr double kRssGrowthBoundMib = 512;
// Far above the bound: the pipelining client stops sending here (a backstop; the
// bounded number of gets is what really limits a server without an output bound).
constexpr double kSafetyStopMib = 3072;

TEST(StoreAttack, HonestClientsKeepWorkingAndServerMemoryStaysBounded) {
  StoreServerOptions server_options;
  server_options.port = 0;
  StoreServer server(server_options);
  server.start();
  const std::uint16_t port = server.port();

  TcpStoreOptions client_options;
  client_options.port = port;
  client_options.connect_timeout = 10s;
  client_options.timeout = 10s;
  std::vector<std::unique_ptr<TcpStore>> honest;
  for (int i = 0; i < kHonestClients; ++i) honest.push_back(std::make_unique<TcpStore>(client_options));

  const double rss_before = rss_mib();
  std::atomic<bool> sampling{true};
  std::atomic<double> rss_peak{rss_before};
  std::atomic<bool> safety_stop{false};
  std::unique_ptr<attack::PipeliningClient> pipelining;
  std::atomic<attack::PipeliningClient*> to_abort{nullptr};
  std::thread sampler([&] {
    while (sampling.load()) {
      const double rss = rss_mib();
      if (rss > rss_peak.load()) rss_peak.store(rss);
      if (rss - rss_before > kSafetyStopMib && !safety_stop.exchange(true)) {
        if (auto* p = to_abort.load()) p->abort();
      }
      std::this_thread::sleep_for(2ms);
    }
  });

  attack::IdleConnections idle;
  std::optional<attack::GarbageClient> garbage;
  std::string setup_error;
  try {
    idle.open(port, kIdleConnections);
    // Bounded by count as well as by the test's end (stop() below).
    garbage.emplace(port, 20000);
    pipelining = std::make_unique<attack::PipeliningClient>(port, kValueBytes, kPipelinedGets);
    to_abort.store(pipelining.get());
  } catch (const std::exception& e) {
    setup_error = e.what();
  }
  EXPECT_EQ(setup_error, "");
  // Let the unread replies pile up before the honest clients start.
  std::this_thread::sleep_for(300ms);

  // Honest clients, one thread each, under the attack.
  std::vector<std::string> errors(kHonestClients);
  std::vector<int> done(kHonestClients, 0);
  const auto honest_begin = Clock::now();
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < kHonestClients; ++i) {
      threads.emplace_back([&, i] {
        try {
          for (int k = 0; k < kHonestRounds; ++k) {
            const std::string key = "honest/" + std::to_string(i) + "/" + std::to_string(k % 8);
            const std::string value = std::to_string(k);
            honest[i]->set(key, value);
            if (honest[i]->get(key) != value) throw std::runtime_error("read back a different value");
            ++done[i];
          }
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  const auto honest_elapsed = Clock::now() - honest_begin;

  const std::uint64_t gets_sent = pipelining ? pipelining->gets_sent() : 0;
  const std::size_t garbage_connections = garbage ? garbage->connections() : 0;
  to_abort.store(nullptr);
  pipelining.reset();
  if (garbage) garbage->stop();
  idle.close_all();
  sampling.store(false);
  sampler.join();
  const double growth = rss_peak.load() - rss_before;

  for (int i = 0; i < kHonestClients; ++i) {
    EXPECT_EQ(errors[i], "") << "honest client " << i << " failed after " << done[i] << " rounds";
    EXPECT_EQ(done[i], kHonestRounds) << "honest client " << i;
  }
  // Generous: on an idle machine this takes well under a second.
  EXPECT_LT(honest_elapsed, 15s) << "honest clients took "
                                 << std::chrono::duration<double>(honest_elapsed).count() << " s";
  EXPECT_FALSE(safety_stop.load()) << "RSS grew past " << kSafetyStopMib
                                   << " MiB; the pipelining client was stopped early";
  EXPECT_LT(growth, kRssGrowthBoundMib)
      << "the server process grew by " << growth << " MiB (from " << rss_before << " MiB) while a client "
      << "pipelined " << gets_sent << " gets of a " << (kValueBytes >> 20) << " MiB value without reading";
  // The attack ran: the attackers got through to the server.
  EXPECT_GT(gets_sent, 0u);
  EXPECT_GT(garbage_connections, 0u);

  // The server still serves, and every attacker's connection goes away.
  TcpStore after(client_options);
  after.set("after", "ok");
  EXPECT_EQ(after.get("after"), "ok");
  honest.clear();
  const auto deadline = Clock::now() + 10s;
  while (server.num_clients() > 1 && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server.num_clients(), 1u) << "connections the server still holds after every attacker closed";
  server.stop();
  std::printf("[ info ] rss before %.1f MiB, peak growth %.1f MiB; %llu gets pipelined, %zu garbage "
              "connections, honest clients %.2f s\n",
              rss_before, growth, static_cast<unsigned long long>(gets_sent), garbage_connections,
              std::chrono::duration<double>(honest_elapsed).count());
}

}  // namespace
}  // namespace ddp
