// rendezvous_bench's node loss (see rendezvous_bench.cc for what it
// measures): 3 real ddprun agents (--nnodes=2:3) whose workers announce
// themselves in files, one of them SIGKILLed once the 3-node round runs; the
// time until a survivor logs the loss and until the re-formed round's workers
// run. On the built-in store (one agent hosts it) or on a fresh etcd.
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "etcd_cluster.h"
#include "net_util.h"
#include "process_util.h"
#include "rendezvous_bench.h"
#include "temp_dir.h"

namespace ddp::bench {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Every agent leads a process group of its own (so that its workers go with
// it) and dies with the bench.
constexpr test::SpawnOptions kAgent{.own_group = true, .die_with_parent = true};

int count_files(const fs::path& dir, const std::string& prefix) {
  int n = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) ++n;
  }
  return n;
}

}  // namespace

std::optional<NodeLoss> run_node_loss(const std::string& ddprun, const std::string& conf,
                                      double dead_after_s, const test::EtcdCluster* etcd,
                                      std::string* why) {
  test::TempDir dir("rdzv-bench-loss");
  const fs::path workers = dir.path() / "w";
  fs::create_directories(workers);
  const fs::path script = dir.path() / "worker.sh";
  std::ofstream(script)
      << "#!/bin/sh\n"
         "# rendezvous_bench's node-loss worker: announce, then run until $1/finish exists\n"
         ": > \"$1/w${WORLD_SIZE}_a${TORCHELASTIC_RESTART_COUNT}_r${RANK}_p${PPID}_$$\"\n"
         "while [ ! -e \"$1/finish\" ]; do sleep 0.1; done\n";
  const std::uint16_t port = etcd ? 0 : test::free_port();
  std::vector<std::string> argv{ddprun, "--nnodes=2:3", "--nproc_per_node=1"};
  if (etcd) {
    for (const std::string& a :
         {std::string("--rdzv_backend=etcd"), "--rdzv_endpoint=" + etcd->endpoints(),
          std::string("--local_addr=127.0.0.1"), std::string("--rdzv_id=nodeloss-etcd")}) {
      argv.push_back(a);
    }
  } else {
    for (const std::string& a :
         {std::string("--rdzv_backend=c10d"), fmt::format("--rdzv_endpoint=127.0.0.1:{}", port),
          std::string("--rdzv_id=nodeloss")}) {
      argv.push_back(a);
    }
  }
  if (!conf.empty()) argv.push_back("--rdzv_conf=" + conf);
  for (const std::string& a :
       {std::string("--no_python"), std::string("/bin/sh"), script.string(), workers.string()}) {
    argv.push_back(a);
  }
  const auto env = test::environment_with();
  std::vector<test::Child> agents;
  agents.reserve(3);
  test::ChildrenGuard guard{agents};
  auto stderr_of_all = [&] { return test::stderr_of(agents, 800); };
  auto start_agent = [&] {
    const std::size_t i = agents.size();
    agents.push_back(test::spawn(argv, env, dir.path(), fmt::format("agent{}", i), kAgent));
  };
  // Polls every 2 ms (the precision of detect_s and running_s), reaping the
  // agents that ended meanwhile.
  auto eventually = [&](const std::function<bool()>& ready, std::chrono::milliseconds timeout) {
    return test::eventually(
        [&] {
          test::poll_children(agents);
          return ready();
        },
        timeout, 2ms);
  };
  // The store host first (the first to bind the endpoint hosts it); on etcd
  // nobody hosts it.
  start_agent();
  if (!etcd && !eventually([&] { return test::port_listens(port); }, 30s)) {
    *why = "the first agent did not host the store within 30 s:\n" + stderr_of_all();
    return std::nullopt;
  }
  start_agent();
  start_agent();
  if (!eventually([&] { return count_files(workers, "w3_") >= 3; }, 60s)) {
    *why = "the 3 agents did not start a 3-node round within 60 s:\n" + stderr_of_all();
    return std::nullopt;
  }
  NodeLoss result;
  if (etcd) result.granted_ttls = etcd->granted_ttls();
  test::Child& victim = agents[2];
  {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(workers, ec)) {
      const std::string f = entry.path().filename().string();
      if (f.rfind("w3_", 0) == 0 && f.find(fmt::format("_p{}_", victim.pid)) != std::string::npos) {
        fmt::print(stderr, "  node_loss{}: SIGKILL the agent whose worker is {}\n",
                   etcd ? " store=etcd" : "", f);
      }
    }
  }
  const auto killed = Clock::now();
  ::kill(victim.pid, SIGKILL);
  std::optional<Clock::time_point> detected, running;
  const auto limit =
      std::chrono::milliseconds(static_cast<std::int64_t>(dead_after_s * 1000 * 3)) + 60s;
  eventually(
      [&] {
        if (!detected) {
          for (int i = 0; i < 2; ++i) {
            const std::string err = test::read_text(agents[static_cast<std::size_t>(i)].err);
            if (err.find("was lost") != std::string::npos) {
              detected = Clock::now();
            }
          }
        }
        if (!running && count_files(workers, "w2_") >= 2) running = Clock::now();
        return detected && running;
      },
      std::chrono::duration_cast<std::chrono::milliseconds>(limit));
  if (!detected || !running) {
    *why = fmt::format("after the kill: loss {}, re-formed workers {} within {:.0f} s:\n{}",
                       detected ? "logged" : "never logged", running ? "running" : "never running",
                       seconds(limit), stderr_of_all());
    return std::nullopt;
  }
  // The survivors finish their job.
  std::ofstream(workers / "finish") << "done\n";
  const bool all = test::wait_children(agents, Clock::now() + 30s);
  for (int i = 0; i < 2; ++i) {
    const test::Child& c = agents[static_cast<std::size_t>(i)];
    if (!all || !c.ok()) {
      fmt::print(stderr,
                 "  node_loss: note: surviving agent {} did not exit 0 after finishing ({}):\n{}\n",
                 i, c.exit_text(), tail(test::read_text(c.err)));
    }
  }
  result.detect_s = seconds(*detected - killed);
  result.running_s = seconds(*running - killed);
  return result;
}

}  // namespace ddp::bench
