// rendezvous_bench's scenarios, one file each, driven by rendezvous_bench.cc
// (which says what each measures and prints): simulated agents on the
// built-in store and on etcd (simulated.cc), real launchers (real_launch.cc)
// and node loss (node_loss.cc). Each runs one measurement and returns its
// figures, or throws std::runtime_error (the simulated agents) or returns
// nullopt with the reason in `*why` (the real processes); none prints to
// stdout. Every process a scenario starts is killed and reaped before it
// returns, and dies with the bench (PR_SET_PDEATHSIG). Called from the main
// thread, one at a time.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "etcd_cluster.h"

namespace ddp::bench {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The end of `text` for a message: its last `bytes`, after "..." when cut.
inline std::string tail(const std::string& text, std::size_t bytes = 1500) {
  return text.size() <= bytes ? text : "..." + text.substr(text.size() - bytes);
}

// ---- simulated agents (simulated.cc) ----------------------------------------------------------

struct SimSettings {
  int processes = 4;
  int threads = 4;
  double timeout_s = 120;
};

struct SimResult {
  double round_s = 0;
  double reform_s = 0;
};

// The built-in store's lines: the daemon at `daemon_path`, one TcpStore per agent.
SimResult run_simulated_builtin(int n, const SimSettings& s, const std::string& daemon_path);

// The etcd the etcd lines start: one member of `etcd_path` on free loopback
// ports, a temporary data dir, its log level warn.
test::EtcdCluster::Options bench_etcd(const std::string& etcd_path);

// The etcd lines: one round of N agents, each a DynamicRendezvous over an
// EtcdStore of its own, on a fresh etcd.
SimResult run_simulated_etcd(int n, const SimSettings& s, const std::string& etcd_path);

// ---- real launchers (real_launch.cc) ----------------------------------------------------------

// N launchers on one endpoint with a no-op worker: wall time until all exited 0.
std::optional<double> run_real(int n, const std::vector<std::string>& launcher,
                               const std::map<std::string, std::string>& extra_env,
                               const std::string& name, double timeout_s, std::string* why);

// ---- node loss (node_loss.cc) -----------------------------------------------------------------

struct NodeLoss {
  double detect_s = 0;
  double running_s = 0;
  // etcd: the TTLs etcd granted to the agents' leases (empty: not learnt).
  std::vector<std::int64_t> granted_ttls;
};

// 3 agents at --nnodes=2:3; one that does not host the store is SIGKILLed.
// `conf`: --rdzv_conf ("" for the defaults). `etcd`: the agents meet in it
// (--rdzv_backend=etcd) instead of the built-in store one of them hosts.
std::optional<NodeLoss> run_node_loss(const std::string& ddprun, const std::string& conf,
                                      double dead_after_s, const test::EtcdCluster* etcd,
                                      std::string* why);

}  // namespace ddp::bench
