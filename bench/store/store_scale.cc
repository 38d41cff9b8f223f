#include "store_scale.h"

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
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "daemon_process.h"
#include "ddp/store/tcp_store.h"
#include "process_state.h"

#if DDP_STORE_BENCH_WITH_C10D
#include "c10d_options.h"
#endif

namespace ddp::bench {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const std::string kArrivedKey = "scale/arrived";
const std::string kDoneKey = "scale/done";

// --- The clients ---------------------------------------------------------------

// The calls a scale client makes; implementations throw on any failure.
class ScaleClient {
 public:
  virtual ~ScaleClient() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  virtual void wait(const std::string& key) = 0;
};

class DdpScaleClient final : public ScaleClient {
 public:
  DdpScaleClient(std::uint16_t port, std::chrono::milliseconds timeout)
      : store_(options(port, timeout)) {}
  void set(const std::string& key, const std::string& value) override { store_.set(key, value); }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return store_.add(key, delta);
  }
  void wait(const std::string& key) override { store_.wait({key}); }

 private:
  static TcpStoreOptions options(std::uint16_t port, std::chrono::milliseconds timeout) {
    TcpStoreOptions o;
    o.port = port;
    o.connect_timeout = timeout;
    o.reconnect_timeout = timeout;
    o.timeout = timeout;
    return o;
  }
  TcpStore store_;
};

#if DDP_STORE_BENCH_WITH_C10D
class C10dScaleClient final : public ScaleClient {
 public:
  C10dScaleClient(std::uint16_t port, std::chrono::milliseconds timeout)
      : store_("127.0.0.1", c10d_options(port, false, timeout)) {}
  void set(const std::string& key, const std::string& value) override {
    store_.set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return store_.add(key, delta);
  }
  void wait(const std::string& key) override { store_.wait({key}); }

 private:
  c10d::TCPStore store_;
};
#endif

enum class Impl { kDdp, kC10d };

std::unique_ptr<ScaleClient> connect_client(Impl impl, std::uint16_t port,
                                            std::chrono::milliseconds timeout) {
#if DDP_STORE_BENCH_WITH_C10D
  if (impl == Impl::kC10d) return std::make_unique<C10dScaleClient>(port, timeout);
#endif
  (void)impl;
  return std::make_unique<DdpScaleClient>(port, timeout);
}

// --- Pipes between the driver and its workers -----------------------------------

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// What a worker reports after each phase (one write, under PIPE_BUF).
struct Report {
  std::int64_t errors = 0;  // clients lost in this phase
  std::int64_t end_ns = 0;  // steady clock (CLOCK_MONOTONIC: the same in every process)
  double cpu_s = 0;         // CPU the worker used in this phase
  char first_error[256] = {};
};
static_assert(sizeof(Report) <= PIPE_BUF);

bool write_all(int fd, const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

bool read_all(int fd, void* data, std::size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

// --- A worker process ---------------------------------------------------------------

struct WorkerPlan {
  Impl impl = Impl::kDdp;
  std::uint16_t port = 0;
  int first = 0;  // its clients: [first, first + count)
  int count = 0;
  int threads = 1;
  std::chrono::milliseconds timeout{60000};
};

// The failures of one phase in a worker, from any of its threads.
class Failures {
 public:
  void add(const std::exception& e) {
    std::lock_guard lock(mutex_);
    if (count_++ == 0) first_ = e.what();
  }
  Report report() {
    Report r;
    r.errors = count_;
    r.end_ns = now_ns();
    const double cpu = process_cpu_s();
    r.cpu_s = cpu - cpu_at_report_;
    cpu_at_report_ = cpu;
    std::snprintf(r.first_error, sizeof r.first_error, "%s", first_.c_str());
    count_ = 0;
    first_.clear();
    return r;
  }

 private:
  static double process_cpu_s() {
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
           static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  }
  std::mutex mutex_;
  std::int64_t count_ = 0;
  std::string first_;
  double cpu_at_report_ = process_cpu_s();
};

// Runs body(client index) for every client, its threads taking every
// threads-th one; returns when all are done.
template <typename Body>
void for_each_client(const WorkerPlan& plan, Body body) {
  std::vector<std::thread> pool;
  for (int t = 0; t < plan.threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = t; i < plan.count; i += plan.threads) body(i);
    });
  }
  for (auto& thread : pool) thread.join();
}

// The worker: waits for "go", connects its clients and sets a key each,
// reports; waits for the barrier's target, goes through it, reports; exits
// once its control pipe closes (the kernel closes every connection). Never
// returns.
[[noreturn]] void run_worker(const WorkerPlan& plan, int control_fd, int report_fd) {
  std::vector<std::unique_ptr<ScaleClient>> clients(static_cast<std::size_t>(plan.count));
  Failures failures;
  std::int64_t target = 0;
  if (!read_all(control_fd, &target, sizeof target)) ::_exit(3);  // the driver gave up
  for_each_client(plan, [&](int i) {
    auto& client = clients[static_cast<std::size_t>(i)];
    try {
      client = connect_client(plan.impl, plan.port, plan.timeout);
      client->set(fmt::format("scale/client/{}", plan.first + i), "1");
    } catch (const std::exception& e) {
      client.reset();
      failures.add(e);
    }
  });
  Report connected = failures.report();
  if (!write_all(report_fd, &connected, sizeof connected)) ::_exit(4);
  if (!read_all(control_fd, &target, sizeof target)) ::_exit(3);
  // The barrier as the agents go through theirs: every client adds one; the
  // one that brings the count to the target sets the key all of them wait for.
  for_each_client(plan, [&](int i) {
    auto& client = clients[static_cast<std::size_t>(i)];
    if (!client) return;
    try {
      if (client->add(kArrivedKey, 1) == target) client->set(kDoneKey, "1");
    } catch (const std::exception& e) {
      client.reset();
      failures.add(e);
    }
  });
  for_each_client(plan, [&](int i) {
    auto& client = clients[static_cast<std::size_t>(i)];
    if (!client) return;
    try {
      client->wait(kDoneKey);
    } catch (const std::exception& e) {
      failures.add(e);
    }
  });
  Report passed = failures.report();
  if (!write_all(report_fd, &passed, sizeof passed)) ::_exit(4);
  // Connected until the driver has looked at the server (it closes the pipe).
  read_all(control_fd, &target, sizeof target);
  // Not destroyed: c10d's clients join a thread each; exiting closes everything.
  ::_exit(0);
}

// The worker processes of one run, killed and reaped by the destructor.
class Workers {
 public:
  Workers() = default;
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  ~Workers() {
    for (auto& w : workers_) {
      if (w.pid > 0) {
        ::kill(w.pid, SIGKILL);
        ::waitpid(w.pid, nullptr, 0);
      }
      if (w.control_fd >= 0) ::close(w.control_fd);
      if (w.report_fd >= 0) ::close(w.report_fd);
    }
  }

  void start(const WorkerPlan& plan) {
    int control[2];
    int report[2];
    if (::pipe2(control, O_CLOEXEC) != 0) throw std::runtime_error("pipe: " + errno_text());
    if (::pipe2(report, O_CLOEXEC) != 0) {
      ::close(control[0]);
      ::close(control[1]);
      throw std::runtime_error("pipe: " + errno_text());
    }
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (int fd : {control[0], control[1], report[0], report[1]}) ::close(fd);
      throw std::runtime_error("fork: " + errno_text());
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::close(control[1]);
      ::close(report[0]);
      // The other workers' pipes are the parent's: not this one's business.
      for (auto& w : workers_) {
        ::close(w.control_fd);
        ::close(w.report_fd);
      }
      run_worker(plan, control[0], report[1]);
    }
    ::close(control[0]);
    ::close(report[1]);
    workers_.push_back(Worker{pid, control[1], report[0], plan.count, false});
  }

  // Sends `value` to every worker.
  void tell(std::int64_t value) {
    for (auto& w : workers_) write_all(w.control_fd, &value, sizeof value);
  }

  // Collects one report from every worker until `deadline`; a worker that
  // does not report in time (or died) counts all of its clients as errors.
  struct Phase {
    std::int64_t errors = 0;
    std::int64_t end_ns = 0;
    std::string first_error;
    double cpu_s = 0;        // of every worker in the phase
    bool timed_out = false;  // some worker did not report
  };
  Phase collect(Clock::time_point deadline) {
    Phase phase;
    // A worker gone in an earlier phase had all of its clients counted then.
    std::vector<bool> done(workers_.size(), false);
    std::size_t left = 0;
    for (const auto& w : workers_) left += w.gone ? 0 : 1;
    while (left > 0) {
      std::vector<pollfd> fds;
      std::vector<std::size_t> index;
      for (std::size_t i = 0; i < workers_.size(); ++i) {
        if (done[i] || workers_[i].gone) continue;
        fds.push_back(pollfd{workers_[i].report_fd, POLLIN, 0});
        index.push_back(i);
      }
      const auto wait_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (wait_ms <= 0 || ::poll(fds.data(), fds.size(), static_cast<int>(wait_ms)) == 0) break;
      for (std::size_t k = 0; k < fds.size(); ++k) {
        if (fds[k].revents == 0) continue;
        const std::size_t i = index[k];
        done[i] = true;
        --left;
        Report r;
        if (!read_all(workers_[i].report_fd, &r, sizeof r)) {
          workers_[i].gone = true;
          note(phase, workers_[i].clients, fmt::format("worker {} died", workers_[i].pid));
          continue;
        }
        phase.end_ns = std::max(phase.end_ns, r.end_ns);
        phase.cpu_s += r.cpu_s;
        if (r.errors > 0) note(phase, r.errors, r.first_error);
      }
    }
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      if (!done[i] && !workers_[i].gone) {
        note(phase, workers_[i].clients, "a worker did not report within the timeout");
      }
    }
    phase.timed_out = left > 0;
    return phase;
  }

  // Tells every worker to exit, waits (at most until `deadline`), kills the
  // rest, and returns the CPU seconds they used together.
  double finish(Clock::time_point deadline) {
    double cpu_s = 0;
    for (auto& w : workers_) {
      ::close(w.control_fd);  // the workers' signal to exit
      w.control_fd = -1;
    }
    for (auto& w : workers_) {
      rusage usage{};
      pid_t reaped = 0;
      while ((reaped = ::wait4(w.pid, nullptr, WNOHANG, &usage)) == 0 && Clock::now() < deadline) {
        std::this_thread::sleep_for(5ms);
      }
      if (reaped == 0) {
        ::kill(w.pid, SIGKILL);
        reaped = ::wait4(w.pid, nullptr, 0, &usage);
      }
      if (reaped == w.pid) cpu_s += seconds(usage.ru_utime) + seconds(usage.ru_stime);
      w.pid = -1;
    }
    return cpu_s;
  }

 private:
  struct Worker {
    pid_t pid = -1;
    int control_fd = -1;
    int report_fd = -1;
    int clients = 0;
    bool gone = false;  // died without reporting (its clients counted as errors once)
  };
  static void note(Phase& phase, std::int64_t errors, const std::string& what) {
    if (phase.errors == 0) phase.first_error = what;
    phase.errors += errors;
  }
  static std::string errno_text() { return std::strerror(errno); }
  static double seconds(const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  }
  std::vector<Worker> workers_;
};

// --- The server processes ------------------------------------------------------------

// A server process (ddp-rendezvous, or a c10d TCPStore server in a forked
// child) that the destructor stops and reaps.
class ServerProcess {
 public:
  virtual ~ServerProcess() = default;
  virtual pid_t pid() const = 0;
  virtual std::uint16_t port() const = 0;
  // The server's log (what it wrote on stderr), when it has one.
  virtual std::string log_tail() const { return ""; }
  std::optional<double> status_mib(const std::string& field) const {
    const auto kib = ddp::test::proc_status_kib(pid(), field);
    if (!kib) return std::nullopt;
    return *kib / 1024.0;
  }
};

class DdpServer final : public ServerProcess {
 public:
  explicit DdpServer(const std::string& path) : daemon_(path) {}
  pid_t pid() const override { return daemon_.pid(); }
  std::uint16_t port() const override { return daemon_.port(); }
  std::string log_tail() const override { return daemon_.log_tail(); }

 private:
  ddp::test::DaemonProcess daemon_;
};

#if DDP_STORE_BENCH_WITH_C10D
// c10d::TCPStore's server (its TCPStoreMasterDaemon thread) alone in a child
// process, so that its memory is its own. It serves until its pipe closes.
class C10dServer final : public ServerProcess {
 public:
  explicit C10dServer(std::chrono::milliseconds timeout) {
    int ready[2];
    int hold[2];
    if (::pipe2(ready, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    if (::pipe2(hold, O_CLOEXEC) != 0) {
      ::close(ready[0]);
      ::close(ready[1]);
      throw std::runtime_error("pipe failed");
    }
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) {
      for (int fd : {ready[0], ready[1], hold[0], hold[1]}) ::close(fd);
      throw std::runtime_error("fork failed");
    }
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::close(ready[0]);
      ::close(hold[1]);
      try {
        c10d::TCPStore server("127.0.0.1", c10d_options(0, true, timeout));
        const std::uint16_t port = server.getPort();
        write_all(ready[1], &port, sizeof port);
        char byte;
        while (::read(hold[0], &byte, 1) < 0 && errno == EINTR) {
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "c10d server: %s\n", e.what());
      }
      ::_exit(0);  // not destroyed: its daemon thread may be stuck with its clients
    }
    ::close(ready[1]);
    ::close(hold[0]);
    hold_fd_ = hold[1];
    std::uint16_t port = 0;
    const bool ok = read_all(ready[0], &port, sizeof port);
    ::close(ready[0]);
    if (!ok) throw std::runtime_error("the c10d server process did not start");
    port_ = port;
  }
  ~C10dServer() override {
    ::close(hold_fd_);
    int status = 0;
    const auto deadline = Clock::now() + 5s;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
  }
  pid_t pid() const override { return pid_; }
  std::uint16_t port() const override { return port_; }

 private:
  pid_t pid_ = -1;
  int hold_fd_ = -1;
  std::uint16_t port_ = 0;
};
#endif

// --- One run ------------------------------------------------------------------

struct RunResult {
  double connect_s = 0;
  double barrier_s = 0;
  double idle_rss_mib = 0;
  double peak_rss_mib = 0;
  std::int64_t errors = 0;
  std::string first_error;
  int processes = 0;
  double server_cpu_s = 0;     // during the run
  double workers_cpu_s = 0;    // from their start to their exit
  double phases_cpu_s = 0;     // of the workers in the two phases
  std::size_t server_fds = 0;  // descriptors the server held after the barrier
  bool timed_out = false;      // a phase did not end within the timeout
  std::string server_log;
};

// The descriptors process `pid` holds (0 when /proc cannot tell).
std::size_t open_descriptors(pid_t pid) {
  std::error_code ec;
  std::size_t n = 0;
  for (std::filesystem::directory_iterator it(fmt::format("/proc/{}/fd", pid), ec), end;
       !ec && it != end; it.increment(ec)) {
    ++n;
  }
  return n;
}

// Worker processes for n clients: at least `wanted`, and enough that each
// holds no more connections than its open-file limit allows (c10d opens two
// per client: its callback client has a socket of its own).
int worker_count(int n, int wanted, Impl impl) {
  rlimit limit{};
  std::int64_t fds = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    fds = static_cast<std::int64_t>(limit.rlim_cur);
  }
  const std::int64_t per_client = impl == Impl::kC10d ? 2 : 1;
  const std::int64_t fit = std::max<std::int64_t>(1, (fds - 256) / per_client);
  const std::int64_t needed = (n + fit - 1) / fit;
  return static_cast<int>(std::min<std::int64_t>(n, std::max<std::int64_t>(wanted, needed)));
}

RunResult run_once(Impl impl, int n, const ScaleSettings& s, const std::string& daemon_path) {
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(s.timeout_s * 1000));
  std::unique_ptr<ServerProcess> server;
#if DDP_STORE_BENCH_WITH_C10D
  if (impl == Impl::kC10d) server = std::make_unique<C10dServer>(timeout);
#endif
  if (!server) server = std::make_unique<DdpServer>(daemon_path);
  RunResult result;
  result.idle_rss_mib = server->status_mib("VmRSS").value_or(0);
  const double server_cpu_before = ddp::test::process_cpu_seconds(server->pid());

  Workers workers;
  const int processes = worker_count(n, s.processes, impl);
  result.processes = processes;
  for (int p = 0, first = 0; p < processes; ++p) {
    WorkerPlan plan;
    plan.impl = impl;
    plan.port = server->port();
    plan.first = first;
    plan.count = n / processes + (p < n % processes ? 1 : 0);
    plan.threads = std::max(1, std::min(s.threads, plan.count));
    plan.timeout = timeout;
    first += plan.count;
    workers.start(plan);
  }
  const auto deadline = Clock::now() + timeout + 10s;

  const std::int64_t start_ns = now_ns();
  workers.tell(n);
  auto connected = workers.collect(deadline);
  // A phase that did not end counts until the driver gave up on it.
  const auto seconds_since = [](std::int64_t from_ns, std::int64_t end_ns) {
    return static_cast<double>((end_ns > 0 ? end_ns : now_ns()) - from_ns) / 1e9;
  };
  result.connect_s = seconds_since(start_ns, connected.timed_out ? 0 : connected.end_ns);
  result.timed_out = connected.timed_out;
  result.errors = connected.errors;
  result.first_error = connected.first_error;
  result.phases_cpu_s = connected.cpu_s;
  if (!connected.timed_out) {
    // Those that connected go through the barrier.
    const std::int64_t barrier_ns = now_ns();
    workers.tell(n - connected.errors);
    auto passed = workers.collect(deadline);
    result.barrier_s = seconds_since(barrier_ns, passed.timed_out ? 0 : passed.end_ns);
    result.timed_out = passed.timed_out;
    if (result.errors == 0) result.first_error = passed.first_error;
    result.errors += passed.errors;
    result.phases_cpu_s += passed.cpu_s;
  }
  result.server_cpu_s = ddp::test::process_cpu_seconds(server->pid()) - server_cpu_before;
  result.server_fds = open_descriptors(server->pid());
  result.workers_cpu_s = workers.finish(Clock::now() + 10s);
  // The high-water mark: read once every client came and left.
  result.peak_rss_mib = server->status_mib("VmHWM").value_or(0);
  result.server_log = server->log_tail();
  return result;
}

std::string load_average() {
  const auto text = ddp::test::read_proc_file("/proc/loadavg");
  if (!text) return "n/a";
  return text->substr(0, text->find(' ', text->find(' ', text->find(' ') + 1) + 1));
}

void print_result(Impl impl, int n, const RunResult& r, const ScaleSettings& s) {
  const double per_connection_kib = n > 0 ? (r.peak_rss_mib - r.idle_rss_mib) * 1024.0 / n : 0.0;
  fmt::print(
      "{} with {} clients from {} processes x {} threads: {:.3f} s in all{}; server RSS {:.1f} "
      "MiB before the clients, peak {:.1f} MiB: {:.2f} KiB per connection; {} descriptors held "
      "after the barrier; CPU: server {:.2f} s, workers {:.2f} s ({:.2f} s in the two phases){}\n",
      impl == Impl::kDdp ? "ddp-rendezvous" : "c10d TCPStore", n, r.processes, s.threads,
      r.connect_s + r.barrier_s,
      r.timed_out
          ? fmt::format(" (did not finish: stopped after the {:.0f} s timeout)", s.timeout_s)
          : std::string(),
      r.idle_rss_mib, r.peak_rss_mib, per_connection_kib, r.server_fds, r.server_cpu_s,
      r.workers_cpu_s, r.phases_cpu_s,
      r.errors > 0 ? fmt::format("; first error: {}", r.first_error) : std::string());
  fmt::print(
      "store_scale {}clients={} connect_s={:.3f} barrier_s={:.3f} daemon_peak_rss_mib={:.1f} "
      "errors={}\n",
      impl == Impl::kC10d ? "impl=c10d " : "", n, r.connect_s, r.barrier_s, r.peak_rss_mib,
      r.errors);
  std::fflush(stdout);
}

}  // namespace

int run_scale(const ScaleSettings& s, const std::string& self_dir) {
  const std::string daemon_path = s.daemon.empty() ? self_dir + "/ddp-rendezvous" : s.daemon;
#if DDP_STORE_BENCH_WITH_C10D
  const bool with_c10d = s.with_c10d;
#else
  const bool with_c10d = false;
#endif
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  fmt::print(
      "store_bench --scale: {} (one process), {}; clients from >= {} worker processes x {} "
      "threads each (connect, set, then a barrier of add + wait), per-run timeout {:.0f} s; "
      "open-file limit {}; {} hardware thread(s); load average {}\n",
      daemon_path,
      with_c10d ? "c10d TCPStore of torch 1.13 (its server alone in a child process)"
                : "no c10d (built without libtorch, or --skip-c10d)",
      s.processes, s.threads, s.timeout_s, static_cast<std::uint64_t>(limit.rlim_cur),
      std::thread::hardware_concurrency(), load_average());
  std::fflush(stdout);
  bool failed = false;
  bool c10d_stopped = false;
  for (int n : s.clients) {
    if (s.with_ddp) {
      try {
        const RunResult r = run_once(Impl::kDdp, n, s, daemon_path);
        print_result(Impl::kDdp, n, r, s);
        if (r.errors > 0) {
          failed = true;
          fmt::print("ddp-rendezvous's log (last lines):\n{}\n", r.server_log);
        }
      } catch (const std::exception& e) {
        fmt::print("ddp-rendezvous with {} clients could not run: {}\n", n, e.what());
        failed = true;
      }
    }
    if (with_c10d && !c10d_stopped) {
      try {
        const RunResult r = run_once(Impl::kC10d, n, s, daemon_path);
        print_result(Impl::kC10d, n, r, s);
        if (r.errors > 0) {
          c10d_stopped = true;
          fmt::print("c10d TCPStore failed at {} clients: larger counts are not run\n", n);
        }
      } catch (const std::exception& e) {
        fmt::print("c10d TCPStore with {} clients could not run: {}\n", n, e.what());
        c10d_stopped = true;
      }
    }
  }
  return failed ? 1 : 0;
}

}  // namespace ddp::bench
