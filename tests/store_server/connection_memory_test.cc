// What each connection costs the ddp-rendezvous daemon in memory: a program
// of its own, built and run only without sanitizers (UNSANITIZED in
// CMakeLists.txt), whose allocators add redzones and shadow memory to every
// allocation.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "daemon_process.h"
#include "server_test_util.h"

namespace ddp {
namespace {

using namespace ddp::test;

std::string daemon_path() {
  const char* bin = std::getenv("DDP_BUILD_BIN");
  std::filesystem::path dir = bin != nullptr
                                  ? std::filesystem::path(bin)
                                  : std::filesystem::read_symlink("/proc/self/exe").parent_path();
  return (dir / "ddp-rendezvous").string();
}

// Connects `n` more clients to `port`, each setting a key of its own, as the
// clients of a rendezvous do.
void connect_clients(std::vector<std::unique_ptr<TcpStore>>& clients, std::uint16_t port, int n) {
  for (int i = 0; i < n; ++i) {
    clients.push_back(std::make_unique<TcpStore>(client_options(port)));
    clients.back()->set("client/" + std::to_string(clients.size()), "1");
  }
}

// A connection that completed its handshake and set a key costs the daemon
// about 2.5 KiB (its session with a 512-byte read buffer, its retry record,
// the socket's reactor state, the key). Sessions used to allocate a 4 KiB read
// buffer up front, 6 KiB a connection in all: 590 MiB at 98,304 clients.
TEST(ConnectionMemory, EachConnectionCostsTheDaemonLessThan4KiB) {
  constexpr int kWarmUp = 200;
  constexpr int kMeasured = 2000;
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < kWarmUp + kMeasured + 256) {
    GTEST_SKIP() << "the open-file limit (" << limit.rlim_max << ") is below "
                 << kWarmUp + kMeasured + 256;
  }
  limit.rlim_cur = limit.rlim_max;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &limit), 0);
  DaemonProcess daemon(daemon_path());
  std::vector<std::unique_ptr<TcpStore>> clients;
  // The first connections grow what every one shares (hash tables, the
  // allocator's arena): measured from after them.
  connect_clients(clients, daemon.port(), kWarmUp);
  const auto before = daemon.status_mib("VmRSS");
  ASSERT_TRUE(before.has_value());
  connect_clients(clients, daemon.port(), kMeasured);
  const auto after = daemon.status_mib("VmRSS");
  ASSERT_TRUE(after.has_value());
  const double per_connection_kib = (*after - *before) * 1024.0 / kMeasured;
  EXPECT_LT(per_connection_kib, 4.0) << "the daemon grew from " << *before << " MiB to " << *after
                                     << " MiB for " << kMeasured << " connections";
  EXPECT_GT(per_connection_kib, 0.0) << "no growth measured: is VmRSS read from the daemon?";
  clients.clear();
  daemon.stop();
  EXPECT_EQ(daemon.exit_status(), 0) << daemon.log_tail();
}

}  // namespace
}  // namespace ddp
