// rendezvous_bench: how the c10d rendezvous (rendezvous/src/dynamic_rendezvous.h)
// scales, on the built-in store and on etcd, and how it compares with torchrun's,
// in one run. One line per measurement on stdout; progress, details, targets and
// errors go to stderr. Order: for each N, the built-in store's "rendezvous
// agents=N" line, then etcd's; then real_agents, then node_loss (built-in, then etcd).
//
//   rendezvous agents=<N> round_s=<t> reform_s=<t>
//     N simulated agents against the real store daemon (ddp-rendezvous, a child
//     process on a free loopback port). Every agent is a DynamicRendezvous with a
//     TcpStore connection of its own; they live in --processes forked processes,
//     each driving its agents from --threads threads through begin_join() and
//     step(), as join() does (without its keep-alive thread, which
//     thousands of agents in one process cannot afford). A thread steps its
//     agents, then blocks on R/closed (R = rdzv/<run id>/round_<r>) and steps
//     them again; the thread that holds the round's decider (arrival 0, named by
//     R/rec_0) first steps that one each time the last expected record
//     R/rec_<n-1> appears, or every 20 ms.
//     round_s: from the start signal (every connection already open; one pipe
//     write per process) until every agent has its info.
//     reform_s: one agent (group rank N/2) dies without leaving; the round is
//     ended for the others as its watcher would end it (R/end = "lost <rank>
//     <member>"), and the N-1 survivors join the next round: time from the
//     start signal until all of them have their info.
//     The handlers use min_nodes = 1, max_nodes = N and a last call of 10
//     minutes: the first round closes when all N arrived (as with min = max =
//     N), the re-formed one as soon as every survivor arrived, without last call.
//     Every agent's info is checked (group ranks 0..n-1 each once, the same
//     world size, round and master); an inconsistency fails the run.
//
//   rendezvous agents=<N> store=etcd round_s=<t>
//     The same first round, driven the same way (the same agent processes and
//     drive()), with every agent a DynamicRendezvous over an EtcdStore of its
//     own (the leases path: each agent puts its keep-alive key on a lease of
//     its own and, once it has its info, watches its neighbour's key; each
//     blocking get/wait opens its own connection to etcd) on a fresh
//     single-member etcd (--etcd, default /usr/bin/etcd) that the bench starts for
//     each N on free loopback ports with a temporary data dir (default fsync; its
//     log level warn), as tests/support/etcd_cluster.h starts the tests' etcd:
//     it is killed and its dir removed when the measurement ends, fails or times
//     out, and also when the bench dies (etcd dies with it, and a process of
//     the cluster's own removes the dir). No agent refreshes its lease (no keep-alive
//     threads, as above): the leases' TTL (30 minutes) outlives the round. No
//     reform_s. Default N: 8, 64, 512, 2048 (--etcd-agents); stderr gives etcd's
//     CPU seconds during the round. Target (stderr): 512 agents within 3 s.
//
//   real_agents=<N> ddprun_s=<a> torchrun_s=<b>
//     N real launchers started at once on one loopback endpoint (--nnodes=N
//     --nproc_per_node=1 --rdzv_backend=c10d --no_python /bin/true): wall time
//     until all N exited 0; the first to bind the endpoint hosts the store.
//     torchrun is /usr/bin/torchrun run by /usr/bin/python3 (torch 1.13), with
//     --monitor_interval=0.1 (its default of 5 s would be most of its time;
//     ddprun does not poll) and launch_bench's sitecustomize.py fix (Debian's
//     torch 1.13 cannot parse its own -r/-t defaults on Python 3.11). "n/a":
//     torchrun is missing; "failed": see stderr. --real-runs R: the median of R
//     runs of each.
//
//   node_loss dead_after_s=<interval x attempts> detect_s=<d> running_s=<r>
//     3 real ddprun agents (--nnodes=2:3) whose workers announce themselves
//     (<dir>/w<WORLD_SIZE>_a<restart>_r<RANK>_p<agent pid>_<pid>) and run until <dir>/finish
//     exists. Once the 3-node round runs, an agent that does not host the store
//     is SIGKILLed: detect_s is the time until a survivor logs "was lost" on
//     stderr, running_s the time until both workers of the re-formed 2-node
//     round started. At the default keep-alives (5 s x 3) and at
//     keep_alive_interval=0.5,keep_alive_max_attempt=2.
//
//   node_loss store=etcd detect_s=<d> running_s=<r>
//     The same with --rdzv_backend=etcd --rdzv_endpoint=<a fresh single-member
//     etcd, as above> --local_addr=127.0.0.1 and
//     keep_alive_interval=0.5,keep_alive_max_attempt=2 (a lease TTL of 1 s
//     asked, raised by etcd to its minimum): the 3 agents start at once (nobody
//     hosts a store), the third one started is SIGKILLed, whatever its group
//     rank (stderr names its worker's RANK; when it is group rank 0, the
//     re-formed round's workers also move to another node's store). stderr
//     gives the TTLs etcd granted (lease/leases, lease/timetolive) and the
//     target: survivors running within that TTL + 0.5 s of the death.
//
// The etcd lines are skipped, with the reason on stderr, when --no-etcd is given
// or the etcd binary is missing.

// Every process started dies with the bench (PR_SET_PDEATHSIG); launchers run in
// process groups of their own, and on a timeout everything is killed and reaped.
// The scenarios are in simulated.cc, real_launch.cc and node_loss.cc
// (rendezvous_bench.h); this file parses the flags and prints the lines.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "../support/torchrun_fix.h"
#include "etcd_cluster.h"
#include "process_util.h"
#include "rendezvous_bench.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;
using ddp::bench::bench_etcd;
using ddp::bench::Clock;
using ddp::bench::run_node_loss;
using ddp::bench::run_real;
using ddp::bench::run_simulated_builtin;
using ddp::bench::run_simulated_etcd;
using ddp::bench::seconds;
using ddp::bench::SimResult;
using ddp::bench::SimSettings;

// The soft limit on descriptors, raised to the hard one (inherited by every
// child: the daemon and the agent processes hold thousands of connections).
rlim_t raise_fd_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
    ::getrlimit(RLIMIT_NOFILE, &limit);
  }
  return limit.rlim_cur;
}

int ephemeral_ports() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  if (!(in >> low >> high) || high < low) return 28000;
  return high - low + 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> agent_counts{8, 64, 512, 2048, 8192};
  std::vector<int> real_counts{8, 32};
  std::vector<int> etcd_counts{8, 64, 512, 2048};
  std::string node_loss = "on";
  bool quick = false;
  bool no_etcd = false;
  std::string etcd_path = "/usr/bin/etcd";
  SimSettings sim;
  double real_timeout_s = 300;
  int real_runs = 1;
  std::string daemon_path, ddprun_path, torchrun_path = "/usr/bin/torchrun",
                                        python = "/usr/bin/python3";
  CLI::App app{
      "rendezvous_bench: the c10d rendezvous at scale (simulated agents), real ddprun agents next "
      "to "
      "torchrun, and node-loss detection (see the top of bench/rendezvous/rendezvous_bench.cc)"};
  auto* agents_opt =
      app.add_option("--agents", agent_counts, "simulated agent counts, comma-separated (0: none)")
          ->delimiter(',')
          ->check(CLI::Range(0, 100000));
  auto* etcd_opt = app.add_option("--etcd-agents", etcd_counts,
                                  "simulated agent counts on etcd, comma-separated (0: none)")
                       ->delimiter(',')
                       ->check(CLI::Range(0, 100000));
  app.add_flag("--no-etcd", no_etcd,
               "no etcd lines (neither simulated agents nor node loss on etcd)");
  app.add_option("--etcd", etcd_path, "the etcd binary the etcd lines start")
      ->capture_default_str();
  auto* real_opt =
      app.add_option("--real", real_counts, "real agent counts, comma-separated (0: none)")
          ->delimiter(',')
          ->check(CLI::Range(0, 1000));
  auto* loss_opt = app.add_option("--node-loss", node_loss, "measure node-loss detection (on/off)")
                       ->check(CLI::IsMember({"on", "off"}))
                       ->capture_default_str();
  app.add_flag("--quick", quick,
               "a smoke run: --agents 8,64 --etcd-agents 8,64 --real 4 and node loss at the short "
               "keep-alives only (explicit flags win)");
  app.add_option("--processes", sim.processes, "processes holding the simulated agents")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--threads", sim.threads, "threads per process driving the simulated agents")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--timeout", sim.timeout_s,
                 "seconds a simulated round may take before the run fails")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app.add_option("--real-runs", real_runs,
                 "runs of each launcher per real agent count (the median is shown)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--real-timeout", real_timeout_s, "seconds the real agents of one run may take")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app.add_option("--daemon", daemon_path, "the ddp-rendezvous binary (default: next to this one)");
  app.add_option("--ddprun", ddprun_path, "the ddprun binary (default: next to this one)");
  app.add_option("--torchrun", torchrun_path, "torchrun (run by --python)")->capture_default_str();
  app.add_option("--python", python, "the python that runs torchrun")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    if (agents_opt->count() == 0) agent_counts = {8, 64};
    if (etcd_opt->count() == 0) etcd_counts = {8, 64};
    if (real_opt->count() == 0) real_counts = {4};
  }
  (void)loss_opt;
  agent_counts.erase(std::remove(agent_counts.begin(), agent_counts.end(), 0), agent_counts.end());
  etcd_counts.erase(std::remove(etcd_counts.begin(), etcd_counts.end(), 0), etcd_counts.end());
  real_counts.erase(std::remove(real_counts.begin(), real_counts.end(), 0), real_counts.end());

  const auto bench_start = Clock::now();
  ::signal(SIGPIPE, SIG_IGN);
  const rlim_t fds = raise_fd_limit();
  const std::string bin = ddp::test::exe_dir();
  if (daemon_path.empty()) daemon_path = bin + "/ddp-rendezvous";
  if (ddprun_path.empty()) ddprun_path = bin + "/ddprun";
  std::string load;
  std::getline(std::ifstream("/proc/loadavg") >> std::ws, load);
  fmt::print(
      stderr,
      "rendezvous_bench: {} hardware thread(s), load average {}, open-file limit {}, {} agent "
      "process(es) x {} thread(s)\n",
      std::thread::hardware_concurrency(),
      load.substr(0, load.find(' ', load.find(' ', load.find(' ') + 1) + 1)),
      static_cast<unsigned long long>(fds), sim.processes, sim.threads);
  int failures = 0;
  // etcd: why its lines are skipped ("": they are not).
  std::string no_etcd_why;
  if (no_etcd) {
    no_etcd_why = "--no-etcd";
  } else if (::access(etcd_path.c_str(), X_OK) != 0) {
    no_etcd_why = fmt::format(
        "{} is missing or not executable (install etcd, or name it with --etcd)", etcd_path);
  }
  if (!no_etcd_why.empty() && !no_etcd) {
    fmt::print(stderr, "rendezvous_bench: the store=etcd lines are skipped: {}\n", no_etcd_why);
  }

  // 1. Simulated agents: for each N, the built-in store's line, then etcd's.
  std::vector<int> all_counts = agent_counts;
  if (no_etcd_why.empty())
    all_counts.insert(all_counts.end(), etcd_counts.begin(), etcd_counts.end());
  std::sort(all_counts.begin(), all_counts.end());
  all_counts.erase(std::unique(all_counts.begin(), all_counts.end()), all_counts.end());
  std::optional<double> etcd_512_s;
  for (int n : all_counts) {
    const bool builtin =
        std::find(agent_counts.begin(), agent_counts.end(), n) != agent_counts.end();
    const bool on_etcd = no_etcd_why.empty() &&
                         std::find(etcd_counts.begin(), etcd_counts.end(), n) != etcd_counts.end();
    // The built-in store's line (the daemon, one TcpStore per agent).
    auto builtin_line = [&] {
      if (n < 2) {
        fmt::print(stderr, "rendezvous agents={}: skipped: a re-form needs at least 2 agents\n", n);
        return;
      }
      if (static_cast<rlim_t>(n) + 64 > fds) {
        fmt::print(
            stderr,
            "rendezvous agents={}: skipped: the daemon needs {} descriptors, the limit is {}\n", n,
            n + 64, static_cast<unsigned long long>(fds));
        return;
      }
      if (n + 1000 > ephemeral_ports()) {
        fmt::print(stderr, "rendezvous agents={}: skipped: only {} ephemeral ports on this host\n",
                   n, ephemeral_ports());
        return;
      }
      try {
        const SimResult r = run_simulated_builtin(n, sim, daemon_path);
        fmt::print("rendezvous agents={} round_s={:.4f} reform_s={:.4f}\n", n, r.round_s,
                   r.reform_s);
        std::fflush(stdout);
      } catch (const std::exception& e) {
        ++failures;
        fmt::print(stderr, "rendezvous agents={}: FAILED: {}\n", n, e.what());
      }
    };
    if (builtin) builtin_line();
    if (!on_etcd) continue;
    if (n < 2) {
      fmt::print(stderr,
                 "rendezvous agents={} store=etcd: skipped: a round needs at least 2 agents\n", n);
      continue;
    }
    // etcd holds an agent's unary connection, its death watch and the blocking
    // waits of the drivers; an agent process as many for its agents.
    if (static_cast<rlim_t>(2 * n) + 256 > fds) {
      fmt::print(stderr,
                 "rendezvous agents={} store=etcd: skipped: etcd needs about {} descriptors, the "
                 "limit is {}\n",
                 n, 2 * n + 256, static_cast<unsigned long long>(fds));
      continue;
    }
    if (2 * n + 1000 > ephemeral_ports()) {
      fmt::print(stderr,
                 "rendezvous agents={} store=etcd: skipped: only {} ephemeral ports on this host\n",
                 n, ephemeral_ports());
      continue;
    }
    try {
      const SimResult r = run_simulated_etcd(n, sim, etcd_path);
      fmt::print("rendezvous agents={} store=etcd round_s={:.4f}\n", n, r.round_s);
      std::fflush(stdout);
      if (n == 512) etcd_512_s = r.round_s;
    } catch (const std::exception& e) {
      ++failures;
      fmt::print(stderr, "rendezvous agents={} store=etcd: FAILED: {}\n", n, e.what());
    }
  }
  if (etcd_512_s) {
    fmt::print(stderr, "target: 512 agents in one round on etcd within 3 s: {} ({:.3f} s)\n",
               *etcd_512_s <= 3.0 ? "met" : "NOT met", *etcd_512_s);
  }

  // 2. Real agents.
  if (!real_counts.empty()) {
    std::optional<ddp::test::TempDir> site;
    const bool have_torchrun =
        fs::exists(torchrun_path) && fs::exists(python) &&
        std::system((python + " -c 'import torch.distributed.run' >/dev/null 2>&1").c_str()) == 0;
    if (have_torchrun) {
      site.emplace("rdzv-bench-site");
      std::ofstream(site->path() / "sitecustomize.py") << ddp::bench::kTorchrunSiteCustomize;
    } else {
      fmt::print(stderr, "real agents: {} (or torch under {}) is missing: torchrun_s=n/a\n",
                 torchrun_path, python);
    }
    for (int n : real_counts) {
      std::string why;
      std::string ddprun_s = "failed", torchrun_s = have_torchrun ? "failed" : "n/a";
      // The median of --real-runs runs, or nullopt when one failed.
      auto measure = [&](const std::vector<std::string>& launcher,
                         const std::map<std::string, std::string>& env,
                         const std::string& name) -> std::optional<double> {
        std::vector<double> times;
        for (int run = 0; run < real_runs; ++run) {
          auto t = run_real(n, launcher, env, name, real_timeout_s, &why);
          if (!t) {
            ++failures;
            fmt::print(stderr, "real_agents={}: {} FAILED: {}\n", n, name, why);
            return std::nullopt;
          }
          times.push_back(*t);
        }
        if (real_runs > 1) {
          fmt::print(stderr, "  real_agents={} {}: {:.3f} s\n", n, name, fmt::join(times, " s, "));
        }
        std::sort(times.begin(), times.end());
        const std::size_t m = times.size() / 2;
        return times.size() % 2 ? times[m] : (times[m - 1] + times[m]) / 2;
      };
      if (auto t = measure({ddprun_path}, {}, "ddprun")) ddprun_s = fmt::format("{:.3f}", *t);
      if (have_torchrun) {
        if (auto t = measure({python, torchrun_path, "--monitor_interval=0.1"},
                             {{"PYTHONPATH", site->path().string()}}, "torchrun")) {
          torchrun_s = fmt::format("{:.3f}", *t);
        }
      }
      fmt::print("real_agents={} ddprun_s={} torchrun_s={}\n", n, ddprun_s, torchrun_s);
      std::fflush(stdout);
    }
  }

  // 3. Node loss.
  if (node_loss == "on") {
    struct Setting {
      std::string conf;
      double dead_after_s;
    };
    std::vector<Setting> settings;
    if (!quick) settings.push_back({"", 5.0 * 3});
    settings.push_back({"keep_alive_interval=0.5,keep_alive_max_attempt=2", 0.5 * 2});
    for (const auto& s : settings) {
      std::string why;
      try {
        if (auto r = run_node_loss(ddprun_path, s.conf, s.dead_after_s, nullptr, &why)) {
          fmt::print("node_loss dead_after_s={:g} detect_s={:.3f} running_s={:.3f}\n",
                     s.dead_after_s, r->detect_s, r->running_s);
          std::fflush(stdout);
          continue;
        }
      } catch (const std::exception& e) {
        why = e.what();
      }
      ++failures;
      fmt::print(stderr, "node_loss dead_after_s={:g}: FAILED: {}\n", s.dead_after_s, why);
    }
    // On etcd: liveness by leases (a TTL of ceil(0.5 x 2) = 1 s asked, raised by etcd to its minimum).
    if (no_etcd_why.empty()) {
      std::string why;
      try {
        ddp::test::EtcdCluster etcd(bench_etcd(etcd_path));
        if (auto r = run_node_loss(ddprun_path, "keep_alive_interval=0.5,keep_alive_max_attempt=2",
                                   1.0, &etcd, &why)) {
          fmt::print("node_loss store=etcd detect_s={:.3f} running_s={:.3f}\n", r->detect_s,
                     r->running_s);
          std::fflush(stdout);
          if (r->granted_ttls.empty()) {
            fmt::print(stderr,
                       "  node_loss store=etcd: could not learn the leases' TTL from etcd; target: "
                       "survivors "
                       "running within the lease TTL + 0.5 s: not judged (running_s {:.3f})\n",
                       r->running_s);
          } else {
            const auto ttl = *std::max_element(r->granted_ttls.begin(), r->granted_ttls.end());
            fmt::print(stderr,
                       "  node_loss store=etcd: etcd granted the {} agents' leases TTL(s) of {} s "
                       "(asked: 1 s)\n",
                       r->granted_ttls.size(), fmt::join(r->granted_ttls, ", "));
            fmt::print(stderr,
                       "target: survivors running within the lease TTL + 0.5 s = {:.1f} s of the "
                       "death: {} "
                       "({:.3f} s)\n",
                       static_cast<double>(ttl) + 0.5,
                       r->running_s <= static_cast<double>(ttl) + 0.5 ? "met" : "NOT met",
                       r->running_s);
          }
        } else {
          ++failures;
          fmt::print(stderr, "node_loss store=etcd: FAILED: {}\n  etcd log (last lines):\n{}\n",
                     why, etcd.log_tail(0, 2000));
        }
      } catch (const std::exception& e) {
        ++failures;
        fmt::print(stderr, "node_loss store=etcd: FAILED: {}\n", e.what());
      }
    }
  }

  fmt::print(stderr, "rendezvous_bench: done in {:.1f} s{}\n", seconds(Clock::now() - bench_start),
             failures ? fmt::format(", {} measurement(s) FAILED", failures) : "");
  return failures ? 1 : 0;
}
