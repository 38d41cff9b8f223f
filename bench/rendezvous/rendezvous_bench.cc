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
//     step(), as next_rendezvous() does (without its keep-alive thread, which
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
//     own (the LeaseStore path: each agent puts its keep-alive key on a lease of
//     its own and, once it has its info, watches its neighbour's key; each
//     blocking get/wait opens its own connection to etcd) on a fresh
//     single-member etcd (--etcd, default /usr/bin/etcd) that the bench starts for
//     each N on free loopback ports with a temporary data dir (default fsync; its
//     log level warn). A guard process starts etcd and stops it (SIGTERM, SIGKILL
//     after 5 s) and removes the dir when the measurement ends, fails or times
//     out, or the bench dies. No agent refreshes its lease (no keep-alive
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
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/common/error.h"
#include "ddp/common/time.h"
#include "ddp/rendezvous/rendezvous.h"
#include "ddp/rendezvous/round.h"
#include "ddp/store/tcp_store.h"
#include "ddp/store_etcd/etcd_store.h"
#include "dynamic_rendezvous.h"
#include "membership.h"

#include "../support/daemon_process.h"
#include "../support/torchrun_fix.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using ddp::rendezvous_detail::DynamicRendezvous;

using ddp::bench::sys_error;
using ddp::bench::process_cpu_seconds;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// CLOCK_MONOTONIC is system-wide: forked processes report their times in it.
std::int64_t to_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
Clock::time_point from_ns(std::int64_t ns) {
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
}

std::chrono::milliseconds left_until(Clock::time_point deadline, std::chrono::milliseconds cap) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::clamp(left, std::chrono::milliseconds(1), cap);
}

std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

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
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) throw std::runtime_error("no answer from " + from + " in time");
      pollfd pfd{fd_, POLLIN, 0};
      const int ready = ::poll(&pfd, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
      if (ready < 0 && errno != EINTR) throw sys_error("poll");
      if (ready > 0 && !fill()) throw std::runtime_error(from + " closed its pipe");
    }
  }

 private:
  int fd_;
  std::string buffer_;
};

class TempDir {
 public:
  explicit TempDir(const std::string& stem) {
    std::string pattern = (fs::temp_directory_path() / (stem + "XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw sys_error("mkdtemp");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string tail(const std::string& text, std::size_t bytes = 1500) {
  return text.size() <= bytes ? text : "..." + text.substr(text.size() - bytes);
}

// ---- simulated agents: the agent processes ---------------------------------------------------

struct SimSettings {
  int processes = 4;
  int threads = 4;
  double timeout_s = 120;
};

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
      ddp::rendezvous_detail::parse_arrival(mine[0]->store->get(rec0_key, left_until(deadline, 60s)), rec0_key)
          .member;
  std::vector<Agent*> pending;
  for (Agent* a : mine) {
    if (a->handler->member() != decider) {
      pending.push_back(a);
      continue;
    }
    // The decider waits as next_rendezvous() makes it wait (wait_for_change):
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
      throw std::runtime_error(fmt::format("agent {} has no info though {}/closed is set", pending[0]->global, r));
    }
    if (Clock::now() >= deadline) {
      throw std::runtime_error(fmt::format("{} of this thread's agents did not form {} in time", pending.size(), r));
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
    params.last_call_timeout = 10min;  // never over: see the top of the file
    params.keep_alive_interval = target.keep_alive_interval;
    const std::string backend = target.name.empty() ? "c10d" : target.name;
    crew.run([&](int t) {
      for (std::size_t j = static_cast<std::size_t>(t); j < agents.size(); j += static_cast<std::size_t>(threads)) {
        Agent& a = agents[j];
        a.global = globals[j];
        ddp::RendezvousStore rs = target.connect();
        a.store = rs.store;
        a.handler = std::make_unique<DynamicRendezvous>(params, std::move(rs), ddp::real_runtime(), backend);
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
        agents.erase(std::remove_if(agents.begin(), agents.end(), [&](const Agent& a) { return a.global == dead; }),
                     agents.end());
        write_all(res_fd, "R\n");
        continue;
      }
      if (verb != "G") throw std::runtime_error("unknown command '" + command + "'");
      std::string r;
      int expected = 0;
      in >> r >> expected;
      const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(s.timeout_s * 1000));
      std::vector<Clock::time_point> ends(static_cast<std::size_t>(threads), Clock::time_point::min());
      crew.run([&](int t) {
        std::vector<Agent*> mine;
        for (std::size_t j = static_cast<std::size_t>(t); j < agents.size(); j += static_cast<std::size_t>(threads)) {
          mine.push_back(&agents[j]);
        }
        drive(mine, r, expected, r.ends_with("/round_0"), deadline);
        ends[static_cast<std::size_t>(t)] = Clock::now();
      });
      std::string out;
      for (Agent& a : agents) {
        const auto& i = *a.info;
        out += fmt::format("I {} {} {} {} {} {} {} {} {}\n", a.global, i.round, i.group_rank, i.group_world_size,
                           i.world_size, i.base_rank, i.master_addr, i.master_port, i.instance);
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
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) throw std::runtime_error(fmt::format("{} agent process(es) did not answer in time", waiting.size()));
      const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
      if (ready < 0 && errno != EINTR) throw sys_error("poll");
      for (std::size_t i = 0; ready > 0 && i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        if (!waiting[i]->results->fill()) {
          // Lines it sent before dying are still worth reading (an "E").
          while (auto line = waiting[i]->results->take()) handle(*line, until, *waiting[i], infos, end);
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
    if (verb == "E") throw std::runtime_error(fmt::format("agent process {}: {}", p.pid, line.substr(2)));
    if (verb == "I" && infos) {
      int global = -1;
      SimInfo info;
      std::string addr, port;
      in >> global >> info.round >> info.group_rank >> info.group_world_size >> info.world_size >> info.base_rank >>
          addr >> port >> info.member;
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
void check_round(const std::map<int, SimInfo>& infos, int nodes, int round, const std::string& absent) {
  if (static_cast<int>(infos.size()) != nodes) {
    throw std::runtime_error(fmt::format("{} agents reported, expected {}", infos.size(), nodes));
  }
  std::vector<int> owner(static_cast<std::size_t>(nodes), -1);
  const std::string& master = infos.begin()->second.master;
  for (const auto& [global, i] : infos) {
    if (i.round != round || i.group_world_size != nodes || i.world_size != nodes || i.master != master ||
        i.group_rank < 0 || i.group_rank >= nodes || i.base_rank != i.group_rank) {
      throw std::runtime_error(fmt::format(
          "agent {} got round {} group rank {} of {} (world {}, base rank {}, master {}); expected round {} of "
          "{} nodes, master {}",
          global, i.round, i.group_rank, i.group_world_size, i.world_size, i.base_rank, i.master, round, nodes,
          master));
    }
    if (owner[static_cast<std::size_t>(i.group_rank)] >= 0) {
      throw std::runtime_error(fmt::format("agents {} and {} both got group rank {}",
                                           owner[static_cast<std::size_t>(i.group_rank)], global, i.group_rank));
    }
    owner[static_cast<std::size_t>(i.group_rank)] = global;
    if (!absent.empty() && i.member == absent) {
      throw std::runtime_error(fmt::format("agent {} (the dead one) is in round {}", global, round));
    }
  }
}

struct SimResult {
  double round_s = 0;
  double reform_s = 0;
};

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
      fmt::print(stderr, "  agents={} store={}: checked; {} used {:.2f} s of CPU in the round\n", n, target.name,
                 target.name, cpu1 - cpu0);
      agents.quit(30s);
      return result;
    }

    // One agent dies; its watcher ends the round; the survivors re-form.
    const auto dead = std::find_if(infos.begin(), infos.end(), [&](const auto& e) { return e.second.group_rank == n / 2; });
    const int dead_global = dead->first;
    ddp::RoundEnd lost;
    lost.kind = ddp::RoundEnd::Kind::kNodeLost;
    lost.node = dead->second.group_rank;
    lost.member = dead->second.member;
    agents.send(fmt::format("X {}", dead_global));
    agents.collect("R", Clock::now() + 30s, nullptr, nullptr);
    target.connect().store->compare_set(r0 + "/end", "", ddp::encode_round_end(lost));
    infos.clear();
    end = Clock::time_point::min();
    const auto restart = Clock::now();
    agents.send(fmt::format("G rdzv/{}/round_1 {}", run_id, n - 1));
    agents.collect("D", restart + timeout + 10s, &infos, &end);
    result.reform_s = seconds(end - restart);
    check_round(infos, n - 1, 1, lost.member);
    fmt::print(stderr, "  agents={}: checked; the daemon used {:.2f} s of CPU in the first round, {:.2f} s in the "
                       "re-formed one\n", n, cpu1 - cpu0, target.cpu_s() - cpu1);
    agents.quit(30s);
    return result;
  } catch (const std::exception& e) {
    const std::string log = target.log_tail();
    throw std::runtime_error(fmt::format("{}\n  {} log (last lines):\n{}", e.what(),
                                         target.name.empty() ? "daemon" : target.name, log));
  }
}

// The built-in store's lines: the daemon, one TcpStore per agent.
SimResult run_simulated_builtin(int n, const SimSettings& s, const std::string& daemon_path) {
  ddp::bench::DaemonProcess daemon(daemon_path);
  SimStore target;
  const std::uint16_t port = daemon.port();
  target.connect = [port] {
    ddp::TcpStoreOptions options;
    options.host = "127.0.0.1";
    options.port = port;
    options.connect_timeout = 60s;
    options.reconnect_timeout = 60s;
    options.timeout = 120s;
    ddp::RendezvousStore rs;
    rs.store = std::make_shared<ddp::TcpStore>(options);
    rs.host = "127.0.0.1";
    rs.port = port;
    return rs;
  };
  target.cpu_s = [&daemon] { return daemon.cpu_s(); };
  target.log_tail = [&daemon] { return daemon.log_tail(); };
  return run_simulated(n, s, target);
}

// ---- etcd: one local member, started and stopped by the bench --------------------------------

// One HTTP/1.1 request to 127.0.0.1:`port` (Connection: close); the response
// (status line, headers and body), or nullopt when none came within `timeout`.
std::optional<std::string> http_request(std::uint16_t port, const std::string& method, const std::string& path,
                                        const std::string& body, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return std::nullopt;
  const std::string request = fmt::format(
      "{} {} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
      "Connection: close\r\n\r\n{}",
      method, path, port, body.size(), body);
  std::size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    sent += static_cast<std::size_t>(n);
  }
  std::string response;
  char chunk[8192];
  while (Clock::now() < deadline) {
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) return response;
    response.append(chunk, static_cast<std::size_t>(n));
  }
  return std::nullopt;
}

// Every value of the JSON field `name` in `text` (numbers and int64 strings: "ID":"123" or "ID":123).
std::vector<std::string> json_values(const std::string& text, const std::string& name) {
  std::vector<std::string> values;
  const std::string needle = "\"" + name + "\":";
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    auto from = at + needle.size();
    if (from < text.size() && text[from] == '"') ++from;
    auto to = from;
    while (to < text.size() && (std::isdigit(static_cast<unsigned char>(text[to])) || text[to] == '-')) ++to;
    if (to > from) values.push_back(text.substr(from, to - from));
  }
  return values;
}

// A single-member etcd on free loopback ports, its data in a temporary folder.
// A guard process of its own starts it and, when the bench says so or dies
// (its pipe closes: an exception, a timeout, a SIGKILL of the bench), stops it
// (SIGTERM, SIGKILL after 5 s), reaps it and removes the folder: nothing stays
// behind whatever happens to the bench. Not thread-safe; one owner.
class EtcdServer {
 public:
  // Starts `etcd_path` and waits (30 s at most) until it answers /health.
  // Throws std::runtime_error with its log otherwise.
  explicit EtcdServer(const std::string& etcd_path) {
    std::string pattern = (fs::temp_directory_path() / "rdzv-bench-etcd-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw sys_error("mkdtemp");
    dir_ = pattern;
    log_ = dir_ / "etcd.log";
    client_port_ = ddp::find_free_port("127.0.0.1");
    do {
      peer_port_ = ddp::find_free_port("127.0.0.1");
    } while (peer_port_ == client_port_);
    const std::string client = fmt::format("http://127.0.0.1:{}", client_port_);
    const std::string peer = fmt::format("http://127.0.0.1:{}", peer_port_);
    const std::vector<std::string> argv{etcd_path,
                                        "--name", "bench0",
                                        "--data-dir", (dir_ / "data").string(),
                                        "--listen-client-urls", client,
                                        "--advertise-client-urls", client,
                                        "--listen-peer-urls", peer,
                                        "--initial-advertise-peer-urls", peer,
                                        "--initial-cluster", "bench0=" + peer,
                                        "--initial-cluster-state", "new",
                                        "--initial-cluster-token", fmt::format("rdzv-bench-{}", ::getpid()),
                                        "--logger", "zap",
                                        "--log-level", "warn"};
    int ctl[2], rep[2];
    if (::pipe2(ctl, O_CLOEXEC) != 0) throw sys_error("pipe");
    if (::pipe2(rep, O_CLOEXEC) != 0) {
      ::close(ctl[0]);
      ::close(ctl[1]);
      throw sys_error("pipe");
    }
    guard_ = ::fork();
    if (guard_ < 0) {
      const auto error = sys_error("fork");
      for (int fd : {ctl[0], ctl[1], rep[0], rep[1]}) ::close(fd);
      std::error_code ec;
      fs::remove_all(dir_, ec);
      throw error;
    }
    if (guard_ == 0) guard(ctl[0], rep[1], argv);
    ::close(ctl[0]);
    ::close(rep[1]);
    ctl_fd_ = ctl[1];
    rep_fd_ = rep[0];
    try {
      LineReader from_guard(rep_fd_);
      const std::string line = from_guard.next(Clock::now() + 10s, "etcd's guard process");
      pid_ = static_cast<pid_t>(std::stol(line));
      if (pid_ <= 0) throw std::runtime_error("cannot start " + etcd_path + ": " + log_tail());
      const auto deadline = Clock::now() + 30s;
      for (;;) {
        const auto health = http_request(client_port_, "GET", "/health", "", 1s);
        if (health && health->find("\"health\":\"true\"") != std::string::npos) break;
        if (Clock::now() >= deadline || !alive()) {
          throw std::runtime_error(fmt::format("{} did not become healthy on 127.0.0.1:{} within 30 s ({}); its log:\n{}",
                                               etcd_path, client_port_, alive() ? "it runs" : "it exited",
                                               log_tail()));
        }
        std::this_thread::sleep_for(50ms);
      }
    } catch (...) {
      stop();
      throw;
    }
  }
  ~EtcdServer() { stop(); }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  std::uint16_t port() const { return client_port_; }
  std::string endpoint() const { return fmt::format("127.0.0.1:{}", client_port_); }
  double cpu_s() const { return pid_ > 0 ? process_cpu_seconds(pid_) : 0; }
  bool alive() const {
    std::ifstream stat(fmt::format("/proc/{}/stat", pid_));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const auto paren = text.rfind(')');
    return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] != 'Z' && text[paren + 2] != 'X';
  }

  // The TTLs etcd granted to its live leases (lease/leases, then lease/timetolive).
  std::vector<std::int64_t> granted_ttls() const {
    std::vector<std::int64_t> ttls;
    const auto leases = http_request(client_port_, "POST", "/v3/lease/leases", "{}", 2s);
    if (!leases) return ttls;
    for (const auto& id : json_values(*leases, "ID")) {
      const auto ttl = http_request(client_port_, "POST", "/v3/lease/timetolive", "{\"ID\":\"" + id + "\"}", 2s);
      if (!ttl) continue;
      for (const auto& granted : json_values(*ttl, "grantedTTL")) ttls.push_back(std::stoll(granted));
    }
    return ttls;
  }

  // The last 2,000 bytes of etcd's log.
  std::string log_tail() const { return tail(read_text(log_), 2000); }

  // Stops etcd and removes its folder (through the guard); idempotent.
  void stop() {
    if (guard_ <= 0) return;
    try {
      write_all(ctl_fd_, "S");
    } catch (const std::exception&) {
      // It is gone already: its end of the pipe closed.
    }
    ::close(ctl_fd_);
    ctl_fd_ = -1;
    // The guard exits once etcd is reaped and the folder removed.
    const auto deadline = Clock::now() + 15s;
    int status = 0;
    pid_t reaped = 0;
    while ((reaped = ::waitpid(guard_, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    if (reaped == 0) {  // never seen: SIGKILL it, etcd dies with it (PR_SET_PDEATHSIG)
      ::kill(guard_, SIGKILL);
      ::waitpid(guard_, &status, 0);
      if (pid_ > 0) ::kill(pid_, SIGKILL);
    }
    guard_ = -1;
    ::close(rep_fd_);
    rep_fd_ = -1;
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

 private:
  // The guard: starts etcd, reports its pid, waits for "S" or the end of the
  // bench, then stops etcd, reaps it and removes the folder.
  [[noreturn]] void guard(int ctl_fd, int rep_fd, const std::vector<std::string>& argv) {
    ::setpgid(0, 0);  // a Ctrl-C of the bench's group must not kill it before it cleaned up
    for (int sig : {SIGINT, SIGHUP, SIGTERM, SIGQUIT}) ::signal(sig, SIG_IGN);
    close_other_fds({ctl_fd, rep_fd});
    const int log_fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const pid_t guard_pid = ::getpid();
    const pid_t etcd = ::fork();
    if (etcd == 0) {
      for (int sig : {SIGINT, SIGHUP, SIGTERM, SIGQUIT, SIGPIPE}) ::signal(sig, SIG_DFL);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the guard
      if (::getppid() != guard_pid) ::_exit(127);
      if (log_fd >= 0) {
        ::dup2(log_fd, 1);
        ::dup2(log_fd, 2);
      }
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      std::fprintf(stderr, "cannot execute %s: %s\n", args[0], std::strerror(errno));
      ::_exit(127);
    }
    try {
      write_all(rep_fd, fmt::format("{}\n", etcd > 0 ? etcd : -1));
    } catch (...) {
    }
    char c;
    while (::read(ctl_fd, &c, 1) < 0 && errno == EINTR) {
    }
    if (etcd > 0) {
      ::kill(etcd, SIGTERM);
      const auto deadline = Clock::now() + 5s;
      int status = 0;
      pid_t reaped = 0;
      while ((reaped = ::waitpid(etcd, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
        std::this_thread::sleep_for(5ms);
      }
      if (reaped == 0) {
        ::kill(etcd, SIGKILL);
        ::waitpid(etcd, &status, 0);
      }
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
    ::_exit(0);
  }

  fs::path dir_, log_;
  std::uint16_t client_port_ = 0, peer_port_ = 0;
  pid_t guard_ = -1;
  pid_t pid_ = -1;
  int ctl_fd_ = -1;
  int rep_fd_ = -1;
};

// The etcd lines: one round of N agents, each a DynamicRendezvous over an
// EtcdStore of its own, on a fresh etcd.
SimResult run_simulated_etcd(int n, const SimSettings& s, const std::string& etcd_path) {
  EtcdServer etcd(etcd_path);
  SimStore target;
  target.name = "etcd";
  target.reform = false;
  // A lease nobody refreshes (no keep-alive threads) outlives any round measured:
  // a TTL of 10 minutes x 3 attempts.
  target.keep_alive_interval = std::chrono::minutes(10);
  const std::uint16_t port = etcd.port();
  const double timeout_s = s.timeout_s;
  target.connect = [port, timeout_s] {
    ddp::EtcdStoreOptions options;
    options.endpoints = {ddp::EtcdEndpoint{"127.0.0.1", port}};
    options.prefix = "ddp/";  // as ddprun's
    options.connect_timeout = 60s;
    options.request_timeout = 60s;
    options.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
    auto store = std::make_shared<ddp::EtcdStore>(options);
    ddp::RendezvousStore rs;
    rs.external_name = "etcd at " + store->endpoints_text();
    rs.store = std::move(store);
    rs.host = "127.0.0.1";
    // Group rank 0's worker store, as ddprun announces it: nobody connects to it here.
    rs.worker_store_port = 29400;
    return rs;
  };
  target.cpu_s = [&etcd] { return etcd.cpu_s(); };
  target.log_tail = [&etcd] { return etcd.log_tail(); };
  return run_simulated(n, s, target);
}

// ---- real launchers ---------------------------------------------------------------------------

struct Child {
  pid_t pid = -1;
  fs::path out, err;
  bool done = false;
  int status = 0;
  Clock::time_point ended;
  std::string exit_text() const {
    if (!done) return "still running";
    if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
    return fmt::format("signal {}", WTERMSIG(status));
  }
  bool ok() const { return done && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
};

std::vector<std::string> environment_with(const std::map<std::string, std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    if (!extra.count(var.substr(0, var.find('=')))) env.push_back(var);
  }
  for (const auto& [k, v] : extra) env.push_back(k + "=" + v);
  return env;
}

// Starts `argv` in a process group of its own, stdout and stderr to files.
Child spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, const fs::path& out,
            const fs::path& err) {
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const int out_fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err_fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0 || err_fd < 0) throw sys_error("open " + out.string());
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw sys_error("fork");
  if (pid == 0) {
    ::signal(SIGPIPE, SIG_DFL);  // the bench ignores it; an exec'd program must not
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(out_fd, 1);
    ::dup2(err_fd, 2);
    ::execve(args[0], args.data(), envp.data());
    std::fprintf(stderr, "cannot execute %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no window where a kill of the group misses it
  ::close(out_fd);
  ::close(err_fd);
  Child c;
  c.pid = pid;
  c.out = out;
  c.err = err;
  return c;
}

void poll_children(std::vector<Child>& children) {
  for (auto& c : children) {
    if (c.done) continue;
    int status = 0;
    const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
    if (r == c.pid) {
      c.done = true;
      c.status = status;
      c.ended = Clock::now();
    }
  }
}

// Kills (process group and all) and reaps every child still running.
void kill_children(std::vector<Child>& children) {
  for (auto& c : children) {
    if (c.done) continue;
    ::killpg(c.pid, SIGKILL);
    ::kill(c.pid, SIGKILL);
  }
  for (auto& c : children) {
    if (c.done) continue;
    ::waitpid(c.pid, &c.status, 0);
    c.done = true;
    c.ended = Clock::now();
  }
}

// Waits for every child until `deadline`; false when some still ran.
bool wait_children(std::vector<Child>& children, Clock::time_point deadline) {
  for (;;) {
    poll_children(children);
    if (std::all_of(children.begin(), children.end(), [](const Child& c) { return c.done; })) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
}

// Every child is killed and reaped when the scope ends.
struct ChildrenGuard {
  std::vector<Child>& children;
  ~ChildrenGuard() { kill_children(children); }
};

// N launchers on one endpoint with a no-op worker: wall time until all exited 0.
std::optional<double> run_real(int n, const std::vector<std::string>& launcher,
                               const std::map<std::string, std::string>& extra_env, const std::string& name,
                               double timeout_s, std::string* why) {
  TempDir dir("rdzv-bench-real-");
  const std::uint16_t port = ddp::find_free_port("127.0.0.1");
  std::vector<std::string> argv = launcher;
  for (const std::string& a :
       {fmt::format("--nnodes={}", n), std::string("--nproc_per_node=1"), std::string("--rdzv_backend=c10d"),
        fmt::format("--rdzv_endpoint=127.0.0.1:{}", port), fmt::format("--rdzv_id={}{}", name, n),
        std::string("--no_python"), std::string("/bin/true")}) {
    argv.push_back(a);
  }
  const auto env = environment_with(extra_env);
  std::vector<Child> children;
  ChildrenGuard guard{children};
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    children.push_back(spawn(argv, env, dir.path() / fmt::format("agent{}.out", i),
                             dir.path() / fmt::format("agent{}.err", i)));
  }
  const bool all = wait_children(children, start + std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000)));
  if (!all) kill_children(children);
  for (int i = 0; i < n; ++i) {
    const Child& c = children[static_cast<std::size_t>(i)];
    if (!c.ok()) {
      *why = fmt::format("{} agent {} of {}: {}{}; its stderr:\n{}", name, i, n, c.exit_text(),
                         all ? "" : fmt::format(" (killed after the {:.0f} s timeout)", timeout_s),
                         tail(read_text(c.err)));
      return std::nullopt;
    }
  }
  Clock::time_point last = start;
  for (const auto& c : children) last = std::max(last, c.ended);
  return seconds(last - start);
}

bool port_listens(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

int count_files(const fs::path& dir, const std::string& prefix) {
  int n = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) ++n;
  }
  return n;
}

struct NodeLoss {
  double detect_s = 0;
  double running_s = 0;
  // etcd: the TTLs etcd granted to the agents' leases (empty: not learnt).
  std::vector<std::int64_t> granted_ttls;
};

// 3 agents at --nnodes=2:3; one that does not host the store is SIGKILLed.
// `conf`: --rdzv_conf ("" for the defaults). `etcd`: the agents meet in it
// (--rdzv_backend=etcd) instead of the built-in store one of them hosts.
std::optional<NodeLoss> run_node_loss(const std::string& ddprun, const std::string& conf, double dead_after_s,
                                      const EtcdServer* etcd, std::string* why) {
  TempDir dir("rdzv-bench-loss-");
  const fs::path workers = dir.path() / "w";
  fs::create_directories(workers);
  const fs::path script = dir.path() / "worker.sh";
  std::ofstream(script) << "#!/bin/sh\n"
                           "# rendezvous_bench's node-loss worker: announce, then run until $1/finish exists\n"
                           ": > \"$1/w${WORLD_SIZE}_a${TORCHELASTIC_RESTART_COUNT}_r${RANK}_p${PPID}_$$\"\n"
                           "while [ ! -e \"$1/finish\" ]; do sleep 0.1; done\n";
  const std::uint16_t port = etcd ? 0 : ddp::find_free_port("127.0.0.1");
  std::vector<std::string> argv{ddprun, "--nnodes=2:3", "--nproc_per_node=1"};
  if (etcd) {
    for (const std::string& a : {std::string("--rdzv_backend=etcd"), "--rdzv_endpoint=" + etcd->endpoint(),
                                 std::string("--local_addr=127.0.0.1"), std::string("--rdzv_id=nodeloss-etcd")}) {
      argv.push_back(a);
    }
  } else {
    for (const std::string& a : {std::string("--rdzv_backend=c10d"), fmt::format("--rdzv_endpoint=127.0.0.1:{}", port),
                                 std::string("--rdzv_id=nodeloss")}) {
      argv.push_back(a);
    }
  }
  if (!conf.empty()) argv.push_back("--rdzv_conf=" + conf);
  for (const std::string& a : {std::string("--no_python"), std::string("/bin/sh"), script.string(), workers.string()}) {
    argv.push_back(a);
  }
  const auto env = environment_with({});
  std::vector<Child> agents;
  agents.reserve(3);
  ChildrenGuard guard{agents};
  auto stderr_of_all = [&] {
    std::string text;
    for (const auto& a : agents) text += "--- " + a.err.filename().string() + "\n" + tail(read_text(a.err), 800);
    return text;
  };
  auto start_agent = [&] {
    const std::size_t i = agents.size();
    agents.push_back(spawn(argv, env, dir.path() / fmt::format("agent{}.out", i), dir.path() / fmt::format("agent{}.err", i)));
  };
  auto eventually = [&](const std::function<bool()>& ready, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (ready()) return true;
      poll_children(agents);
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(2ms);
    }
  };
  // The store host first (the first to bind the endpoint hosts it); on etcd
  // nobody hosts it.
  start_agent();
  if (!etcd && !eventually([&] { return port_listens(port); }, 30s)) {
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
  Child& victim = agents[2];
  {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(workers, ec)) {
      const std::string f = entry.path().filename().string();
      if (f.rfind("w3_", 0) == 0 && f.find(fmt::format("_p{}_", victim.pid)) != std::string::npos) {
        fmt::print(stderr, "  node_loss{}: SIGKILL the agent whose worker is {}\n", etcd ? " store=etcd" : "", f);
      }
    }
  }
  const auto killed = Clock::now();
  ::kill(victim.pid, SIGKILL);
  std::optional<Clock::time_point> detected, running;
  const auto limit = std::chrono::milliseconds(static_cast<std::int64_t>(dead_after_s * 1000 * 3)) + 60s;
  eventually(
      [&] {
        if (!detected) {
          for (int i = 0; i < 2; ++i) {
            if (read_text(agents[static_cast<std::size_t>(i)].err).find("was lost") != std::string::npos) {
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
  const bool all = wait_children(agents, Clock::now() + 30s);
  for (int i = 0; i < 2; ++i) {
    const Child& c = agents[static_cast<std::size_t>(i)];
    if (!all || !c.ok()) {
      fmt::print(stderr, "  node_loss: note: surviving agent {} did not exit 0 after finishing ({}):\n{}\n", i,
                 c.exit_text(), tail(read_text(c.err)));
    }
  }
  result.detect_s = seconds(*detected - killed);
  result.running_s = seconds(*running - killed);
  return result;
}

std::string self_dir() {
  return fs::canonical("/proc/self/exe").parent_path().string();
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
  std::string daemon_path, ddprun_path, torchrun_path = "/usr/bin/torchrun", python = "/usr/bin/python3";
  CLI::App app{"rendezvous_bench: the c10d rendezvous at scale (simulated agents), real ddprun agents next to "
               "torchrun, and node-loss detection (see the top of bench/rendezvous/rendezvous_bench.cc)"};
  auto* agents_opt = app.add_option("--agents", agent_counts, "simulated agent counts, comma-separated (0: none)")
                         ->delimiter(',')
                         ->check(CLI::Range(0, 100000));
  auto* etcd_opt = app.add_option("--etcd-agents", etcd_counts,
                                  "simulated agent counts on etcd, comma-separated (0: none)")
                       ->delimiter(',')
                       ->check(CLI::Range(0, 100000));
  app.add_flag("--no-etcd", no_etcd, "no etcd lines (neither simulated agents nor node loss on etcd)");
  app.add_option("--etcd", etcd_path, "the etcd binary the etcd lines start")->capture_default_str();
  auto* real_opt = app.add_option("--real", real_counts, "real agent counts, comma-separated (0: none)")
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
  app.add_option("--timeout", sim.timeout_s, "seconds a simulated round may take before the run fails")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app.add_option("--real-runs", real_runs, "runs of each launcher per real agent count (the median is shown)")
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
  const std::string bin = self_dir();
  if (daemon_path.empty()) daemon_path = bin + "/ddp-rendezvous";
  if (ddprun_path.empty()) ddprun_path = bin + "/ddprun";
  std::string load;
  std::getline(std::ifstream("/proc/loadavg") >> std::ws, load);
  fmt::print(stderr, "rendezvous_bench: {} hardware thread(s), load average {}, open-file limit {}, {} agent "
                     "process(es) x {} thread(s)\n",
             std::thread::hardware_concurrency(), load.substr(0, load.find(' ', load.find(' ', load.find(' ') + 1) + 1)),
             static_cast<unsigned long long>(fds), sim.processes, sim.threads);
  int failures = 0;
  // etcd: why its lines are skipped ("": they are not).
  std::string no_etcd_why;
  if (no_etcd) {
    no_etcd_why = "--no-etcd";
  } else if (::access(etcd_path.c_str(), X_OK) != 0) {
    no_etcd_why = fmt::format("{} is missing or not executable (install etcd, or name it with --etcd)", etcd_path);
  }
  if (!no_etcd_why.empty() && !no_etcd) {
    fmt::print(stderr, "rendezvous_bench: the store=etcd lines are skipped: {}\n", no_etcd_why);
  }

  // 1. Simulated agents: for each N, the built-in store's line, then etcd's.
  std::vector<int> all_counts = agent_counts;
  if (no_etcd_why.empty()) all_counts.insert(all_counts.end(), etcd_counts.begin(), etcd_counts.end());
  std::sort(all_counts.begin(), all_counts.end());
  all_counts.erase(std::unique(all_counts.begin(), all_counts.end()), all_counts.end());
  std::optional<double> etcd_512_s;
  for (int n : all_counts) {
    const bool builtin = std::find(agent_counts.begin(), agent_counts.end(), n) != agent_counts.end();
    const bool on_etcd = no_etcd_why.empty() && std::find(etcd_counts.begin(), etcd_counts.end(), n) != etcd_counts.end();
    // The built-in store's line (the daemon, one TcpStore per agent).
    auto builtin_line = [&] {
      if (n < 2) {
        fmt::print(stderr, "rendezvous agents={}: skipped: a re-form needs at least 2 agents\n", n);
        return;
      }
      if (static_cast<rlim_t>(n) + 64 > fds) {
        fmt::print(stderr, "rendezvous agents={}: skipped: the daemon needs {} descriptors, the limit is {}\n", n,
                   n + 64, static_cast<unsigned long long>(fds));
        return;
      }
      if (n + 1000 > ephemeral_ports()) {
        fmt::print(stderr, "rendezvous agents={}: skipped: only {} ephemeral ports on this host\n", n,
                   ephemeral_ports());
        return;
      }
      try {
        const SimResult r = run_simulated_builtin(n, sim, daemon_path);
        fmt::print("rendezvous agents={} round_s={:.4f} reform_s={:.4f}\n", n, r.round_s, r.reform_s);
        std::fflush(stdout);
      } catch (const std::exception& e) {
        ++failures;
        fmt::print(stderr, "rendezvous agents={}: FAILED: {}\n", n, e.what());
      }
    };
    if (builtin) builtin_line();
    if (!on_etcd) continue;
    if (n < 2) {
      fmt::print(stderr, "rendezvous agents={} store=etcd: skipped: a round needs at least 2 agents\n", n);
      continue;
    }
    // etcd holds an agent's unary connection, its death watch and the blocking
    // waits of the drivers; an agent process as many for its agents.
    if (static_cast<rlim_t>(2 * n) + 256 > fds) {
      fmt::print(stderr, "rendezvous agents={} store=etcd: skipped: etcd needs about {} descriptors, the limit is {}\n",
                 n, 2 * n + 256, static_cast<unsigned long long>(fds));
      continue;
    }
    if (2 * n + 1000 > ephemeral_ports()) {
      fmt::print(stderr, "rendezvous agents={} store=etcd: skipped: only {} ephemeral ports on this host\n", n,
                 ephemeral_ports());
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
    std::optional<TempDir> site;
    const bool have_torchrun =
        fs::exists(torchrun_path) && fs::exists(python) &&
        std::system((python + " -c 'import torch.distributed.run' >/dev/null 2>&1").c_str()) == 0;
    if (have_torchrun) {
      site.emplace("rdzv-bench-site-");
      std::ofstream(site->path() / "sitecustomize.py") << ddp::bench::kTorchrunSiteCustomize;
    } else {
      fmt::print(stderr, "real agents: {} (or torch under {}) is missing: torchrun_s=n/a\n", torchrun_path, python);
    }
    for (int n : real_counts) {
      std::string why;
      std::string ddprun_s = "failed", torchrun_s = have_torchrun ? "failed" : "n/a";
      // The median of --real-runs runs, or nullopt when one failed.
      auto measure = [&](const std::vector<std::string>& launcher, const std::map<std::string, std::string>& env,
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
          fmt::print("node_loss dead_after_s={:g} detect_s={:.3f} running_s={:.3f}\n", s.dead_after_s, r->detect_s,
                     r->running_s);
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
        EtcdServer etcd(etcd_path);
        if (auto r = run_node_loss(ddprun_path, "keep_alive_interval=0.5,keep_alive_max_attempt=2", 1.0, &etcd, &why)) {
          fmt::print("node_loss store=etcd detect_s={:.3f} running_s={:.3f}\n", r->detect_s, r->running_s);
          std::fflush(stdout);
          if (r->granted_ttls.empty()) {
            fmt::print(stderr, "  node_loss store=etcd: could not learn the leases' TTL from etcd; target: survivors "
                               "running within the lease TTL + 0.5 s: not judged (running_s {:.3f})\n",
                       r->running_s);
          } else {
            const auto ttl = *std::max_element(r->granted_ttls.begin(), r->granted_ttls.end());
            fmt::print(stderr, "  node_loss store=etcd: etcd granted the {} agents' leases TTL(s) of {} s (asked: 1 s)\n",
                       r->granted_ttls.size(), fmt::join(r->granted_ttls, ", "));
            fmt::print(stderr, "target: survivors running within the lease TTL + 0.5 s = {:.1f} s of the death: {} "
                               "({:.3f} s)\n",
                       static_cast<double>(ttl) + 0.5, r->running_s <= static_cast<double>(ttl) + 0.5 ? "met" : "NOT met",
                       r->running_s);
          }
        } else {
          ++failures;
          fmt::print(stderr, "node_loss store=etcd: FAILED: {}\n  etcd log (last lines):\n{}\n", why, etcd.log_tail());
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
