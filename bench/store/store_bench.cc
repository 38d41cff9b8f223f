// store_bench: throughput, latency and barrier time of ddp's store (TcpStore
// clients of an in-process StoreServer) next to c10d's TCPStore from torch 1.13,
// on the same workloads in the same run.
//
// Workloads, for each client count N:
//   connect  N clients connect (and handshake) from the driver threads.
//   mix      every client runs set / get / add in equal thirds on its own keys
//            (values of --value-size bytes) for --seconds or --ops operations;
//            ops/s over all clients, p50/p99 latency of single operations.
//   barrier  every client does add(key, 1); the one that reaches N sets
//            key/done; every client waits on key/done. Time until all passed,
//            median of --barrier-rounds rounds. Run twice: driven by the
//            driver threads (adds, then waits, round-robin), and with one
//            thread per client so that all N waits are pending at once.
// A few driver threads (--threads) each own N/threads clients and use them
// round-robin, as an agent process multiplexing many peers would; both stores
// get exactly the same driver.
//
// --attack runs something else: the store under attack. The real daemon
// (ddp-rendezvous, a process of its own so that its resident memory can be
// measured) serves --attack-honest honest TcpStore clients doing set/get in a
// loop, first quietly, then for as long again while, at the same time,
// --attack-idle connections sit half-open, one client sends random garbage at
// full speed (reconnecting whenever the server drops it), one client stores a
// large value and pipelines gets of it without ever reading a reply, one
// thread connects, parks a get, sends 1.5 MiB behind it and closes, over and
// over, and one client sends waits and multi_gets of millions of empty keys
// (see tests/support/store_attackers.h). It prints the honest clients' p99
// latency in both phases, what each attacker managed, whether the daemon let
// go of every attacker's connection once they stopped, and the daemon's peak
// RSS (VmHWM), ending with one line
//   attack: quiet_p99_us=<a> attacked_p99_us=<b> ratio=<b/a> server_peak_rss_mib=<m>
// A daemon whose RSS passes --attack-rss-cap-mib is killed (so that an unbounded
// server cannot push the machine into swapping or the OOM killer) and the run
// fails.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "daemon_process.h"
#include "ddp/store/tcp_store.h"
#include "ddp/store_server/store_server.h"
#include "process_util.h"
#include "store_attackers.h"
#include "store_scale.h"

#if DDP_STORE_BENCH_WITH_C10D
#include "c10d_options.h"
#endif

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// --- The two stores behind one small interface -----------------------------

class BenchClient {
 public:
  virtual ~BenchClient() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Returns the value's size (so the read cannot be optimized away).
  virtual std::size_t get(const std::string& key) = 0;
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  virtual void wait(const std::string& key) = 0;
};

class BenchBackend {
 public:
  virtual ~BenchBackend() = default;
  virtual std::unique_ptr<BenchClient> connect() = 0;
};

constexpr auto kStoreTimeout = std::chrono::seconds(120);

class DdpClient final : public BenchClient {
 public:
  explicit DdpClient(std::uint16_t port) : store_(options(port)) {}
  void set(const std::string& key, const std::string& value) override { store_.set(key, value); }
  std::size_t get(const std::string& key) override { return store_.get(key).size(); }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return store_.add(key, delta);
  }
  void wait(const std::string& key) override { store_.wait({key}); }

 private:
  static ddp::TcpStoreOptions options(std::uint16_t port) {
    ddp::TcpStoreOptions o;
    o.port = port;
    o.connect_timeout = kStoreTimeout;
    o.timeout = kStoreTimeout;
    return o;
  }
  ddp::TcpStore store_;
};

class DdpBackend final : public BenchBackend {
 public:
  DdpBackend() : server_(server_options()) { server_.start(); }
  std::unique_ptr<BenchClient> connect() override {
    return std::make_unique<DdpClient>(server_.port());
  }

 private:
  static ddp::StoreServerOptions server_options() {
    ddp::StoreServerOptions o;
    o.port = 0;
    return o;
  }
  ddp::StoreServer server_;
};

#if DDP_STORE_BENCH_WITH_C10D
class C10dClient final : public BenchClient {
 public:
  explicit C10dClient(std::uint16_t port)
      : store_("127.0.0.1", ddp::bench::c10d_options(port, false, kStoreTimeout)) {}
  void set(const std::string& key, const std::string& value) override {
    store_.set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
  }
  std::size_t get(const std::string& key) override { return store_.get(key).size(); }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return store_.add(key, delta);
  }
  void wait(const std::string& key) override { store_.wait({key}); }

 private:
  c10d::TCPStore store_;
};

class C10dBackend final : public BenchBackend {
 public:
  // The server-side TCPStore hosts the daemon (port 0: the OS picks one).
  C10dBackend() : server_("127.0.0.1", ddp::bench::c10d_options(0, true, kStoreTimeout)) {}
  std::unique_ptr<BenchClient> connect() override {
    return std::make_unique<C10dClient>(server_.getPort());
  }

 private:
  c10d::TCPStore server_;
};
#endif

// --- Workloads --------------------------------------------------------------

struct Settings {
  std::vector<int> clients{1, 64, 1024};
  int threads = 4;
  double seconds = 2.0;
  std::int64_t ops = 0;
  int value_size = 32;
  int barrier_rounds = 5;
  int repeat = 3;
  bool skip_c10d = false;
  bool skip_ddp = false;
  bool best = false;
};

struct Figures {
  std::optional<double> connect_ms;
  std::optional<double> ops_per_s;
  std::optional<double> p50_us;
  std::optional<double> p99_us;
  std::optional<double> p999_us;
  std::optional<double> mean_us;
  std::optional<double> barrier_ms;
  std::optional<double> barrier_tpc_ms;
  std::string error;
};

constexpr int kKeysPerClient = 16;
// Sizes and counters read in the mix end here so that no read is optimized away.
std::atomic<std::size_t> g_sink{0};

// Runs `body(thread_index)` on `threads` threads started together; returns the
// wall time from the common start to the last thread's end.
double run_threads(int threads, const std::function<void(int)>& body) {
  std::latch start(threads + 1);
  std::vector<std::thread> pool;
  std::exception_ptr failure;
  std::atomic<bool> failed{false};
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      start.arrive_and_wait();
      try {
        body(t);
      } catch (...) {
        if (!failed.exchange(true)) failure = std::current_exception();
      }
    });
  }
  auto begin = Clock::now();
  start.arrive_and_wait();
  for (auto& thread : pool) thread.join();
  double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  if (failure) std::rethrow_exception(failure);
  return seconds;
}

double percentile(std::vector<std::int64_t>& sorted_ns, double p) {
  if (sorted_ns.empty()) return 0;
  auto index = static_cast<std::size_t>(p * static_cast<double>(sorted_ns.size() - 1));
  return static_cast<double>(sorted_ns[index]) / 1000.0;
}

Figures run_workloads(const std::function<std::unique_ptr<BenchBackend>()>& make_backend, int n,
                      const Settings& s, const std::string& tag) {
  Figures f;
  try {
    auto backend = make_backend();
    int threads = std::max(1, std::min(s.threads, n));
    // Client i belongs to thread i % threads.
    std::vector<std::unique_ptr<BenchClient>> clients(n);
    double connect_s = run_threads(threads, [&](int t) {
      for (int i = t; i < n; i += threads) clients[i] = backend->connect();
    });
    f.connect_ms = connect_s * 1000.0;

    const std::string value(static_cast<std::size_t>(s.value_size), 'v');
    std::vector<std::vector<std::string>> keys(n);
    std::vector<std::string> counters(n);
    for (int i = 0; i < n; ++i) {
      for (int k = 0; k < kKeysPerClient; ++k) keys[i].push_back(fmt::format("mix/{}/{}", i, k));
      counters[i] = fmt::format("mix/{}/count", i);
    }
    run_threads(threads, [&](int t) {
      for (int i = t; i < n; i += threads) {
        for (const auto& key : keys[i]) clients[i]->set(key, value);
      }
    });

    // mix
    std::vector<std::vector<std::int64_t>> latencies(threads);
    std::vector<std::int64_t> done(threads, 0);
    const auto duration =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s.seconds));
    const std::int64_t quota = s.ops > 0 ? (s.ops + threads - 1) / threads : INT64_MAX;
    double mix_s = run_threads(threads, [&](int t) {
      auto& lat = latencies[t];
      lat.reserve(1 << 16);
      auto deadline = Clock::now() + duration;
      std::int64_t step = 0;
      std::size_t sink = 0;
      std::vector<int> mine;
      for (int i = t; i < n; i += threads) mine.push_back(i);
      auto now = Clock::now();
      while (step < quota && now < deadline) {
        int i = mine[static_cast<std::size_t>(step) % mine.size()];
        std::int64_t round = step / static_cast<std::int64_t>(mine.size());
        const auto& key = keys[i][static_cast<std::size_t>(round % kKeysPerClient)];
        auto begin = now;
        switch (round % 3) {
          case 0:
            clients[i]->set(key, value);
            break;
          case 1:
            sink += clients[i]->get(key);
            break;
          default:
            sink += static_cast<std::size_t>(clients[i]->add(counters[i], 1));
            break;
        }
        now = Clock::now();
        lat.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(now - begin).count());
        ++step;
      }
      done[t] = step;
      g_sink += sink;
    });
    std::vector<std::int64_t> all;
    std::int64_t total = 0;
    for (int t = 0; t < threads; ++t) {
      total += done[t];
      all.insert(all.end(), latencies[t].begin(), latencies[t].end());
    }
    std::sort(all.begin(), all.end());
    f.ops_per_s = static_cast<double>(total) / mix_s;
    f.p50_us = percentile(all, 0.50);
    f.p99_us = percentile(all, 0.99);
    f.p999_us = percentile(all, 0.999);
    if (!all.empty()) {
      f.mean_us = static_cast<double>(std::accumulate(all.begin(), all.end(), std::int64_t{0})) /
                  static_cast<double>(all.size()) / 1000.0;
    }

    // barrier
    std::vector<double> rounds;
    for (int r = 0; r < s.barrier_rounds; ++r) {
      const std::string key = fmt::format("barrier/{}", r);
      const std::string done_key = key + "/done";
      rounds.push_back(run_threads(threads, [&](int t) {
        for (int i = t; i < n; i += threads) {
          if (clients[i]->add(key, 1) == n) clients[i]->set(done_key, "1");
        }
        for (int i = t; i < n; i += threads) clients[i]->wait(done_key);
      }));
    }
    std::sort(rounds.begin(), rounds.end());
    if (!rounds.empty()) f.barrier_ms = rounds[rounds.size() / 2] * 1000.0;

    // barrier with a thread per client: every client's wait is pending on the
    // server at once, as with N agent processes.
    rounds.clear();
    for (int r = 0; r < s.barrier_rounds; ++r) {
      const std::string key = fmt::format("barrier-tpc/{}", r);
      const std::string done_key = key + "/done";
      rounds.push_back(run_threads(n, [&](int i) {
        if (clients[i]->add(key, 1) == n) clients[i]->set(done_key, "1");
        clients[i]->wait(done_key);
      }));
    }
    std::sort(rounds.begin(), rounds.end());
    if (!rounds.empty()) f.barrier_tpc_ms = rounds[rounds.size() / 2] * 1000.0;
    clients.clear();
  } catch (const std::exception& e) {
    f.error = fmt::format("{} with {} clients failed: {}", tag, n, e.what());
  }
  return f;
}

// Each figure over the runs that produced it: the median, or with `best` the
// best one (highest ops/s, lowest latency and times).
Figures summarize(const std::vector<Figures>& runs, bool best) {
  Figures m;
  auto pick = [&](std::optional<double> Figures::*field, bool higher_is_better) {
    std::vector<double> values;
    for (const auto& f : runs) {
      if (f.*field) values.push_back(*(f.*field));
    }
    if (values.empty()) return;
    std::sort(values.begin(), values.end());
    if (best) {
      m.*field = higher_is_better ? values.back() : values.front();
    } else {
      m.*field = values[values.size() / 2];
    }
  };
  pick(&Figures::connect_ms, false);
  pick(&Figures::ops_per_s, true);
  pick(&Figures::p50_us, false);
  pick(&Figures::p99_us, false);
  pick(&Figures::p999_us, false);
  pick(&Figures::mean_us, false);
  pick(&Figures::barrier_ms, false);
  pick(&Figures::barrier_tpc_ms, false);
  return m;
}

// --- Output -----------------------------------------------------------------

std::string cell(const std::optional<double>& v, const char* format) {
  return v ? fmt::format(fmt::runtime(format), *v) : std::string("n/a");
}

std::string ratio(const std::optional<double>& ddp, const std::optional<double>& c10d) {
  if (!ddp || !c10d || *c10d == 0) return "n/a";
  return fmt::format("{:.2f}x", *ddp / *c10d);
}

void print_row(const std::string& name, const std::optional<double>& ddp,
               const std::optional<double>& c10d, const char* format, const char* better) {
  fmt::print("{:<26}{:>14}{:>14}{:>11}   {}\n", name, cell(ddp, format), cell(c10d, format),
             ratio(ddp, c10d), better);
}

// The 1-minute load average before the run: other work on the machine skews
// every figure. (Not printed after the run: the thread-per-client barrier
// itself puts N runnable threads into it.)
std::string load_average() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return "n/a";
  char buf[64] = {};
  std::string text = std::fgets(buf, sizeof buf, f) != nullptr ? std::string(buf) : "n/a";
  std::fclose(f);
  return text.substr(0, text.find(' '));
}

void raise_fd_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// --- The store under attack (--attack) ---------------------------------------

struct AttackSettings {
  bool enabled = false;
  double seconds = 3.0;
  int honest = 64;
  int idle = 1000;
  double value_mib = 64;
  double rss_cap_mib = 4096;
  std::string daemon;  // empty: ddp-rendezvous next to this binary
  // Attackers left out (to see what each one costs): idle, garbage,
  // pipelining, flood, empty-keys.
  std::vector<std::string> without;
  bool runs(const std::string& attacker) const {
    return std::find(without.begin(), without.end(), attacker) == without.end();
  }
};

// One phase of the honest load: every client in its own thread does set then
// get of its own small keys, timing each operation.
struct HonestPhase {
  std::vector<std::int64_t> latencies_ns;  // sorted
  std::size_t errors = 0;
  std::string first_error;
};

HonestPhase honest_phase(std::vector<std::unique_ptr<ddp::TcpStore>>& clients, double seconds) {
  const int n = static_cast<int>(clients.size());
  std::vector<std::vector<std::int64_t>> latencies(static_cast<std::size_t>(n));
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  const auto duration =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  const std::string value(32, 'v');
  run_threads(n, [&](int i) {
    auto& lat = latencies[static_cast<std::size_t>(i)];
    auto& store = *clients[static_cast<std::size_t>(i)];
    const auto end = Clock::now() + duration;
    std::size_t sink = 0;
    try {
      for (int k = 0; Clock::now() < end; ++k) {
        const std::string key = fmt::format("honest/{}/{}", i, k % kKeysPerClient);
        auto begin = Clock::now();
        store.set(key, value);
        auto middle = Clock::now();
        sink += store.get(key).size();
        auto after = Clock::now();
        lat.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(middle - begin).count());
        lat.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(after - middle).count());
      }
    } catch (const std::exception& e) {
      // This client's connection is unusable from here on: it stops.
      errors[static_cast<std::size_t>(i)] = e.what();
    }
    g_sink += sink;
  });
  HonestPhase phase;
  for (int i = 0; i < n; ++i) {
    const auto& lat = latencies[static_cast<std::size_t>(i)];
    phase.latencies_ns.insert(phase.latencies_ns.end(), lat.begin(), lat.end());
    if (!errors[static_cast<std::size_t>(i)].empty()) {
      if (phase.errors++ == 0)
        phase.first_error = fmt::format("client {}: {}", i, errors[static_cast<std::size_t>(i)]);
    }
  }
  std::sort(phase.latencies_ns.begin(), phase.latencies_ns.end());
  return phase;
}

// The descriptors process `pid` holds (its listening socket, its connections and
// a few more); nullopt when /proc cannot tell.
std::optional<std::size_t> open_descriptors(pid_t pid) {
  std::error_code ec;
  std::filesystem::directory_iterator it(fmt::format("/proc/{}/fd", pid), ec);
  if (ec) return std::nullopt;
  std::size_t n = 0;
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (ec) return std::nullopt;
    ++n;
  }
  return n;
}

std::string describe(HonestPhase& phase, double seconds) {
  return fmt::format(
      "{} ops ({:.0f}/s), p50 {:.1f} us, p99 {:.1f} us, max {:.1f} us, {} client(s) failed{}",
      phase.latencies_ns.size(), static_cast<double>(phase.latencies_ns.size()) / seconds,
      percentile(phase.latencies_ns, 0.50), percentile(phase.latencies_ns, 0.99),
      percentile(phase.latencies_ns, 1.0), phase.errors,
      phase.errors ? " (first: " + phase.first_error + ")" : "");
}

int run_attack(const AttackSettings& a, const std::string& self_dir) {
  const std::string daemon_path = a.daemon.empty() ? self_dir + "/ddp-rendezvous" : a.daemon;
  std::vector<std::string> failures;
  ddp::test::DaemonProcess daemon(daemon_path);
  fmt::print(
      "store_bench --attack: {} (pid {}, port {}), {} honest clients (set/get of 32 B values), "
      "{:.1f} s quiet then {:.1f} s under attack; RSS cap {:.0f} MiB; {} hardware thread(s), "
      "load average {}\n",
      daemon_path, daemon.pid(), daemon.port(), a.honest, a.seconds, a.seconds, a.rss_cap_mib,
      std::thread::hardware_concurrency(), load_average());
  std::fflush(stdout);

  // The daemon's RSS, sampled often: the peak is also read from VmHWM at the
  // end, but a daemon killed at the cap has no status left to read.
  std::atomic<bool> monitoring{true};
  std::atomic<bool> capped{false};
  std::atomic<double> sampled_peak_mib{0};
  std::mutex pipeliner_mutex;
  ddp::test::attack::PipeliningClient* pipeliner = nullptr;  // guarded by pipeliner_mutex
  std::thread monitor([&] {
    while (monitoring.load()) {
      if (auto rss = daemon.status_mib("VmRSS")) {
        if (*rss > sampled_peak_mib.load()) sampled_peak_mib.store(*rss);
        if (*rss > a.rss_cap_mib && !capped.exchange(true)) {
          daemon.kill_now();
          std::lock_guard lock(pipeliner_mutex);
          if (pipeliner != nullptr) pipeliner->abort();
        }
      }
      std::this_thread::sleep_for(2ms);
    }
  });

  std::vector<std::unique_ptr<ddp::TcpStore>> clients;
  ddp::TcpStoreOptions options;
  options.port = daemon.port();
  options.connect_timeout = 30s;
  options.timeout = 30s;
  for (int i = 0; i < a.honest; ++i) clients.push_back(std::make_unique<ddp::TcpStore>(options));
  honest_phase(clients, std::min(0.5, a.seconds));  // warm-up, not counted
  HonestPhase quiet = honest_phase(clients, a.seconds);
  const auto quiet_rss = daemon.status_mib("VmRSS");
  const auto quiet_fds = open_descriptors(daemon.pid());
  fmt::print("quiet:      {}\n", describe(quiet, a.seconds));
  std::fflush(stdout);

  // The attack: set up first (connections opened, the large value stored), then
  // the honest load runs again while all of it is going on.
  const auto setup_begin = Clock::now();
  ddp::test::attack::IdleConnections idle;
  try {
    if (a.runs("idle")) idle.open(daemon.port(), a.idle);
  } catch (const std::exception& e) {
    failures.push_back(
        fmt::format("opening idle connections: {} (opened {})", e.what(), idle.size()));
  }
  std::optional<ddp::test::attack::GarbageClient> garbage;
  if (a.runs("garbage")) garbage.emplace(daemon.port(), 10'000'000);
  std::unique_ptr<ddp::test::attack::PipeliningClient> pipelining;
  try {
    if (a.runs("pipelining")) {
      pipelining = std::make_unique<ddp::test::attack::PipeliningClient>(
          daemon.port(), static_cast<std::size_t>(a.value_mib * 1024 * 1024));
      std::lock_guard lock(pipeliner_mutex);
      pipeliner = pipelining.get();
    }
  } catch (const std::exception& e) {
    failures.push_back(e.what());
  }
  std::optional<ddp::test::attack::ParkedFlood> flood;
  if (a.runs("flood")) flood.emplace(daemon.port());
  std::unique_ptr<ddp::test::attack::EmptyKeyAmplifier> amplifier;
  try {
    if (a.runs("empty-keys")) {
      amplifier = std::make_unique<ddp::test::attack::EmptyKeyAmplifier>(daemon.port());
    }
  } catch (const std::exception& e) {
    failures.push_back(e.what());
  }
  const double setup_s = std::chrono::duration<double>(Clock::now() - setup_begin).count();
  HonestPhase attacked = honest_phase(clients, a.seconds);
  const std::size_t idle_closed = idle.closed_by_server();
  const auto hwm = daemon.status_mib("VmHWM");
  const auto attacked_fds = open_descriptors(daemon.pid());
  const std::uint64_t gets = pipelining ? pipelining->gets_sent() : 0;
  const std::size_t value_bytes = pipelining ? pipelining->value_bytes() : 0;
  {
    std::lock_guard lock(pipeliner_mutex);
    pipeliner = nullptr;
  }
  pipelining.reset();
  if (garbage) garbage->stop();
  if (flood) flood->stop();
  if (amplifier) amplifier->stop();
  const std::size_t idle_opened = idle.size();
  idle.close_all();
  // Every attacker has closed its connections: the daemon must let go of them
  // all (parked-and-closed sessions included), keeping only the honest ones.
  const auto left_begin = Clock::now();
  auto left_fds = open_descriptors(daemon.pid());
  while (quiet_fds && left_fds && *left_fds > *quiet_fds && Clock::now() - left_begin < 5s &&
         !capped.load()) {
    std::this_thread::sleep_for(10ms);
    left_fds = open_descriptors(daemon.pid());
  }
  const double left_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - left_begin).count();
  clients.clear();
  monitoring.store(false);
  monitor.join();
  const std::string log = daemon.log_tail();
  const std::string ended = daemon.stop();

  fmt::print("attacked:   {}\n", describe(attacked, a.seconds));
  fmt::print(
      "  attack set up in {:.2f} s: {} idle connections ({} closed by the server by the end); "
      "garbage client: {} connections, {:.1f} MiB sent; pipelining client: a {:.1f} MiB value, "
      "{} gets sent unread ({:.1f} GiB of replies asked for)\n",
      setup_s, idle_opened, idle_closed, garbage ? garbage->connections() : 0,
      static_cast<double>(garbage ? garbage->bytes_sent() : 0) / (1 << 20),
      static_cast<double>(value_bytes) / (1 << 20), gets,
      static_cast<double>(gets) * static_cast<double>(value_bytes) / (1ull << 30));
  if (flood) {
    fmt::print(
        "  parked-and-closed flood: {} cycles (connect, parked get, 1.5 MiB behind it, close; {} "
        "cut short "
        "by the server closing first), {} failed handshake(s){}\n",
        flood->cycles(), flood->cut_short(), flood->failed_handshakes(),
        flood->first_error().empty() ? "" : " (first: " + flood->first_error() + ")");
  }
  if (amplifier) {
    fmt::print(
        "  empty-key amplification: {} requests answered ({} waits/multi_gets of {:.1f} MiB of "
        "empty keys "
        "refused, {} of {} empty keys timed out), worst reply {:.1f} ms ({:.1f} MiB) and {:.1f} ms "
        "({} keys), {} unexpected, {} connection(s) lost{}\n",
        amplifier->answered(), amplifier->refused(),
        static_cast<double>(amplifier->many_bytes()) / (1 << 20), amplifier->timed_out(),
        ddp::protocol::kMaxKeysPerRequest, amplifier->worst_many_ms(),
        static_cast<double>(amplifier->many_bytes()) / (1 << 20), amplifier->worst_limit_ms(),
        ddp::protocol::kMaxKeysPerRequest, amplifier->unexpected(), amplifier->lost(),
        amplifier->first_error().empty() ? "" : " (first: " + amplifier->first_error() + ")");
  }
  const auto fds = [](const std::optional<std::size_t>& n) {
    return n ? std::to_string(*n) : std::string("n/a");
  };
  fmt::print(
      "daemon descriptors: {} after the quiet phase, {} at the end of the attack, {} {:.0f} ms "
      "after the "
      "attackers closed theirs\n",
      fds(quiet_fds), fds(attacked_fds), fds(left_fds), left_ms);
  if (quiet_fds && left_fds && *left_fds > *quiet_fds && !capped.load()) {
    failures.push_back(fmt::format(
        "the daemon still held {} more descriptor(s) 5 s after every attacker closed its "
        "connections (sessions not released)",
        *left_fds - *quiet_fds));
  }
  if (amplifier && amplifier->unexpected() > 0) {
    failures.push_back("unexpected replies to the empty-key requests: " + amplifier->first_error());
  }
  const double peak = std::max(hwm.value_or(0.0), sampled_peak_mib.load());
  fmt::print(
      "server RSS: {:.1f} MiB after the quiet phase, peak {:.1f} MiB (VmHWM{}); the daemon {} at "
      "the end\n",
      quiet_rss.value_or(0.0), peak, hwm ? "" : " unreadable: sampled", ended);
  if (capped.load()) {
    failures.push_back(
        fmt::format("the daemon's RSS passed the {:.0f} MiB cap and it was killed", a.rss_cap_mib));
  }
  if (quiet.errors > 0)
    failures.push_back("honest clients failed in the quiet phase: " + quiet.first_error);
  if (attacked.errors > 0)
    failures.push_back("honest clients failed under attack: " + attacked.first_error);
  if (!failures.empty()) {
    for (const auto& f : failures) fmt::print("FAILED: {}\n", f);
    fmt::print("daemon log (last lines):\n{}\n", log);
  }
  const double quiet_p99 = percentile(quiet.latencies_ns, 0.99);
  const bool attacked_ok = attacked.errors == 0 && !attacked.latencies_ns.empty() && !capped.load();
  const double attacked_p99 = percentile(attacked.latencies_ns, 0.99);
  fmt::print("attack: quiet_p99_us={:.1f} attacked_p99_us={} ratio={} server_peak_rss_mib={:.1f}\n",
             quiet_p99, attacked_ok ? fmt::format("{:.1f}", attacked_p99) : "failed",
             attacked_ok && quiet_p99 > 0 ? fmt::format("{:.2f}", attacked_p99 / quiet_p99) : "n/a",
             peak);
  return failures.empty() ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{"store_bench: ddp TcpStore/StoreServer next to c10d TCPStore (torch 1.13)"};
  app.add_option("--clients", s.clients, "client connection counts, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 100000));
  app.add_option("--threads", s.threads, "driver threads; each owns clients/threads clients")
      ->check(CLI::Range(1, 1024));
  app.add_option("--seconds", s.seconds, "duration of each mix run")
      ->check(CLI::Range(0.01, 3600.0));
  app.add_option("--ops", s.ops, "stop each mix run after this many operations (0: time only)")
      ->check(CLI::Range(std::int64_t{0}, INT64_MAX));
  app.add_option("--value-size", s.value_size, "bytes per value in the mix")
      ->check(CLI::Range(0, 64 << 20));
  app.add_option("--barrier-rounds", s.barrier_rounds, "barrier rounds (the median is shown)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--repeat", s.repeat, "runs per store and client count, interleaved ddp/c10d")
      ->check(CLI::Range(1, 100));
  app.add_flag("--skip-c10d", s.skip_c10d, "do not run c10d's TCPStore");
  app.add_flag("--skip-ddp", s.skip_ddp, "do not run ddp's store (to profile c10d alone)");
  app.add_flag("--best", s.best,
               "show the best run (highest ops/s, lowest times) instead of the median: "
               "outside load only ever makes a run worse");
  AttackSettings attack;
  app.add_flag("--attack", attack.enabled,
               "run the store under attack instead (see the top of store_bench.cc)");
  app.add_option("--attack-seconds", attack.seconds,
                 "length of the quiet and of the attacked phase")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--attack-honest", attack.honest, "honest client threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--attack-idle", attack.idle, "idle half-open connections")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  app.add_option(
         "--attack-value-mib", attack.value_mib,
         "size of the value the pipelining client gets (lowered to the server's max value size)")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 4096.0));
  app.add_option("--attack-rss-cap-mib", attack.rss_cap_mib,
                 "the daemon is killed (and the run fails) when its RSS passes this")
      ->capture_default_str()
      ->check(CLI::Range(16.0, 1e7));
  app.add_option("--daemon", attack.daemon,
                 "the ddp-rendezvous binary (default: next to this one)");
  app.add_option("--attack-without", attack.without,
                 "attackers left out, comma-separated (to see what each one costs)")
      ->delimiter(',')
      ->check(CLI::IsMember({"idle", "garbage", "pipelining", "flood", "empty-keys"}));
  ddp::bench::ScaleSettings scale;
  app.add_option("--scale", scale.clients,
                 "run the scale mode instead, for these client counts, comma-separated "
                 "(see bench/store/store_scale.h)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1000000));
  app.add_option("--scale-processes", scale.processes,
                 "worker processes holding the clients (more when the open-file limit needs it)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--scale-threads", scale.threads, "threads per worker process")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--scale-timeout", scale.timeout_s,
                 "seconds each scale run (and each call in it) may take")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 3600.0));
  CLI11_PARSE(app, argc, argv);

  // Thousands of connections (the 1,024 clients; the attack's idle ones, whose
  // server end the daemon inherits the same limit for) need more descriptors
  // than the usual soft limit.
  raise_fd_limit();
  if (!scale.clients.empty()) {
    if (attack.enabled) {
      fmt::print(stderr, "store_bench: --scale and --attack are separate runs: give one\n");
      return 2;
    }
    scale.daemon = attack.daemon;
    scale.with_c10d = !s.skip_c10d;
    scale.with_ddp = !s.skip_ddp;
    try {
      return ddp::bench::run_scale(scale, ddp::test::exe_dir());
    } catch (const std::exception& e) {
      fmt::print(stderr, "store_bench --scale: {}\n", e.what());
      return 1;
    }
  }
  if (attack.enabled) {
    try {
      return run_attack(attack, ddp::test::exe_dir());
    } catch (const std::exception& e) {
      fmt::print(stderr, "store_bench --attack: {}\n", e.what());
      return 1;
    }
  }
#if DDP_STORE_BENCH_WITH_C10D
  const bool with_c10d = !s.skip_c10d;
#else
  const bool with_c10d = false;
#endif
  fmt::print(
      "store_bench: {} driver thread(s), mix {:.2f} s{} per run, {} B values, {} barrier "
      "round(s), {} of {} run(s), {} hardware thread(s)\n",
      s.threads, s.seconds, s.ops > 0 ? fmt::format(" or {} ops", s.ops) : "", s.value_size,
      s.barrier_rounds, s.best ? "best" : "median", s.repeat, std::thread::hardware_concurrency());
  fmt::print("load average at start: {}\n", load_average());
  fmt::print("c10d column: {}\n\n",
             with_c10d ? "torch 1.13 c10d::TCPStore (libtorch-dev), server in this process"
                       : "n/a (built without libtorch or --skip-c10d)");
  fmt::print("{:<26}{:>14}{:>14}{:>11}   {}\n", "workload", "ddp", "c10d", "ddp/c10d", "better");

  std::vector<std::string> errors;
  for (int n : s.clients) {
    // Interleaved so that a burst of outside load hits both stores alike.
    std::vector<Figures> ddp_runs;
    std::vector<Figures> c10d_runs;
    for (int r = 0; r < s.repeat; ++r) {
      if (!s.skip_ddp) {
        ddp_runs.push_back(
            run_workloads([] { return std::make_unique<DdpBackend>(); }, n, s, "ddp"));
      }
#if DDP_STORE_BENCH_WITH_C10D
      if (with_c10d) {
        c10d_runs.push_back(
            run_workloads([] { return std::make_unique<C10dBackend>(); }, n, s, "c10d"));
      }
#endif
    }
    for (const auto* runs : {&ddp_runs, &c10d_runs}) {
      for (const auto& f : *runs) {
        if (!f.error.empty()) errors.push_back(f.error);
      }
    }
    Figures ddp = summarize(ddp_runs, s.best);
    Figures c10d = summarize(c10d_runs, s.best);
    print_row(fmt::format("mix ops/s, {} clients", n), ddp.ops_per_s, c10d.ops_per_s, "{:.0f}",
              "higher");
    print_row(fmt::format("mix p50 us, {} clients", n), ddp.p50_us, c10d.p50_us, "{:.1f}", "lower");
    print_row(fmt::format("mix p99 us, {} clients", n), ddp.p99_us, c10d.p99_us, "{:.1f}", "lower");
    print_row(fmt::format("mix p99.9 us, {} clients", n), ddp.p999_us, c10d.p999_us, "{:.1f}",
              "lower");
    print_row(fmt::format("mix mean us, {} clients", n), ddp.mean_us, c10d.mean_us, "{:.1f}",
              "lower");
    print_row(fmt::format("barrier ms, {} clients", n), ddp.barrier_ms, c10d.barrier_ms, "{:.2f}",
              "lower");
    print_row(fmt::format("barrier ms, {} threads", n), ddp.barrier_tpc_ms, c10d.barrier_tpc_ms,
              "{:.2f}", "lower");
    print_row(fmt::format("connect ms, {} clients", n), ddp.connect_ms, c10d.connect_ms, "{:.1f}",
              "lower");
    std::fflush(stdout);
  }
  for (const auto& e : errors) fmt::print(stderr, "error: {}\n", e);
  return errors.empty() ? 0 : 1;
}
