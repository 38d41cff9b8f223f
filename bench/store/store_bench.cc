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
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <latch>
#include <numeric>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "ddp/rendezvous/store_server.h"
#include "ddp/rendezvous/tcp_store.h"

#if DDP_STORE_BENCH_WITH_C10D
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
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
c10d::TCPStoreOptions c10d_options(std::uint16_t port, bool is_server) {
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = is_server;
  o.numWorkers = c10::nullopt;
  o.waitWorkers = false;
  o.timeout = kStoreTimeout;
  return o;
}

class C10dClient final : public BenchClient {
 public:
  explicit C10dClient(std::uint16_t port) : store_("127.0.0.1", c10d_options(port, false)) {}
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
  C10dBackend() : server_("127.0.0.1", c10d_options(0, true)) {}
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
    const auto duration = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(s.seconds));
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
          case 0: clients[i]->set(key, value); break;
          case 1: sink += clients[i]->get(key); break;
          default: sink += static_cast<std::size_t>(clients[i]->add(counters[i], 1)); break;
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

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{"store_bench: ddp TcpStore/StoreServer next to c10d TCPStore (torch 1.13)"};
  app.add_option("--clients", s.clients, "client connection counts, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 100000));
  app.add_option("--threads", s.threads, "driver threads; each owns clients/threads clients")
      ->check(CLI::Range(1, 1024));
  app.add_option("--seconds", s.seconds, "duration of each mix run")->check(CLI::Range(0.01, 3600.0));
  app.add_option("--ops", s.ops, "stop each mix run after this many operations (0: time only)")
      ->check(CLI::Range(std::int64_t{0}, INT64_MAX));
  app.add_option("--value-size", s.value_size, "bytes per value in the mix")
      ->check(CLI::Range(0, 64 << 20));
  app.add_option("--barrier-rounds", s.barrier_rounds, "barrier rounds (the median is shown)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--repeat", s.repeat,
                 "runs per store and client count, interleaved ddp/c10d")
      ->check(CLI::Range(1, 100));
  app.add_flag("--skip-c10d", s.skip_c10d, "do not run c10d's TCPStore");
  app.add_flag("--skip-ddp", s.skip_ddp, "do not run ddp's store (to profile c10d alone)");
  app.add_flag("--best", s.best,
               "show the best run (highest ops/s, lowest times) instead of the median: "
               "outside load only ever makes a run worse");
  CLI11_PARSE(app, argc, argv);

  raise_fd_limit();
#if DDP_STORE_BENCH_WITH_C10D
  const bool with_c10d = !s.skip_c10d;
#else
  const bool with_c10d = false;
#endif
  fmt::print("store_bench: {} driver thread(s), mix {:.2f} s{} per run, {} B values, {} barrier "
             "round(s), {} of {} run(s), {} hardware thread(s)\n",
             s.threads, s.seconds, s.ops > 0 ? fmt::format(" or {} ops", s.ops) : "",
             s.value_size, s.barrier_rounds, s.best ? "best" : "median", s.repeat,
             std::thread::hardware_concurrency());
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
    print_row(fmt::format("mix p50 us, {} clients", n), ddp.p50_us, c10d.p50_us, "{:.1f}",
              "lower");
    print_row(fmt::format("mix p99 us, {} clients", n), ddp.p99_us, c10d.p99_us, "{:.1f}",
              "lower");
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
