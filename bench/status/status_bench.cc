// status_bench: what the live view costs. Scrape latency of an agent's and the
// daemon's /metrics, side by side with a real etcd's, and the step time of a
// job scraped every 100 ms against the same job not scraped.
//
//   1. agent: ddprun --standalone --nproc_per_node=64 --status_port=0 --no_python
//        ddprun_progress_worker healthy 0 0 --steps 1000000 --step_ms 200
//      Once /status lists 64 ranks that all reported steps, /metrics is scraped
//      --scrapes times with a new TCP connection each (a fresh scraper,
//      Connection: close), then --scrapes times over one kept-alive connection
//      (as Prometheus does). Every response must be 200 and hold
//      ddprun_rank_steps{rank="63".
//   2. daemon: ddp-rendezvous --host 127.0.0.1 --port 0 --status-port 0 with
//      --clients TcpStore clients connected (handshake done); one thread keeps
//      them lightly busy (an add or a set on one of them every millisecond,
//      round-robin) while /metrics is scraped the same two ways. Its body must
//      say ddprun_store_clients >= --clients.
//   3. etcd: the same loops against /metrics of a single-member etcd on
//      loopback (tests/support's EtcdCluster: temporary data directory, stopped
//      at the end), the reference; ratios to it are printed.
//   4. step: ddprun --standalone --nproc_per_node=2 --status_port=0 --no_python
//        status_bench_worker <dir> <steps> <passes>
//      (fixed CPU work per step, then DDP's all-reduce; see step_worker.cc),
//      --repeat runs scraped (/metrics and /status, a new connection each,
//      every --scrape-every-ms) and --repeat runs not scraped, alternating
//      (not, scraped; scraped, not; ...). A run's figure is the mean step time
//      of its ranks (after 5 warm-up steps); with_ms and without_ms are the
//      means over the runs; spread_pct is the larger of the two kinds' run
//      ranges ((max - min) / mean), so an overhead_pct inside it is noise.
//
//   status_bench [--scrapes 500] [--repeat 5] [--only agent,daemon,etcd,step]
//                [--ranks 64] [--clients 1024] [--form-timeout 600]
//                [--step-steps 200] [--step-passes 3000] [--scrape-every-ms 100]
//
// Latency: from before connect() (new) or send() (keep-alive) to the last
// byte of the body, CLOCK_MONOTONIC, the scraper in this process; 5 warm-up
// scrapes are not counted; median and p99 (nearest rank). bytes: the decoded
// body of the last scrape. Each loop also prints the target's CPU time per
// scrape (its threads' schedstat over the loop, minus its rate over 1 s
// without scrapes just before) and how busy the machine's CPUs were.
//
// The five lines (one each, in this form; the daemon's and etcd's keep-alive
// loops, the agent's /status and the ratios to etcd print lines of their own
// around them, as context):
//   scrape target=agent ranks=64 conn=new median_ms=<x> p99_ms=<y> bytes=<n>
//   scrape target=agent ranks=64 conn=keepalive median_ms=<x> p99_ms=<y> bytes=<n>
//   scrape target=daemon clients=1024 conn=new median_ms=<x> p99_ms=<y> bytes=<n>
//   scrape target=etcd conn=new median_ms=<x> p99_ms=<y> bytes=<n>
//   step scrape_every_ms=100 with_ms=<x> without_ms=<y> overhead_pct=<z> spread_pct=<s>
//
// Everything it starts it stops, also on SIGINT/SIGTERM: the jobs (SIGTERM,
// then SIGKILL of the agent's group; workers die with their agent), the
// daemon, etcd, their temporary directories. After each job it checks that
// the agent and every worker /status named are gone. Exit status 1 when a
// part failed or a check did not hold.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "daemon_process.h"
#include "ddp/store/tcp_store.h"
#include "etcd_cluster.h"
#include "http_client.h"
#include "process_util.h"
#include "scrape_client.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;
namespace test = ddp::test;
using ddp::TcpStore;
using ddp::TcpStoreOptions;
using ddp::bench::ScrapeConnection;
using ddp::bench::ScrapeResponse;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int kWarmupScrapes = 5;
constexpr auto kScrapeTimeout = 10s;

std::atomic<bool> g_interrupted{false};

extern "C" void on_signal(int) { g_interrupted = true; }

struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

void check_interrupt() {
  if (g_interrupted) throw Interrupted();
}

// Sleeps `d` in short slices, throwing Interrupted on SIGINT/SIGTERM.
void nap(Clock::duration d) {
  const auto until = Clock::now() + d;
  while (Clock::now() < until) {
    check_interrupt();
    std::this_thread::sleep_for(std::min<Clock::duration>(until - Clock::now(), 50ms));
  }
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Nearest rank: the smallest value with at least p% of the values at or below it.
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// How busy the machine's CPUs were between construction and busy_pct()
// (/proc/stat), and the load averages.
class MachineMeter {
 public:
  MachineMeter() : start_(read()) {}
  double busy_pct() const {
    const Sample now = read();
    const double total = now.total - start_.total;
    return total > 0 ? 100.0 * (1.0 - (now.idle - start_.idle) / total) : 0;
  }
  static std::string loadavg() {
    std::string text = test::read_text("/proc/loadavg");
    const auto third = text.find(' ', text.find(' ', text.find(' ') + 1) + 1);
    return text.substr(0, third);
  }
  static std::string line(const MachineMeter& meter) {
    return fmt::format("machine: cpus={} busy_pct={:.0f} loadavg(1,5,15 min)={}",
                       std::thread::hardware_concurrency(), meter.busy_pct(), loadavg());
  }

 private:
  struct Sample {
    double total = 0;
    double idle = 0;
  };
  static Sample read() {
    std::istringstream in(test::read_text("/proc/stat"));
    std::string cpu;
    in >> cpu;
    Sample s;
    double field = 0;
    for (int i = 0; i < 8 && in >> field; ++i) {  // user nice system idle iowait irq softirq steal
      s.total += field;
      if (i == 3 || i == 4) s.idle += field;
    }
    return s;
  }
  Sample start_;
};

// The CPU time of process `pid`, from its threads' /proc/<pid>/task/*/schedstat
// (nanoseconds). A thread's time stays counted after it exits (its last
// sample is kept), so sample often enough. Where schedstat is missing,
// /proc/<pid>/stat's clock ticks (10 ms).
class CpuMeter {
 public:
  explicit CpuMeter(pid_t pid) : pid_(pid) {}
  // CPU seconds so far (as of this sample).
  double seconds() {
    std::error_code ec;
    const fs::path tasks = "/proc/" + std::to_string(pid_) + "/task";
    for (auto it = fs::directory_iterator(tasks, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      std::ifstream in(it->path() / "schedstat");
      double ns = 0;
      if (in >> ns) {
        double& last = threads_[it->path().filename().string()];
        last = std::max(last, ns);
      }
    }
    if (threads_.empty()) {
      ticks_s_ = std::max(ticks_s_, test::process_cpu_seconds(pid_));
      return ticks_s_;
    }
    double ns = 0;
    for (const auto& [tid, thread_ns] : threads_) ns += thread_ns;
    return ns / 1e9;
  }

 private:
  pid_t pid_;
  std::map<std::string, double> threads_;  // thread id -> its last CPU ns
  double ticks_s_ = 0;
};

// The port of "live view at http://127.0.0.1:PORT/" in a log.
std::optional<std::uint16_t> live_view_port(const std::string& log) {
  const std::string marker = "live view at http://127.0.0.1:";
  const auto at = log.find(marker);
  if (at == std::string::npos) return std::nullopt;
  const int port = std::atoi(log.c_str() + at + marker.size());
  if (port <= 0 || port > 65535) return std::nullopt;
  return static_cast<std::uint16_t>(port);
}

// A body check: empty when the body is right, else what is wrong.
using BodyCheck = std::function<std::string(const std::string&)>;

BodyCheck contains(const std::string& text) {
  return [text](const std::string& body) {
    return body.find(text) != std::string::npos ? "" : "no '" + text + "' in the body";
  };
}

// One GET with a new connection; nullopt when it failed.
std::optional<ScrapeResponse> get_once(std::uint16_t port, const std::string& path) {
  try {
    ScrapeConnection connection(port);
    return connection.get(path, false, kScrapeTimeout);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

struct ScrapeRun {
  std::vector<double> ms;
  std::size_t bytes = 0;
  int failures = 0;
  int reconnects = 0;  // keep-alive connections the server closed under us
  std::string first_failure;
  double seconds = 0;
  double target_cpu_ms_per_scrape = 0;
  double machine_busy_pct = 0;  // over the loop, all CPUs
};

// `n` scrapes of `path` (plus the warm-up), new connection each or one kept alive.
ScrapeRun scrape_loop(std::uint16_t port, const std::string& path, int n, bool keep_alive,
                      const BodyCheck& check, pid_t target) {
  // The target's own CPU rate while nobody scrapes it.
  CpuMeter target_cpu(target);
  const double idle_cpu0 = target_cpu.seconds();
  const auto idle_start = Clock::now();
  nap(1s);
  const double idle_rate = (target_cpu.seconds() - idle_cpu0) / seconds_since(idle_start);

  ScrapeRun run;
  std::unique_ptr<ScrapeConnection> connection;
  const MachineMeter machine;
  const double cpu0 = target_cpu.seconds();
  const auto loop_start = Clock::now();
  for (int i = 0; i < n + kWarmupScrapes; ++i) {
    check_interrupt();
    const bool counted = i >= kWarmupScrapes;
    const auto start = Clock::now();
    std::optional<ScrapeResponse> response;
    try {
      if (!connection || !connection->is_open()) {
        if (connection && keep_alive && counted) ++run.reconnects;
        connection = std::make_unique<ScrapeConnection>(port);
      }
      response = connection->get(path, keep_alive, kScrapeTimeout);
    } catch (const std::exception&) {
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (!keep_alive) connection.reset();
    std::string problem;
    if (!response) {
      problem = "no response (connection refused or closed, or none within " +
                std::to_string(kScrapeTimeout.count()) + " s)";
    } else if (response->status != 200) {
      problem = "status " + std::to_string(response->status);
    } else {
      problem = check(response->body);
    }
    if (!problem.empty()) {
      if (counted) ++run.failures;
      if (run.first_failure.empty()) run.first_failure = problem;
      continue;
    }
    run.bytes = response->body.size();
    if (counted) run.ms.push_back(ms);
  }
  run.seconds = seconds_since(loop_start);
  run.machine_busy_pct = machine.busy_pct();
  const double cpu = target_cpu.seconds() - cpu0 - idle_rate * run.seconds;
  run.target_cpu_ms_per_scrape = std::max(0.0, cpu) * 1000.0 / std::max(1, n + kWarmupScrapes);
  return run;
}

void print_scrape(const std::string& what, const ScrapeRun& run) {
  std::printf("scrape %s median_ms=%.3f p99_ms=%.3f bytes=%zu\n", what.c_str(), median(run.ms),
              percentile(run.ms, 99), run.bytes);
  std::printf(
      "  (p90_ms=%.3f max_ms=%.3f scrapes=%zu failures=%d%s loop_s=%.2f "
      "target_cpu_ms_per_scrape=%.3f machine_busy_pct=%.0f)\n",
      percentile(run.ms, 90),
      run.ms.empty() ? 0.0 : *std::max_element(run.ms.begin(), run.ms.end()), run.ms.size(),
      run.failures, run.reconnects ? fmt::format(" reconnects={}", run.reconnects).c_str() : "",
      run.seconds, run.target_cpu_ms_per_scrape, run.machine_busy_pct);
  if (!run.first_failure.empty()) std::printf("  first failure: %s\n", run.first_failure.c_str());
  std::fflush(stdout);
}

// A ddprun job of the bench's: started at once, stopped (SIGTERM, then
// SIGKILL of its group) when it goes out of scope, with its temporary
// directory.
class Job {
 public:
  Job(std::vector<std::string> argv, const std::string& tag) : dir_("status-bench-" + tag) {
    children_.push_back(test::spawn(argv, test::environment_with({}), dir_.path(), "ddprun",
                                    {.own_group = true, .die_with_parent = true}));
    agent_cpu_ = CpuMeter(children_.front().pid);
  }
  ~Job() { stop(); }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const test::TempDir& dir() const { return dir_; }
  pid_t pid() const { return children_.front().pid; }
  bool running() { return !test::poll_children(children_); }
  const test::Child& child() const { return children_.front(); }

  std::string stderr_tail(std::size_t bytes = 3000) const {
    return test::stderr_of(children_, bytes);
  }

  // The live view's port, once the agent logged it; throws after `timeout`.
  std::uint16_t wait_port(Clock::duration timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (auto port = live_view_port(test::read_text(children_.front().err))) return *port;
      if (!running())
        throw std::runtime_error("ddprun exited before its live view:\n" + stderr_tail());
      if (Clock::now() > deadline) {
        throw std::runtime_error("ddprun logged no live view port:\n" + stderr_tail());
      }
      nap(20ms);
    }
  }

  // Waits for the end (up to `timeout`); false when it still runs. Samples
  // the agent's CPU time meanwhile (agent_cpu_s()).
  bool wait(Clock::duration timeout) {
    const auto deadline = Clock::now() + timeout;
    while (running()) {
      agent_cpu_s_ = agent_cpu_.seconds();
      if (Clock::now() > deadline) return false;
      nap(10ms);
    }
    return true;
  }
  // The agent's CPU seconds (user + system) at wait()'s last sample before it ended.
  double agent_cpu_s() const { return agent_cpu_s_; }

  // SIGTERM to the agent (it stops its workers), SIGKILL of its group after
  // `grace`; then checks that `pids` (its workers) are gone, killing any that is
  // not. Returns a problem, or "".
  std::string stop(const std::vector<pid_t>& pids = {}, Clock::duration grace = 30s) {
    if (running()) {
      ::kill(pid(), SIGTERM);
      const auto deadline = Clock::now() + grace;
      while (running() && Clock::now() < deadline) {
        std::this_thread::sleep_for(10ms);
      }
    }
    test::kill_children(children_);
    std::string problem;
    for (pid_t p : pids) {
      if (p <= 0 || p == pid()) continue;
      // A worker dies with its agent (PR_SET_PDEATHSIG); give it a moment.
      test::eventually([&] { return test::process_dead(p); }, 5s);
      if (!test::process_dead(p)) {
        ::kill(p, SIGKILL);
        problem += " " + std::to_string(p);
      }
    }
    return problem.empty() ? "" : "processes left running after the agent stopped:" + problem;
  }

 private:
  test::TempDir dir_;
  std::vector<test::Child> children_;
  CpuMeter agent_cpu_{-1};  // set once the agent runs
  double agent_cpu_s_ = 0;
};

std::vector<pid_t> pids_in_status(const std::string& status_body) {
  std::vector<pid_t> pids;
  for (const auto& v : test::json_values(status_body, "pid")) pids.push_back(std::stoi(v));
  return pids;
}

struct Options {
  int scrapes = 500;
  int repeat = 5;
  std::vector<std::string> only;
  int ranks = 64;
  int clients = 1024;
  int step_ms = 200;  // of the agent job's progress worker
  double form_timeout_s = 600;
  int step_steps = 200;
  int step_passes = 3000;
  int scrape_every_ms = 100;
};

struct Results {
  std::optional<ScrapeRun> agent_new, agent_keepalive, daemon_new, daemon_keepalive, etcd_new,
      etcd_keepalive;
  bool ok = true;
};

// ---- 1. the agent -----------------------------------------------------------------

void agent_part(const Options& o, const std::string& bin, Results& results) {
  std::printf(
      "\n[agent] ddprun --standalone --nproc_per_node=%d --status_port=0 --no_python "
      "ddprun_progress_worker healthy 0 0 --steps 1000000 --step_ms %d\n",
      o.ranks, o.step_ms);
  std::fflush(stdout);
  if (::access((bin + "/ddprun_progress_worker").c_str(), X_OK) != 0) {
    std::printf(
        "  skipped: %s/ddprun_progress_worker is not built (it is a test program: "
        "DDP_BUILD_TESTS=ON)\n",
        bin.c_str());
    return;
  }
  Job job({bin + "/ddprun", "--standalone", "--nproc_per_node=" + std::to_string(o.ranks),
           "--status_port=0", "--no_python", bin + "/ddprun_progress_worker", "healthy", "0", "0",
           "--steps", "1000000", "--step_ms", std::to_string(o.step_ms)},
          "agent");
  const auto started = Clock::now();
  const std::uint16_t port = job.wait_port(60s);
  // Until /status lists every rank with steps.
  std::string status;
  int reporting = 0;
  const auto deadline = started + std::chrono::duration<double>(o.form_timeout_s);
  auto last_note = Clock::now();
  for (;;) {
    check_interrupt();
    if (!job.running()) throw std::runtime_error("ddprun exited early:\n" + job.stderr_tail());
    if (auto r = get_once(port, "/status"); r && r->status == 200) {
      status = r->body;
      const auto steps = test::json_values(status, "steps");
      reporting = static_cast<int>(std::count_if(steps.begin(), steps.end(),
                                                 [](const auto& s) { return std::stoll(s) > 0; }));
      if (static_cast<int>(steps.size()) == o.ranks && reporting == o.ranks) break;
    }
    if (Clock::now() > deadline) {
      throw std::runtime_error(fmt::format("only {} of {} ranks reported steps after {:.0f} s:\n{}",
                                           reporting, o.ranks, o.form_timeout_s,
                                           job.stderr_tail()));
    }
    if (Clock::now() - last_note > 15s) {
      std::fprintf(stderr, "status_bench: %d of %d ranks report steps (%.0f s)\n", reporting,
                   o.ranks, seconds_since(started));
      last_note = Clock::now();
    }
    nap(500ms);
  }
  std::printf("  all %d ranks reported steps %.1f s after the start; live view on port %u\n",
              o.ranks, seconds_since(started), port);
  std::fflush(stdout);
  const std::vector<pid_t> pids = pids_in_status(status);
  const auto check = contains("ddprun_rank_steps{rank=\"" + std::to_string(o.ranks - 1) + "\"");
  const std::string label = fmt::format("target=agent ranks={}", o.ranks);
  results.agent_new = scrape_loop(port, "/metrics", o.scrapes, false, check, job.pid());
  print_scrape(label + " conn=new", *results.agent_new);
  results.agent_keepalive = scrape_loop(port, "/metrics", o.scrapes, true, check, job.pid());
  print_scrape(label + " conn=keepalive", *results.agent_keepalive);
  // Context: /status (what the page polls), the same way.
  const ScrapeRun status_run =
      scrape_loop(port, "/status", o.scrapes, false, contains("\"ranks\":["), job.pid());
  print_scrape(label + " path=/status conn=new", status_run);
  if (status_run.failures) results.ok = false;
  const std::string left = job.stop(pids);
  std::printf("  stopped: ddprun %s; %zu worker processes checked gone\n",
              job.child().exit_text().c_str(), pids.size() - 1);
  if (!left.empty()) throw std::runtime_error(left);
  for (const auto* run : {&*results.agent_new, &*results.agent_keepalive}) {
    if (run->failures) results.ok = false;
  }
}

// ---- 2. the daemon ----------------------------------------------------------------

void daemon_part(const Options& o, const std::string& bin, Results& results) {
  std::printf(
      "\n[daemon] ddp-rendezvous --host 127.0.0.1 --port 0 --status-port 0, %d TcpStore "
      "clients\n",
      o.clients);
  std::fflush(stdout);
  test::DaemonProcess daemon(bin + "/ddp-rendezvous", {"--status-port", "0"});
  std::optional<std::uint16_t> port;
  const auto deadline = Clock::now() + 10s;
  while (!(port = live_view_port(daemon.log_tail(20000)))) {
    if (Clock::now() > deadline || !daemon.running()) {
      throw std::runtime_error("the daemon logged no live view port: " + daemon.log_tail());
    }
    nap(20ms);
  }
  std::vector<std::unique_ptr<TcpStore>> clients;
  const auto connect_start = Clock::now();
  for (int i = 0; i < o.clients; ++i) {
    check_interrupt();
    TcpStoreOptions options;
    options.port = daemon.port();
    options.connect_timeout = 30s;
    clients.push_back(std::make_unique<TcpStore>(options));
  }
  std::printf("  %d clients connected (handshake done) in %.2f s\n", o.clients,
              seconds_since(connect_start));
  // Light traffic: one operation every millisecond, round-robin over the clients.
  std::atomic<bool> stop_ops{false};
  std::atomic<long> ops{0};
  std::string ops_error;
  std::thread traffic([&] {
    try {
      for (std::size_t i = 0; !stop_ops; ++i) {
        TcpStore& c = *clients[i % clients.size()];
        if (i % 2) {
          c.add("status-bench/ops", 1);
        } else {
          c.set("status-bench/client/" + std::to_string(i % clients.size()), "x");
        }
        ++ops;
        std::this_thread::sleep_for(1ms);
      }
    } catch (const std::exception& e) {
      ops_error = e.what();
    }
  });
  struct Joiner {
    std::atomic<bool>& stop;
    std::thread& thread;
    void join() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
    ~Joiner() { join(); }
  } joiner{stop_ops, traffic};

  const BodyCheck check = [&o](const std::string& body) -> std::string {
    const std::string name = "\nddprun_store_clients ";
    const auto at = body.find(name);
    if (at == std::string::npos) return "no ddprun_store_clients sample";
    const double value = std::strtod(body.c_str() + at + name.size(), nullptr);
    if (value < o.clients) return fmt::format("ddprun_store_clients {} < {}", value, o.clients);
    return "";
  };
  const std::string label = fmt::format("target=daemon clients={}", o.clients);
  const long ops0 = ops;
  const auto ops_start = Clock::now();
  {
    results.daemon_new = scrape_loop(*port, "/metrics", o.scrapes, false, check, daemon.pid());
    print_scrape(label + " conn=new", *results.daemon_new);
    results.daemon_keepalive = scrape_loop(*port, "/metrics", o.scrapes, true, check, daemon.pid());
    print_scrape(label + " conn=keepalive", *results.daemon_keepalive);
  }
  const double ops_per_s = static_cast<double>(ops - ops0) / seconds_since(ops_start);
  joiner.join();
  std::printf("  store traffic during the scrapes: %.0f ops/s%s\n", ops_per_s,
              ops_error.empty() ? "" : (" (stopped: " + ops_error + ")").c_str());
  if (!ops_error.empty()) results.ok = false;
  for (const auto* run : {&*results.daemon_new, &*results.daemon_keepalive}) {
    if (run->failures) results.ok = false;
  }
}

// ---- 3. etcd ----------------------------------------------------------------------

void etcd_part(const Options& o, Results& results) {
  std::printf("\n[etcd] %s, one member on loopback, idle\n", test::EtcdCluster::kBinary);
  std::fflush(stdout);
  if (!test::EtcdCluster::available()) {
    std::printf("  skipped: %s is not installed\n", test::EtcdCluster::kBinary);
    return;
  }
  test::EtcdCluster etcd(1);
  const auto check = contains("etcd_server_has_leader");
  results.etcd_new =
      scrape_loop(etcd.client_port(0), "/metrics", o.scrapes, false, check, etcd.pid(0));
  print_scrape("target=etcd conn=new", *results.etcd_new);
  results.etcd_keepalive =
      scrape_loop(etcd.client_port(0), "/metrics", o.scrapes, true, check, etcd.pid(0));
  print_scrape("target=etcd conn=keepalive", *results.etcd_keepalive);
  for (const auto* run : {&*results.etcd_new, &*results.etcd_keepalive}) {
    if (run->failures) results.ok = false;
  }
}

void print_ratios(const Results& r) {
  auto ratio = [](const std::string& name, const std::optional<ScrapeRun>& ours,
                  const std::optional<ScrapeRun>& etcd) {
    if (!ours || !etcd || ours->ms.empty() || etcd->ms.empty()) return;
    std::printf("  %-28s median %.2fx  p99 %.2fx  bytes %.2fx  (of etcd's; < 1: smaller)\n",
                name.c_str(), median(ours->ms) / median(etcd->ms),
                percentile(ours->ms, 99) / percentile(etcd->ms, 99),
                static_cast<double>(ours->bytes) / static_cast<double>(etcd->bytes));
  };
  if (!r.etcd_new) return;
  std::printf("\n[ratios] ours / etcd\n");
  ratio("agent conn=new", r.agent_new, r.etcd_new);
  ratio("agent conn=keepalive", r.agent_keepalive, r.etcd_keepalive);
  ratio("daemon conn=new", r.daemon_new, r.etcd_new);
  ratio("daemon conn=keepalive", r.daemon_keepalive, r.etcd_keepalive);
  std::fflush(stdout);
}

// ---- 4. the job's step time -------------------------------------------------------

struct StepRun {
  double mean_ms = 0;  // the ranks' mean step time
  int scrapes = 0;
  int scrape_failures = 0;  // of scrapes begun before the ranks finished their steps
  int late_failures = 0;    // begun after: the job was ending (not counted as failures)
  std::string first_failure;
  double wall_s = 0;            // the job, start to end
  double agent_cpu_s = 0;       // the agent's CPU time over the job
  double scraper_cpu_s = 0;     // the scraping thread's (the bench's side)
  double machine_busy_pct = 0;  // all CPUs, over the job
};

StepRun step_run(const Options& o, const std::string& bin, bool scraped) {
  const test::TempDir out("status-bench-out");
  Job job({bin + "/ddprun", "--standalone", "--nproc_per_node=2", "--status_port=0", "--no_python",
           bin + "/status_bench_worker", out.str(), std::to_string(o.step_steps),
           std::to_string(o.step_passes)},
          "step");
  const auto started = Clock::now();
  const MachineMeter machine;
  const std::uint16_t port = job.wait_port(60s);
  StepRun run;
  std::vector<std::pair<fs::file_time_type, std::string>> failures;  // begun at, what
  std::atomic<bool> done{false};
  std::thread scraper;
  if (scraped) {
    scraper = std::thread([&] {
      auto next = Clock::now();
      while (!done && !g_interrupted) {
        for (const char* path : {"/metrics", "/status"}) {
          const auto begun = fs::file_time_type::clock::now();  // as file times
          const auto r = get_once(port, path);
          ++run.scrapes;
          if (!r || r->status != 200) {
            failures.emplace_back(begun, std::string(path) + ": " +
                                             (r ? "status " + std::to_string(r->status)
                                                : std::string("no response")));
          }
        }
        next += std::chrono::milliseconds(o.scrape_every_ms);
        while (!done && Clock::now() < next) {
          std::this_thread::sleep_for(std::min<Clock::duration>(next - Clock::now(), 10ms));
        }
      }
      rusage usage{};
      ::getrusage(RUSAGE_THREAD, &usage);
      run.scraper_cpu_s =
          static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
          static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
    });
  }
  struct Joiner {
    std::atomic<bool>& done;
    std::thread& thread;
    ~Joiner() {
      done = true;
      if (thread.joinable()) thread.join();
    }
  } joiner{done, scraper};
  if (!job.wait(600s)) throw std::runtime_error("the step job did not end within 600 s");
  run.wall_s = seconds_since(started);
  run.agent_cpu_s = job.agent_cpu_s();
  run.machine_busy_pct = machine.busy_pct();
  done = true;
  if (scraper.joinable()) scraper.join();
  if (!job.child().ok()) {
    throw std::runtime_error("the step job failed (" + job.child().exit_text() + "):\n" +
                             job.stderr_tail());
  }
  std::vector<double> ranks;
  std::optional<fs::file_time_type> steps_done;  // when the first rank wrote its figure
  for (int r = 0; r < 2; ++r) {
    const fs::path file = out.path() / ("rank_" + std::to_string(r));
    std::istringstream in(test::read_text(file));
    double ms = 0;
    if (!(in >> ms) || ms <= 0) {
      throw std::runtime_error("rank " + std::to_string(r) + " wrote no step time");
    }
    ranks.push_back(ms);
    const auto written = fs::last_write_time(file);
    steps_done = steps_done ? std::min(*steps_done, written) : written;
  }
  run.mean_ms = mean(ranks);
  for (const auto& [begun, what] : failures) {
    if (begun < *steps_done) {
      ++run.scrape_failures;
      if (run.first_failure.empty()) run.first_failure = what;
    } else {
      ++run.late_failures;
    }
  }
  return run;
}

// The run-to-run range of `v` over its mean, in percent.
double range_pct(const std::vector<double>& v) {
  if (v.empty()) return 0;
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return 100.0 * (*hi - *lo) / mean(v);
}

void step_part(const Options& o, const std::string& bin, Results& results) {
  std::printf(
      "\n[step] ddprun --standalone --nproc_per_node=2 --status_port=0 --no_python "
      "status_bench_worker <dir> %d %d; %d runs scraped every %d ms (/metrics and "
      "/status, new connections), %d not, alternating\n",
      o.step_steps, o.step_passes, o.repeat, o.scrape_every_ms, o.repeat);
  std::fflush(stdout);
  std::vector<double> with, without, pairs;
  std::vector<double> agent_with, agent_without;  // the agent's CPU ms per second of job
  double scrapes = 0, scraper_cpu_s = 0, scraped_s = 0;
  const MachineMeter meter;
  for (int r = 0; r < o.repeat; ++r) {
    double pair[2] = {0, 0};  // without, with
    for (int k = 0; k < 2; ++k) {
      const bool scraped = (r % 2 == 0) == (k == 1);  // not, scraped; scraped, not; ...
      const StepRun run = step_run(o, bin, scraped);
      (scraped ? with : without).push_back(run.mean_ms);
      (scraped ? agent_with : agent_without).push_back(1000.0 * run.agent_cpu_s / run.wall_s);
      pair[scraped ? 1 : 0] = run.mean_ms;
      std::printf(
          "  run %d %-11s mean_step_ms=%.3f job_s=%.2f agent_cpu_ms_per_s=%.2f "
          "machine_busy_pct=%.0f",
          r + 1, scraped ? "scraped" : "not scraped", run.mean_ms, run.wall_s,
          1000.0 * run.agent_cpu_s / run.wall_s, run.machine_busy_pct);
      if (scraped) {
        std::printf(" scrapes=%d failures=%d", run.scrapes, run.scrape_failures);
        if (run.late_failures) std::printf(" (%d after the steps ended)", run.late_failures);
        if (!run.first_failure.empty()) std::printf(" first: %s", run.first_failure.c_str());
        scrapes += run.scrapes;
        scraper_cpu_s += run.scraper_cpu_s;
        scraped_s += run.wall_s;
      }
      std::printf("\n");
      std::fflush(stdout);
      if (run.scrape_failures) results.ok = false;
    }
    pairs.push_back(100.0 * (pair[1] / pair[0] - 1.0));
  }
  const double w = mean(with), wo = mean(without);
  std::printf(
      "step scrape_every_ms=%d with_ms=%.3f without_ms=%.3f overhead_pct=%.2f "
      "spread_pct=%.2f\n",
      o.scrape_every_ms, w, wo, 100.0 * (w / wo - 1.0),
      std::max(range_pct(with), range_pct(without)));
  std::printf(
      "  (spread_pct: the larger run range (max - min) / mean; scraped %.2f%%, not "
      "scraped %.2f%%; medians %.3f / %.3f ms)\n",
      range_pct(with), range_pct(without), median(with), median(without));
  const auto [pair_lo, pair_hi] = std::minmax_element(pairs.begin(), pairs.end());
  std::printf("  (each pair's overhead: median %.2f%%, min %.2f%%, max %.2f%%)\n", median(pairs),
              *pair_lo, *pair_hi);
  std::printf(
      "  (agent CPU: %.2f ms/s scraped, %.2f ms/s not: %.3f ms per scrape of /metrics or "
      "/status; the scraper's own: %.3f ms per scrape)\n",
      mean(agent_with), mean(agent_without),
      scrapes > 0 ? (mean(agent_with) - mean(agent_without)) * scraped_s / scrapes : 0.0,
      scrapes > 0 ? 1000.0 * scraper_cpu_s / scrapes : 0.0);
  std::printf("  %s\n", MachineMeter::line(meter).c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "status_bench: the live view's scrape latency (agent, daemon, etcd) and its cost "
      "to a job's step time"};
  app.add_option("--scrapes", o.scrapes, "Scrapes per target and connection kind")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--repeat", o.repeat, "Step-time runs of each kind (scraped, not)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--only", o.only, "Run only these parts (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember({"agent", "daemon", "etcd", "step"}));
  app.add_option("--ranks", o.ranks, "Local ranks of the agent's job")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--clients", o.clients, "Store clients connected to the daemon")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--form-timeout", o.form_timeout_s,
                 "Seconds the agent's job may take until every rank reports steps")
      ->capture_default_str();
  app.add_option("--step-steps", o.step_steps, "Steps of each step-time run (5 are warm-up)")
      ->capture_default_str()
      ->check(CLI::Range(6, 1000000));
  app.add_option("--step-passes", o.step_passes,
                 "Multiply-add passes over 64 Ki floats in each step (its compute)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--scrape-every-ms", o.scrape_every_ms, "Scrape interval of the scraped runs")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  const std::set<std::string> only(o.only.begin(), o.only.end());
  auto part = [&](const char* name) { return only.empty() || only.count(name) > 0; };

  struct sigaction action {};
  action.sa_handler = on_signal;
  ::sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  // 1,024 store clients plus the scrapers' sockets.
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }

  const std::string bin = test::bin_dir();
  std::printf(
      "status_bench: %d scrapes per target and connection (+%d warm-up), %d step runs "
      "of each kind; programs from %s\n",
      o.scrapes, kWarmupScrapes, o.repeat, bin.c_str());
  std::printf("machine: cpus=%u loadavg(1,5,15 min)=%s\n", std::thread::hardware_concurrency(),
              MachineMeter::loadavg().c_str());
  std::fflush(stdout);
  Results results;
  auto attempt = [&](const char* name, const std::function<void()>& body) {
    if (!part(name)) return;
    try {
      body();
    } catch (const Interrupted&) {
      throw;
    } catch (const std::exception& e) {
      std::printf("  %s: FAILED: %s\n", name, e.what());
      std::fflush(stdout);
      results.ok = false;
    }
  };
  try {
    attempt("agent", [&] { agent_part(o, bin, results); });
    attempt("daemon", [&] { daemon_part(o, bin, results); });
    attempt("etcd", [&] { etcd_part(o, results); });
    print_ratios(results);
    attempt("step", [&] { step_part(o, bin, results); });
  } catch (const Interrupted&) {
    std::fprintf(stderr, "status_bench: interrupted; everything it started is stopped\n");
    return 130;
  }
  std::printf("\nstatus_bench: %s\n", results.ok ? "ok" : "FAILED (see above)");
  return results.ok ? 0 : 1;
}
