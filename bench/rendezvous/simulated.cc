// rendezvous_bench's simulated agents (see rendezvous_bench.cc for what they
// measure): thousands of DynamicRendezvous handlers in a few forked agent
// processes, driven step by step from a few threads each, on the real store
// daemon (one TcpStore per agent) or on a fresh etcd (one EtcdStore per agent).
// The bench talks to its agent processes over pipes, one command or result a
// line; every agent process is killed and reaped when a measurement ends.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "daemon_process.h"
#include "ddp/common/error.h"
#include "ddp/common/time.h"
#include "ddp/rendezvous/rendezvous.h"
#include "ddp/rendezvous/round.h"
#include "ddp/store/tcp_store.h"
#include "ddp/store_etcd/etcd_store.h"
#include "dynamic_rendezvous.h"
#include "etcd_cluster.h"
#include "membership.h"
#include "process_state.h"
#include "rendezvous_bench.h"
#include "sys_error.h"

namespace ddp::bench {
namespace {

using namespace std::chrono_literals;
using ddp::rendezvous_detail::DynamicRendezvous;
using ddp::test::process_cpu_seconds;
using ddp::test::sys_error;

// CLOCK_MONOTONIC is system-wide: forked processes report their times in it.
std::int64_t to_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
Clock::time_point from_ns(std::int64_t ns) {
  return Clock::time_point(
      std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
}

std::chrono::milliseconds left_until(Clock::time_point deadline, std::chrono::milliseconds cap) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::clamp(left, std::chrono::milliseconds(1), cap);
}

std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw sys_error("write to a pipe");
    }
    done += static_cast<std::size_t>(n);
  }
}

// Closes every descriptor from 3 up but those in `keep` (a forked child that
// must not hold the other children's pipe ends).
void close_other_fds(std::vector<int> keep) {
  std::sort(keep.begin(), keep.end());
  unsigned from = 3;
  for (int fd : keep) {
    if (fd < 3) continue;
    if (static_cast<unsigned>(fd) > from) ::close_range(from, static_cast<unsigned>(fd) - 1, 0);
    from = static_cast<unsigned>(fd) + 1;
  }
  ::close_range(from, ~0U, 0);
}

// Lines from a pipe.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  int fd() const { return fd_; }
  std::optional<std::string> take() {
    const auto end = buffer_.find('\n');
    if (end == std::string::npos) return std::nullopt;
    std::string line = buffer_.substr(0, end);
    buffer_.erase(0, end + 1);
    return line;
  }
  // Reads what is there; false at end of file.
  bool fill() {
    char chunk[65536];
    for (;;) {
      const ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      buffer_.append(chunk, static_cast<std::size_t>(n));
      return true;
    }
  }
  // The next line, waiting for it until `deadline`; throws at end of file or past it.
  std::string next(Clock::time_point deadline, const std::string& from) {
    for (;;) {
      if (auto line = take()) return *line;
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) throw std::runtime_error("no answer from " + from + " in time");
      pollfd pfd{fd_, POLLIN, 0};
      const int ready =
          ::poll(&pfd, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
      if (ready < 0 && errno != EINTR) throw sys_error("poll");
      if (ready > 0 && !fill()) throw std::runtime_error(from + " closed its pipe");
    }
  }

 private:
  int fd_;
  std::string buffer_;
};

// ---- simulated agents: the agent processes ---------------------------------------------------

// The store the simulated agents meet in: the ddp-rendezvous daemon or etcd.
struct SimStore {
  // "" (the built-in store's lines) or "etcd".
  std::string name;
  // One agent's store, called once per agent in the agent processes.
  std::function<ddp::RendezvousStore()> connect;
  // The server's CPU seconds so far, and the end of its log (for failures).
  std::function<double()> cpu_s;
  std::function<std::string()> log_tail;
  // Also measure the re-formation after one agent's death.
  bool reform = true;
  // The agents' keep-alive settings (their lease TTL on etcd; no agent refreshes
  // it: a lease must outlive the measurement).
  std::chrono::milliseconds keep_alive_interval = std::chrono::seconds(5);
};

// Threads of an agent process that run one job together, again and again.
class Crew {
 public:
  explicit Crew(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this, i] { loop(i); });
  }
  ~Crew() {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    start_.notify_all();
    for (auto& t : threads_) t.join();
  }
  Crew(const Crew&) = delete;
  Crew& operator=(const Crew&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }

  // Runs job(i) on every thread i and waits for all; throws the first error.
  void run(const std::function<void(int)>& job) {
    std::unique_lock lock(mutex_);
    job_ = &job;
    running_ = size();
    errors_.clear();
    ++generation_;
    start_.notify_all();
    done_.wait(lock, [&] { return running_ == 0; });
    job_ = nullptr;
    if (!errors_.empty()) throw std::runtime_error(errors_.front());
  }

 private:
  void loop(int i) {
    std::uint64_t seen = 0;
    std::unique_lock lock(mutex_);
    for (;;) {
      start_.wait(lock, [&] { return quit_ || generation_ != seen; });
      if (quit_) return;
      seen = generation_;
      const auto* job = job_;
      lock.unlock();
      std::string error;
      try {
        (*job)(i);
      } catch (const std::exception& e) {
        error = e.what();
      }
      lock.lock();
      if (!error.empty()) errors_.push_back(error);
      if (--running_ == 0) done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  std::uint64_t generation_ = 0;
  bool quit_ = false;
  int running_ = 0;
  const std::function<void(int)>* job_ = nullptr;
  std::vector<std::string> errors_;
  std::vector<std::thread> threads_;
};

struct Agent {
  int global = -1;
  std::shared_ptr<ddp::Store> store;
  std::unique_ptr<DynamicRendezvous> handler;
  std::optional<ddp::RendezvousInfo> info;
};

// One thread's agents through round `r`, which `expected` arrivals close
// (`first_round`: no previous round, so max_nodes = expected close it).
void drive(const std::vector<Agent*>& mine, const std::string& r, int expected, bool first_round,
           Clock::time_point deadline) {
  if (mine.empty()) return;
  for (Agent* a : mine) a->handler->begin_join();
  // Arrival 0 decides; its record names its member.
  const std::string rec0_key = r + "/rec_0";
  const std::string decider =
      ddp::rendezvous_detail::parse_arrival(
          mine[0]->store->get(rec0_key, left_until(deadline, 60s)), rec0_key)
          .member;
  std::vector<Agent*> pending;
  for (Agent* a : mine) {
    if (a->handler->member() != decider) {
      pending.push_back(a);
      continue;
    }
    // The decider waits as join() makes it wait (wait_for_change):
    // in a first round for the last record it needs, R/rec_<max - 1>; in a
    // re-formed one for the next record (its count of arrivals is read here).
    while (!(a->info = a->handler->step())) {
      if (Clock::now() >= deadline) {
        throw std::runtime_error(fmt::format("the decider of {} did not close it in time", r));
      }
      const std::int64_t next = first_round ? expected - 1 : a->store->add(r + "/arrivals", 0);
      const auto before = Clock::now();
      try {
        a->store->wait({r + "/rec_" + std::to_string(next)}, left_until(deadline, 20ms));
      } catch (const ddp::TimeoutError&) {
      }
      if (Clock::now() - before < 1ms) std::this_thread::sleep_for(1ms);  // it is there: no spin
    }
  }
  bool closed = false;
  while (!pending.empty()) {
    std::vector<Agent*> still;
    for (Agent* a : pending) {
      if ((a->info = a->handler->step())) continue;
      still.push_back(a);
    }
    pending.swap(still);
    if (pending.empty()) break;
    if (closed) {
      throw std::runtime_error(
          fmt::format("agent {} has no info though {}/closed is set", pending[0]->global, r));
    }
    if (Clock::now() >= deadline) {
      throw std::runtime_error(
          fmt::format("{} of this thread's agents did not form {} in time", pending.size(), r));
    }
    try {
      pending[0]->store->wait({r + "/closed"}, left_until(deadline, 100ms));
      closed = true;
    } catch (const ddp::TimeoutError&) {
    }
  }
}

// An agent process: opens its agents' connections, then follows the bench's
// commands on `cmd_fd` ("G <round prefix> <expected arrivals>": run a round;
// "X <agent>": drop that agent; "Q": quit), answering on `res_fd`.
[[noreturn]] void agent_process(int cmd_fd, int res_fd, const SimStore& target, int n,
                                const std::vector<int>& globals, const SimSettings& s,
                                const std::string& run_id) {
  int code = 0;
  try {
    const int threads = std::max(1, std::min<int>(s.threads, static_cast<int>(globals.size())));
    Crew crew(threads);
    std::vector<Agent> agents(globals.size());
    ddp::RendezvousParams params;
    params.run_id = run_id;
    params.min_nodes = 1;
    params.max_nodes = n;
    params.node_rank = -1;
    params.local_world_size = 1;
    params.local_addr = "127.0.0.1";
    params.join_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(s.timeout_s * 1000));
    params.last_call_timeout = 10min;  // never over: see the top of rendezvous_bench.cc
    params.keep_alive_interval = target.keep_alive_interval;
    const std::string backend = target.name.empty() ? "c10d" : target.name;
    crew.run([&](int t) {
      for (std::size_t j = static_cast<std::size_t>(t); j < agents.size();
           j += static_cast<std::size_t>(threads)) {
        Agent& a = agents[j];
        a.global = globals[j];
        ddp::RendezvousStore rs = target.connect();
        a.store = rs.client_if_made();
        a.handler = std::make_unique<DynamicRendezvous>(params, std::move(rs), ddp::real_runtime(),
                                                        backend);
      }
    });
    write_all(res_fd, "R\n");
    LineReader commands(cmd_fd);
    for (;;) {
      const std::string command = commands.next(Clock::time_point::max(), "the bench");
      std::istringstream in(command);
      std::string verb;
      in >> verb;
      // Its connections (and watches) close with it.
      if (verb == "Q") ::_exit(0);
      if (verb == "X") {
        int dead = -1;
        in >> dead;
        // Dies without leaving: no shutdown(), its connection just closes.
        agents.erase(std::remove_if(agents.begin(), agents.end(),
                                    [&](const Agent& a) { return a.global == dead; }),
                     agents.end());
        write_all(res_fd, "R\n");
        continue;
      }
      if (verb != "G") throw std::runtime_error("unknown command '" + command + "'");
      std::string r;
      int expected = 0;
      in >> r >> expected;
      const auto deadline =
          Clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(s.timeout_s * 1000));
      std::vector<Clock::time_point> ends(static_cast<std::size_t>(threads),
                                          Clock::time_point::min());
      crew.run([&](int t) {
        std::vector<Agent*> mine;
        for (std::size_t j = static_cast<std::size_t>(t); j < agents.size();
             j += static_cast<std::size_t>(threads)) {
          mine.push_back(&agents[j]);
        }
        drive(mine, r, expected, r.ends_with("/round_0"), deadline);
        ends[static_cast<std::size_t>(t)] = Clock::now();
      });
      std::string out;
      for (Agent& a : agents) {
        const auto& i = *a.info;
        out += fmt::format("I {} {} {} {} {} {} {} {} {}\n", a.global, i.round, i.group_rank,
                           i.group_world_size, i.world_size, i.base_rank, i.master_addr,
                           i.master_port, i.instance);
        a.info.reset();
      }
      out += fmt::format("D {}\n", to_ns(*std::max_element(ends.begin(), ends.end())));
      write_all(res_fd, out);
    }
  } catch (const std::exception& e) {
    try {
      write_all(res_fd, "E " + one_line(e.what()) + "\n");
    } catch (...) {
    }
    code = 1;
  }
  ::_exit(code);
}

// ---- simulated agents: the bench's side -------------------------------------------------------

struct SimInfo {
  int round = -1;
  int group_rank = -1;
  int group_world_size = 0;
  int world_size = 0;
  int base_rank = -1;
  std::string master;
  std::string member;
};

struct AgentProcess {
  pid_t pid = -1;
  int cmd_fd = -1;
  std::unique_ptr<LineReader> results;
  bool done = false;  // sent what was awaited
};

// The agent processes of one N; killed and reaped whatever happens.
class AgentProcesses {
 public:
  ~AgentProcesses() {
    for (auto& p : procs) {
      if (p.pid > 0) ::kill(p.pid, SIGKILL);
    }
    for (auto& p : procs) {
      if (p.pid > 0) ::waitpid(p.pid, nullptr, 0);
      if (p.cmd_fd >= 0) ::close(p.cmd_fd);
      if (p.results) ::close(p.results->fd());
    }
  }

  // Quits them (they exit on their own; killed after `grace`).
  void quit(std::chrono::milliseconds grace) {
    for (auto& p : procs) {
      try {
        write_all(p.cmd_fd, "Q\n");
      } catch (...) {
      }
    }
    const auto deadline = Clock::now() + grace;
    for (auto& p : procs) {
      while (p.pid > 0) {
        const pid_t r = ::waitpid(p.pid, nullptr, WNOHANG);
        if (r == p.pid || r < 0) {
          p.pid = -1;
        } else if (Clock::now() > deadline) {
          ::kill(p.pid, SIGKILL);
          ::waitpid(p.pid, nullptr, 0);
          p.pid = -1;
        } else {
          std::this_thread::sleep_for(2ms);
        }
      }
    }
  }

  void send(const std::string& line) {
    for (auto& p : procs) write_all(p.cmd_fd, line + "\n");
  }

  // Reads every process's lines until each sent `until` ("R" or "D"); "I" lines
  // go to `infos`, the latest "D" time to `end`. Throws on "E" or past `deadline`.
  void collect(const std::string& until, Clock::time_point deadline, std::map<int, SimInfo>* infos,
               Clock::time_point* end) {
    for (auto& p : procs) p.done = false;
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<AgentProcess*> waiting;
      for (auto& p : procs) {
        while (!p.done) {
          auto line = p.results->take();
          if (!line) break;
          handle(*line, until, p, infos, end);
        }
        if (!p.done) {
          fds.push_back(pollfd{p.results->fd(), POLLIN, 0});
          waiting.push_back(&p);
        }
      }
      if (waiting.empty()) return;
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0)
        throw std::runtime_error(
            fmt::format("{} agent process(es) did not answer in time", waiting.size()));
      const int ready = ::poll(fds.data(), fds.size(),
                               static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
      if (ready < 0 && errno != EINTR) throw sys_error("poll");
      for (std::size_t i = 0; ready > 0 && i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        if (!waiting[i]->results->fill()) {
          // Lines it sent before dying are still worth reading (an "E").
          while (auto line = waiting[i]->results->take())
            handle(*line, until, *waiting[i], infos, end);
          throw std::runtime_error(fmt::format("agent process {} died", waiting[i]->pid));
        }
      }
    }
  }

  std::vector<AgentProcess> procs;

 private:
  static void handle(const std::string& line, const std::string& until, AgentProcess& p,
                     std::map<int, SimInfo>* infos, Clock::time_point* end) {
    std::istringstream in(line);
    std::string verb;
    in >> verb;
    if (verb == "E")
      throw std::runtime_error(fmt::format("agent process {}: {}", p.pid, line.substr(2)));
    if (verb == "I" && infos) {
      int global = -1;
      SimInfo info;
      std::string addr, port;
      in >> global >> info.round >> info.group_rank >> info.group_world_size >> info.world_size >>
          info.base_rank >> addr >> port >> info.member;
      info.master = addr + ":" + port;
      if (!infos->emplace(global, info).second) {
        throw std::runtime_error(fmt::format("agent {} reported twice", global));
      }
    } else if (verb == "D" && end) {
      std::int64_t ns = 0;
      in >> ns;
      *end = std::max(*end, from_ns(ns));
    }
    if (verb == until) p.done = true;
  }
};

// Throws unless `infos` are one consistent round of `nodes` agents.
void check_round(const std::map<int, SimInfo>& infos, int nodes, int round,
                 const std::string& absent) {
  if (static_cast<int>(infos.size()) != nodes) {
    throw std::runtime_error(fmt::format("{} agents reported, expected {}", infos.size(), nodes));
  }
  std::vector<int> owner(static_cast<std::size_t>(nodes), -1);
  const std::string& master = infos.begin()->second.master;
  for (const auto& [global, i] : infos) {
    if (i.round != round || i.group_world_size != nodes || i.world_size != nodes ||
        i.master != master || i.group_rank < 0 || i.group_rank >= nodes ||
        i.base_rank != i.group_rank) {
      throw std::runtime_error(
          fmt::format("agent {} got round {} group rank {} of {} (world {}, base rank {}, master "
                      "{}); expected round {} of "
                      "{} nodes, master {}",
                      global, i.round, i.group_rank, i.group_world_size, i.world_size, i.base_rank,
                      i.master, round, nodes, master));
    }
    if (owner[static_cast<std::size_t>(i.group_rank)] >= 0) {
      throw std::runtime_error(fmt::format("agents {} and {} both got group rank {}",
                                           owner[static_cast<std::size_t>(i.group_rank)], global,
                                           i.group_rank));
    }
    owner[static_cast<std::size_t>(i.group_rank)] = global;
    if (!absent.empty() && i.member == absent) {
      throw std::runtime_error(
          fmt::format("agent {} (the dead one) is in round {}", global, round));
    }
  }
}

// One round of N simulated agents on `target` (then, with target.reform, the
// re-formation of the N-1 survivors).
SimResult run_simulated(int n, const SimSettings& s, const SimStore& target) {
  const std::string run_id = fmt::format("{}bench{}", target.name, n);
  const int k = std::min(s.processes, n);
  AgentProcesses agents;
  agents.procs.resize(static_cast<std::size_t>(k));
  for (int p = 0; p < k; ++p) {
    std::vector<int> globals;
    for (int g = p; g < n; g += k) globals.push_back(g);
    int cmd[2], res[2];
    if (::pipe2(cmd, O_CLOEXEC) != 0 || ::pipe2(res, O_CLOEXEC) != 0) throw sys_error("pipe");
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw sys_error("fork");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      close_other_fds({cmd[0], res[1]});
      agent_process(cmd[0], res[1], target, n, globals, s, run_id);
    }
    ::close(cmd[0]);
    ::close(res[1]);
    agents.procs[static_cast<std::size_t>(p)].pid = pid;
    agents.procs[static_cast<std::size_t>(p)].cmd_fd = cmd[1];
    agents.procs[static_cast<std::size_t>(p)].results = std::make_unique<LineReader>(res[0]);
  }
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(s.timeout_s * 1000));
  try {
    const auto opening = Clock::now();
    agents.collect("R", Clock::now() + timeout, nullptr, nullptr);
    fmt::print(stderr, "  agents={}: {} connections opened in {:.2f} s by {} processes\n", n, n,
               seconds(Clock::now() - opening), k);

    // Round 0: everybody.
    SimResult result;
    const std::string r0 = fmt::format("rdzv/{}/round_0", run_id);
    std::map<int, SimInfo> infos;
    auto end = Clock::time_point::min();
    const double cpu0 = target.cpu_s();
    const auto start = Clock::now();
    agents.send(fmt::format("G {} {}", r0, n));
    agents.collect("D", start + timeout + 10s, &infos, &end);
    result.round_s = seconds(end - start);
    check_round(infos, n, 0, "");
    const double cpu1 = target.cpu_s();
    if (!target.reform) {
      fmt::print(stderr, "  agents={} store={}: checked; {} used {:.2f} s of CPU in the round\n", n,
                 target.name, target.name, cpu1 - cpu0);
      agents.quit(30s);
      return result;
    }

    // One agent dies; its watcher ends the round; the survivors re-form.
    const auto dead = std::find_if(infos.begin(), infos.end(),
                                   [&](const auto& e) { return e.second.group_rank == n / 2; });
    const int dead_global = dead->first;
    ddp::RoundEnd lost;
    lost.kind = ddp::RoundEnd::Kind::kNodeLost;
    lost.node = dead->second.group_rank;
    lost.member = dead->second.member;
    agents.send(fmt::format("X {}", dead_global));
    agents.collect("R", Clock::now() + 30s, nullptr, nullptr);
    target.connect().client()->compare_set(r0 + "/end", "", ddp::encode_round_end(lost));
    infos.clear();
    end = Clock::time_point::min();
    const auto restart = Clock::now();
    agents.send(fmt::format("G rdzv/{}/round_1 {}", run_id, n - 1));
    agents.collect("D", restart + timeout + 10s, &infos, &end);
    result.reform_s = seconds(end - restart);
    check_round(infos, n - 1, 1, lost.member);
    fmt::print(
        stderr,
        "  agents={}: checked; the daemon used {:.2f} s of CPU in the first round, {:.2f} s in the "
        "re-formed one\n",
        n, cpu1 - cpu0, target.cpu_s() - cpu1);
    agents.quit(30s);
    return result;
  } catch (const std::exception& e) {
    const std::string log = target.log_tail();
    throw std::runtime_error(fmt::format("{}\n  {} log (last lines):\n{}", e.what(),
                                         target.name.empty() ? "daemon" : target.name, log));
  }
}

}  // namespace

SimResult run_simulated_builtin(int n, const SimSettings& s, const std::string& daemon_path) {
  test::DaemonProcess daemon(daemon_path);
  SimStore target;
  const std::uint16_t port = daemon.port();
  target.connect = [port] {
    ddp::TcpStoreOptions options;
    options.host = "127.0.0.1";
    options.port = port;
    options.connect_timeout = 60s;
    options.reconnect_timeout = 60s;
    options.timeout = 120s;
    ddp::RendezvousStore rs(std::make_shared<ddp::TcpStore>(options));
    rs.at("127.0.0.1", port);
    return rs;
  };
  target.cpu_s = [&daemon] { return daemon.cpu_s(); };
  target.log_tail = [&daemon] { return daemon.log_tail(); };
  return run_simulated(n, s, target);
}

test::EtcdCluster::Options bench_etcd(const std::string& etcd_path) {
  test::EtcdCluster::Options options;
  options.binary = etcd_path;
  // Its own logging must not take CPU from the rounds measured.
  options.extra_args = {"--logger", "zap", "--log-level", "warn"};
  options.start_timeout = 30s;
  return options;
}

SimResult run_simulated_etcd(int n, const SimSettings& s, const std::string& etcd_path) {
  test::EtcdCluster etcd(bench_etcd(etcd_path));
  SimStore target;
  target.name = "etcd";
  target.reform = false;
  // A lease nobody refreshes (no keep-alive threads) outlives any round measured:
  // a TTL of 10 minutes x 3 attempts.
  target.keep_alive_interval = std::chrono::minutes(10);
  const std::uint16_t port = etcd.client_port(0);
  const double timeout_s = s.timeout_s;
  target.connect = [port, timeout_s] {
    ddp::EtcdStoreOptions options;
    options.endpoints = {ddp::EtcdEndpoint{"127.0.0.1", port}};
    options.prefix = "ddp/";  // as ddprun's
    options.connect_timeout = 60s;
    options.request_timeout = 60s;
    options.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
    auto store = std::make_shared<ddp::EtcdStore>(options);
    // Group rank 0's worker store, as ddprun announces it: nobody connects to it here.
    struct AnnouncedWorkerStore final : ddp::HostedStore {
      std::uint16_t port() const override { return 29400; }
    };
    const std::string name = "etcd at " + store->endpoints_text();
    ddp::RendezvousStore rs(std::move(store));
    rs.at("127.0.0.1", 0).external(name, std::make_shared<AnnouncedWorkerStore>());
    return rs;
  };
  target.cpu_s = [&etcd] { return process_cpu_seconds(etcd.pid(0)); };
  target.log_tail = [&etcd] { return etcd.log_tail(0, 2000); };
  return run_simulated(n, s, target);
}

}  // namespace ddp::bench
