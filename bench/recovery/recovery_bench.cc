// recovery_bench: what a lost node and a joining node cost a training job, in
// place (issue 21: the kept workers re-form their group and the replicas are
// made identical again; a newcomer receives the state from a live peer) and by
// restarting every worker from a checkpoint (--no-recover-in-place: what
// torchrun does). One line per measurement on stdout, then the targets;
// progress, details and errors on stderr.
//
// The job: 3 real ddprun agents on this host (--rdzv_backend=c10d on a free
// loopback port, hosted by the first agent; --nnodes=2:3 --nproc_per_node=1
// --max_restarts=3; --rdzv_conf=keep_alive_interval=I,keep_alive_max_attempt=A,
// last_call_timeout=1, the last call only so that 2 agents start without
// waiting 30 s for a third), each running the demo:
//
//   train_fashion_mnist --hidden 512,256 --batch-size 64 --epochs 1000
//                       --test-limit 1000 --log-every 1000000 --step-times
//                       [restart: --no-recover-in-place --checkpoint <tmp>/ckpt
//                                 --checkpoint-every 100]
//
// (the MLP 784-512-256-10: 535,818 parameters, a state of 4.09 MiB with the
// momentum; about 9 ms a step with 3 ranks on 2 cores, 5.5 ms with 2). With
// --step-times every rank prints "step-time rank=R world=W global_step=G t=T"
// after each optimizer step and "state-sync ... bytes=N seconds=S t=T" after
// each ReplicaState::sync, T being CLOCK_MONOTONIC (this host's, as this
// program's). The bench reads the agents' stdout files (the workers' output
// goes through their agent) as they grow, every 2 ms; every time below is a
// worker's own T, or the bench's CLOCK_MONOTONIC for what it does (kill, start).
//
// The torch modes (torch_in_process, torch_restart) run the same jobs with the PyTorch
// example instead (examples/torch_fashion_mnist_elastic/train.py, the same model and
// flags, DDP on the backend "ddp", ddp_torch.sync_state for the state; /usr/bin/python3,
// --python), which prints the same step-time and state-sync lines (t: time.monotonic(),
// CLOCK_MONOTONIC). They are skipped, with a message on stderr, when the example, ddp_torch
// beside ddprun (../lib/ddprun/python) or torch is missing. There is no join line for
// torch_restart.
//
//   recovery mode=<in_process|restart|torch_in_process|torch_restart> dead_after_s=<I x A>
//            training_again_s=<s> steps_redone=<n>
//     The 3 agents start; once they train as a world of 3 for at least
//     --warmup-steps steps, at the first global step G with G mod C = C/2
//     (C = --checkpoint-every: halfway between two checkpoints, the mean of a
//     failure at a random moment; the same moment in both modes), the third
//     agent (not the store's host) is SIGKILLed with its process group; its
//     worker dies with it (parent-death signal). training_again_s: from the
//     kill to the first step a survivor completed as a world of 2.
//     steps_redone: the highest global step a survivor completed in the world
//     of 3, minus the global step that first step continued from (its G - 1):
//     0 in place; for restart, the steps since the checkpoint it resumed from.
//     The verdict comes I x A after the victim's last keep-alive, which it
//     sent up to I before the kill: training_again_s varies by up to I between
//     runs, in both modes.
//
//   join mode=<in_process|restart|torch_in_process> training_s=<s> state_mib=<m> state_gbps=<g>
//     2 agents train as a world of 2; at the same kind of moment a third agent
//     starts. training_s: from its start (before fork) to the first step its
//     worker completed (in the world of 3). In place, state_mib and state_gbps
//     are the newcomer's ReplicaState::sync: the bytes it received from the
//     root (a survivor), over the transfer's time, in GB/s (1e9 bytes a
//     second). That time runs from the moment the last of the 3 ranks entered
//     sync() (each state-sync line's t - seconds) to the newcomer's return
//     from it, so a rank's wait for the others to get there is left out; it
//     still counts the sync's one small all-reduce of the ranks' liveness.
//     stderr also gives the newcomer's own sync seconds and the survivors'
//     agent report ("state N MiB from rank R in S s"). Restarted workers
//     receive nothing from a live peer (each reads the checkpoint):
//     state_mib=0 state_gbps=0 (stderr shows their fresh-start sync, rank 0's
//     state broadcast to the others).
//
//   allreduce ranks=3 bytes=<state bytes> path=<shm|tcp> busbw_gbps=<b> state_ratio=<state_gbps / b>
//     The reference: allreduce_bench --min S --max S (float32 sum, S = the
//     state's bytes) on 3 agents at --nnodes=3, the same loopback c10d setup.
//     path=shm: as the demo's group all-reduces (the same-host shared-memory
//     path); path=tcp: with DDP_SHM_DISABLE=1 (Gloo's TCP ring, the transport
//     the state's broadcast uses). busbw = algbw x 2(n-1)/n, from the mean time.
//
// Targets (the issue's): in place, training again within dead_after + 0.5 s
// with 0 steps redone; the state transfer at least 0.5x the all-reduce bus
// bandwidth at the state's size (against path=shm; the tcp ratio is shown too);
// for torch_in_process, a joining node training within 1 s of its agent's start.
//
//   recovery_bench [--only recovery,join,allreduce]
//                  [--modes in_process,restart,torch_in_process,torch_restart]
//                  [--hidden 512,256] [--batch-size 64] [--keep-alive-interval 0.5]
//                  [--keep-alive-attempts 2] [--checkpoint-every 100]
//                  [--warmup-steps 100] [--timeout 120]
//
// Everything it starts dies with it: the agents lead process groups of their
// own, get SIGKILL when the bench exits (PR_SET_PDEATHSIG) and are killed at
// the end of each measurement (their workers die with them); every process of
// a job carries DDP_RECOVERY_BENCH_RUN=<its temporary dir> in its environment,
// and after each job the bench checks /proc that none is left (and kills and
// reports any). SIGINT/SIGTERM end the run the same way. The temporary
// directories (agents' output, the checkpoint) are removed. Exit status 1 when
// a measurement failed, a mode did not behave as that mode (no in-place
// recovery reported in place, or one reported when restarting), or a process
// was left over.
#include <dirent.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "net_util.h"
#include "process_state.h"
#include "process_util.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;
namespace test = ddp::test;
using namespace std::chrono_literals;

constexpr const char* kMarker = "DDP_RECOVERY_BENCH_RUN";
constexpr double kMiB = 1024.0 * 1024.0;

std::atomic<bool> g_interrupted{false};
extern "C" void on_signal(int) { g_interrupted = true; }

struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

// CLOCK_MONOTONIC in seconds: the clock of the demo's --step-times lines.
double now_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string tail(const std::string& text, std::size_t bytes = 2000) {
  return text.size() <= bytes ? text : "..." + text.substr(text.size() - bytes);
}

// The C++ demo's modes, then the PyTorch example's.
enum class Mode { kInProcess, kRestart, kTorchInProcess, kTorchRestart };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kInProcess:
      return "in_process";
    case Mode::kRestart:
      return "restart";
    case Mode::kTorchInProcess:
      return "torch_in_process";
    case Mode::kTorchRestart:
      return "torch_restart";
  }
  return "?";
}
// Whether the workers recover in place (else each is restarted from a checkpoint).
bool in_place(Mode m) { return m == Mode::kInProcess || m == Mode::kTorchInProcess; }
// Whether the job runs the PyTorch example (else the C++ demo).
bool runs_torch(Mode m) { return m == Mode::kTorchInProcess || m == Mode::kTorchRestart; }

struct Settings {
  std::string ddprun, demo, allreduce_bench, data_dir;
  std::string python = "/usr/bin/python3";
  std::string torch_example = DDP_TORCH_EXAMPLE;  // train.py in the source tree
  std::string hidden = "512,256";
  int batch_size = 64;
  double interval = 0.5;
  int attempts = 2;
  int checkpoint_every = 100;
  int warmup_steps = 100;
  double timeout_s = 120;
  double allreduce_seconds = 2;
  double dead_after() const { return interval * attempts; }
};

// The key=value words of `line` after `tag`, or nullopt when it has no `tag`.
std::optional<std::map<std::string, std::string>> fields_after(const std::string& line,
                                                               const std::string& tag) {
  const auto at = line.find(tag);
  if (at == std::string::npos) return std::nullopt;
  std::map<std::string, std::string> fields;
  std::istringstream in(line.substr(at + tag.size()));
  for (std::string word; in >> word;) {
    const auto eq = word.find('=');
    if (eq != std::string::npos) fields[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return fields;
}

// A "step-time" line of the demo.
struct Step {
  int rank = 0;
  int world = 0;
  long long global_step = 0;
  double t = 0;
};

// A "state-sync" line of the demo.
struct Sync {
  int rank = 0;
  int root = 0;
  bool received = false;
  bool live = false;
  std::size_t bytes = 0;
  double seconds = 0;
  double t = 0;
};

// What one agent's workers printed so far, read as the file grows.
struct Output {
  fs::path path;
  std::uintmax_t offset = 0;
  std::string partial;
  std::vector<Step> steps;
  std::vector<Sync> syncs;

  void read_new() {
    std::ifstream in(path, std::ios::binary);
    if (!in) return;
    in.seekg(static_cast<std::streamoff>(offset));
    std::string chunk((std::istreambuf_iterator<char>(in)), {});
    offset += chunk.size();
    partial += chunk;
    std::size_t start = 0;
    for (auto nl = partial.find('\n'); nl != std::string::npos; nl = partial.find('\n', start)) {
      parse(partial.substr(start, nl - start));
      start = nl + 1;
    }
    partial.erase(0, start);
  }

  void parse(const std::string& line) {
    try {
      if (auto f = fields_after(line, "step-time ")) {
        steps.push_back({std::stoi(f->at("rank")), std::stoi(f->at("world")),
                         std::stoll(f->at("global_step")), std::stod(f->at("t"))});
      } else if (auto g = fields_after(line, "state-sync ")) {
        syncs.push_back({std::stoi(g->at("rank")), std::stoi(g->at("root")),
                         g->at("received") == "1", g->at("live") == "1",
                         static_cast<std::size_t>(std::stoull(g->at("bytes"))),
                         std::stod(g->at("seconds")), std::stod(g->at("t"))});
      }
    } catch (const std::exception&) {
      // Not one of ours after all (a line that merely contains the tag).
    }
  }

  // The first step completed in a world of `world` after `after`.
  const Step* first_step(int world, double after) const {
    for (const Step& s : steps) {
      if (s.world == world && s.t > after) return &s;
    }
    return nullptr;
  }
};

// The processes (not zombies) whose environment holds `marker`=`value`.
std::vector<pid_t> marked_processes(const std::string& value) {
  std::vector<pid_t> found;
  const std::string needle = std::string(kMarker) + "=" + value + '\0';
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == ::getpid()) continue;
    std::ifstream in("/proc/" + std::string(entry->d_name) + "/environ", std::ios::binary);
    const std::string env((std::istreambuf_iterator<char>(in)), {});
    if (env.find(needle) != std::string::npos && !test::process_dead(static_cast<pid_t>(pid))) {
      found.push_back(static_cast<pid_t>(pid));
    }
  }
  ::closedir(proc);
  return found;
}

int g_leftovers = 0;

// Agents of one job in a temporary directory: their stdout/stderr files there,
// every process of the job marked with the directory in its environment.
class Job {
 public:
  // The agents' argv comes with set_argv() (it may name files in dir()).
  explicit Job(const std::string& name, std::map<std::string, std::string> extra_env = {})
      : dir_("recovery-bench-" + name) {
    extra_env[kMarker] = dir_.str();
    env_ = test::environment_with(extra_env);
  }
  void set_argv(std::vector<std::string> argv) { argv_ = std::move(argv); }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  ~Job() { stop(); }

  const fs::path& dir() const { return dir_.path(); }

  // Starts one more agent; returns its index. started(i): the moment (CLOCK_MONOTONIC).
  std::size_t start_agent() {
    const std::size_t i = children_.size();
    started_.push_back(now_s());
    children_.push_back(test::spawn(argv_, env_, dir_.path(), fmt::format("agent{}", i),
                                    {.own_group = true, .die_with_parent = true}));
    outputs_.emplace_back();
    outputs_.back().path = children_.back().out;
    return i;
  }
  double started(std::size_t i) const { return started_.at(i); }
  const Output& out(std::size_t i) const { return outputs_.at(i); }
  const test::Child& child(std::size_t i) const { return children_.at(i); }
  std::string err(std::size_t i) const { return test::read_text(children_.at(i).err); }
  std::size_t size() const { return children_.size(); }

  // Reaps the agents that ended and reads what their workers printed since.
  void poll() {
    if (g_interrupted) throw Interrupted();
    test::poll_children(children_);
    for (auto& o : outputs_) o.read_new();
  }

  // Polls every 2 ms until `ready` holds (true) or `timeout_s` passed (false).
  bool wait(const std::function<bool()>& ready, double timeout_s) {
    const double deadline = now_s() + timeout_s;
    for (;;) {
      poll();
      if (ready()) return true;
      if (now_s() > deadline) return false;
      std::this_thread::sleep_for(2ms);
    }
  }

  // SIGKILL to agent i and its process group (its worker leads a group of its
  // own and dies with the agent: parent-death signal).
  void kill_agent(std::size_t i) {
    const test::Child& c = children_.at(i);
    ::killpg(c.pid, SIGKILL);
    ::kill(c.pid, SIGKILL);
  }

  // Whether an agent ended (all of them were meant to run until stop()).
  std::optional<std::size_t> ended_early(const std::vector<std::size_t>& which) const {
    for (std::size_t i : which) {
      if (children_.at(i).done) return i;
    }
    return std::nullopt;
  }

  // Every agent's stderr (its last 1,500 bytes), for failure messages.
  std::string stderr_all() const { return test::stderr_of(children_, 1500); }

  // Kills every agent (and so their workers), then checks that no process of
  // the job is left; kills and reports any.
  void stop() {
    if (stopped_) return;
    stopped_ = true;
    test::kill_children(children_);
    std::vector<pid_t> left;
    test::eventually(
        [&] {
          left = marked_processes(dir_.str());
          return left.empty();
        },
        5s, 10ms);
    for (pid_t pid : left) {
      fmt::print(stderr, "recovery_bench: process {} of job {} was left running: killed\n", pid,
                 dir_.str());
      ::kill(pid, SIGKILL);
      ++g_leftovers;
    }
  }

 private:
  test::TempDir dir_;
  std::vector<std::string> argv_;
  std::map<std::string, std::string> env_;
  std::vector<test::Child> children_;
  std::vector<Output> outputs_;
  std::vector<double> started_;
  bool stopped_ = false;
};

std::string rdzv_conf(const Settings& s) {
  return fmt::format("keep_alive_interval={},keep_alive_max_attempt={},last_call_timeout=1",
                     s.interval, s.attempts);
}

// The agents' argv for the demo job (the PyTorch example in the torch modes: the same
// flags, the same lines).
std::vector<std::string> demo_argv(const Settings& s, Mode mode, std::uint16_t port,
                                   const std::string& run_id, const fs::path& dir) {
  std::vector<std::string> argv{s.ddprun,
                                "--nnodes=2:3",
                                "--nproc_per_node=1",
                                "--rdzv_backend=c10d",
                                fmt::format("--rdzv_endpoint=127.0.0.1:{}", port),
                                "--rdzv_id=" + run_id,
                                "--max_restarts=3",
                                "--rdzv_conf=" + rdzv_conf(s),
                                "--no_python"};
  if (runs_torch(mode)) {
    argv.insert(argv.end(), {s.python, "-u", s.torch_example});
  } else {
    argv.push_back(s.demo);
  }
  argv.insert(argv.end(),
              {"--hidden", s.hidden, "--batch-size", std::to_string(s.batch_size), "--epochs",
               "1000", "--test-limit", "1000", "--log-every", "1000000", "--step-times"});
  if (!s.data_dir.empty()) {
    argv.push_back("--data-dir");
    argv.push_back(s.data_dir);
  }
  if (!in_place(mode)) {
    for (const std::string& a : {std::string("--no-recover-in-place"), std::string("--checkpoint"),
                                 (dir / "ckpt").string(), std::string("--checkpoint-every"),
                                 std::to_string(s.checkpoint_every)}) {
      argv.push_back(a);
    }
  }
  return argv;
}

// The agent's in-place recovery report ("ddprun: in-place recovery from round ..."), or "".
std::string recovery_report(const std::string& err) {
  const auto at = err.find("ddprun: in-place recovery from round");
  if (at == std::string::npos) return "";
  return err.substr(at, err.find('\n', at) - at);
}

// Starts agents until `count` run, the first one hosting the store; waits
// until every one's worker trains in a world of `count` and the job is at the
// kill/join moment: past `warmup_steps` steps of that world, at a global step G
// with G mod C = C/2 (C = checkpoint_every). Returns false with `why` set.
bool start_and_reach_moment(Job& job, const Settings& s, std::uint16_t port, std::size_t count,
                            std::string* why) {
  job.start_agent();
  if (!job.wait([&] { return test::port_listens(port) || job.child(0).done; }, 30) ||
      job.child(0).done) {
    *why = "the first agent did not host the store within 30 s:\n" + job.stderr_all();
    return false;
  }
  while (job.size() < count) job.start_agent();
  std::vector<std::size_t> all;
  for (std::size_t i = 0; i < count; ++i) all.push_back(i);
  const int world = static_cast<int>(count);
  std::optional<long long> target;
  const int c = std::max(s.checkpoint_every, 2);
  const bool reached = job.wait(
      [&] {
        if (job.ended_early(all)) return true;
        for (std::size_t i : all) {
          const auto& steps = job.out(i).steps;
          if (steps.empty() || steps.back().world != world) return false;
        }
        const auto& lead = job.out(0).steps;
        if (!target) {
          const Step* first = job.out(0).first_step(world, 0);
          long long t = first->global_step + s.warmup_steps;
          while (t % c != c / 2) ++t;
          target = t;
        }
        return lead.back().global_step >= *target;
      },
      s.timeout_s);
  if (auto i = job.ended_early(all)) {
    *why = fmt::format("agent {} ended ({}) before the job trained as a world of {}:\n{}", *i,
                       job.child(*i).exit_text(), count, job.stderr_all());
    return false;
  }
  if (!reached) {
    *why = fmt::format("the job did not train as a world of {} for {} steps within {:.0f} s:\n{}",
                       count, s.warmup_steps, s.timeout_s, job.stderr_all());
    return false;
  }
  return true;
}

struct RecoveryResult {
  double training_again_s = 0;
  long long steps_redone = 0;
  bool mode_ok = true;
};

// A node lost: see the top of the file.
std::optional<RecoveryResult> run_recovery(const Settings& s, Mode mode, std::string* why) {
  const std::uint16_t port = test::free_port();
  Job job(fmt::format("loss-{}", mode_name(mode)));
  job.set_argv(demo_argv(s, mode, port, fmt::format("loss-{}", mode_name(mode)), job.dir()));
  if (!start_and_reach_moment(job, s, port, 3, why)) return std::nullopt;
  const std::vector<std::size_t> survivors{0, 1};
  const long long at_kill = job.out(0).steps.back().global_step;
  const double killed = now_s();
  job.kill_agent(2);
  // Both survivors train as a world of 2.
  const bool again = job.wait(
      [&] {
        if (job.ended_early(survivors)) return true;
        for (std::size_t i : survivors) {
          if (job.out(i).first_step(2, killed) == nullptr) return false;
        }
        return true;
      },
      s.dead_after() * 3 + s.timeout_s);
  if (auto i = job.ended_early(survivors)) {
    *why = fmt::format("surviving agent {} ended ({}) after the kill:\n{}", *i,
                       job.child(*i).exit_text(), job.stderr_all());
    return std::nullopt;
  }
  if (!again) {
    *why = fmt::format("the survivors did not train again as a world of 2 within {:.0f} s:\n{}",
                       s.dead_after() * 3 + s.timeout_s, job.stderr_all());
    return std::nullopt;
  }
  // The first step after the re-form, by either survivor.
  const Step* first = nullptr;
  for (std::size_t i : survivors) {
    const Step* f = job.out(i).first_step(2, killed);
    if (first == nullptr || f->t < first->t) first = f;
  }
  // The highest step the survivors completed in the world of 3.
  long long before = 0;
  for (std::size_t i : survivors) {
    for (const Step& st : job.out(i).steps) {
      if (st.world == 3 && st.t < first->t) before = std::max(before, st.global_step);
    }
  }
  RecoveryResult r;
  r.training_again_s = first->t - killed;
  r.steps_redone = before - (first->global_step - 1);
  // In place, the agents report the recovery once their workers synced: give them a moment.
  std::string report;
  job.wait(
      [&] {
        report = recovery_report(job.err(0) + job.err(1));
        return !report.empty();
      },
      in_place(mode) ? 5.0 : 0.0);
  fmt::print(stderr,
             "  recovery {}: killed agent 2 at global step {} (lead's last line); the survivors "
             "had completed step {}; the first step after the re-form was {} ({:.3f} s after "
             "the kill){}\n",
             mode_name(mode), at_kill, before, first->global_step, r.training_again_s,
             report.empty() ? "" : "\n  " + report);
  r.mode_ok = in_place(mode) == !report.empty();
  if (!r.mode_ok) {
    fmt::print(stderr, "  recovery {}: WRONG MODE: the agents {}\n", mode_name(mode),
               report.empty() ? "reported no in-place recovery" : "reported an in-place recovery");
  }
  return r;
}

struct JoinResult {
  double training_s = 0;
  std::size_t state_bytes = 0;
  double state_seconds = 0;
  bool mode_ok = true;
};

// A node joins: see the top of the file.
std::optional<JoinResult> run_join(const Settings& s, Mode mode, std::string* why) {
  const std::uint16_t port = test::free_port();
  Job job(fmt::format("join-{}", mode_name(mode)));
  job.set_argv(demo_argv(s, mode, port, fmt::format("join-{}", mode_name(mode)), job.dir()));
  if (!start_and_reach_moment(job, s, port, 2, why)) return std::nullopt;
  const long long at_start = job.out(0).steps.back().global_step;
  const std::size_t newcomer = job.start_agent();
  const double started = job.started(newcomer);
  const std::vector<std::size_t> all{0, 1, newcomer};
  const bool trains = job.wait(
      [&] {
        if (job.ended_early(all)) return true;
        return job.out(newcomer).first_step(3, started) != nullptr;
      },
      s.timeout_s);
  if (auto i = job.ended_early(all)) {
    *why = fmt::format("agent {} ended ({}) after the third one started:\n{}", *i,
                       job.child(*i).exit_text(), job.stderr_all());
    return std::nullopt;
  }
  if (!trains) {
    *why = fmt::format("the new agent's worker completed no step within {:.0f} s:\n{}", s.timeout_s,
                       job.stderr_all());
    return std::nullopt;
  }
  // The survivors' recovery report comes once every kept worker synced: give it a moment.
  std::string report;
  job.wait(
      [&] {
        report = recovery_report(job.err(0) + job.err(1));
        return !report.empty();
      },
      in_place(mode) ? 5.0 : 0.0);
  const Step* first = job.out(newcomer).first_step(3, started);
  long long before = 0;  // the highest step the first 2 agents' workers completed as 2
  for (std::size_t i : {std::size_t{0}, std::size_t{1}}) {
    for (const Step& st : job.out(i).steps) {
      if (st.world == 2 && st.t < first->t) before = std::max(before, st.global_step);
    }
  }
  JoinResult r;
  r.training_s = first->t - started;
  std::string sync_text = "no state-sync line";
  const Sync* received = nullptr;
  for (const Sync& sy : job.out(newcomer).syncs) {
    sync_text = fmt::format("its state-sync: root {} received={} live={} {} bytes in {:.6f} s",
                            sy.root, sy.received ? 1 : 0, sy.live ? 1 : 0, sy.bytes, sy.seconds);
    if (in_place(mode) && sy.received && sy.live) received = &sy;
  }
  if (received != nullptr) {
    // The transfer proper: from the moment the last of the 3 ranks entered
    // sync() (each line's t - seconds) to the newcomer's return from it; the
    // newcomer's own seconds also count its wait for the survivors to get there.
    r.state_bytes = received->bytes;
    r.state_seconds = received->seconds;
    double last_entry = received->t - received->seconds;
    int entered = 1;
    for (std::size_t i : {std::size_t{0}, std::size_t{1}}) {
      const auto& syncs = job.out(i).syncs;
      if (!syncs.empty() && syncs.back().t > started) {
        last_entry = std::max(last_entry, syncs.back().t - syncs.back().seconds);
        ++entered;
      }
    }
    if (entered == 3) {
      r.state_seconds = received->t - last_entry;
      sync_text += fmt::format(
          "; the last rank entered sync() {:.6f} s after the newcomer: the transfer took {:.6f} s",
          last_entry - (received->t - received->seconds), r.state_seconds);
    } else {
      sync_text +=
          "; the survivors' state-sync lines are missing: state_gbps from the "
          "newcomer's own seconds";
    }
  }
  fmt::print(stderr,
             "  join {}: the third agent started at global step {} (lead's last line); its "
             "worker's first step was {} ({:.3f} s after the start; steps redone: {}); {}{}\n",
             mode_name(mode), at_start, first->global_step, r.training_s,
             before - (first->global_step - 1), sync_text, report.empty() ? "" : "\n  " + report);
  r.mode_ok = in_place(mode) == !report.empty() && (!in_place(mode) || r.state_bytes > 0);
  if (!r.mode_ok) {
    fmt::print(stderr,
               "  join {}: WRONG MODE: in-place recovery {} by the agents, the state {} from a "
               "live peer by the newcomer\n",
               mode_name(mode), report.empty() ? "not reported" : "reported",
               r.state_bytes > 0 ? "received" : "did not receive");
  }
  return r;
}

// The number after "key": in allreduce_bench's one-line JSON; throws when there is none.
double json_number(const std::string& json, const std::string& key) {
  const std::string quoted = "\"" + key + "\":";
  const auto at = json.find(quoted);
  if (at == std::string::npos) throw std::runtime_error("no " + key);
  return std::stod(json.substr(at + quoted.size()));
}

struct AllreduceResult {
  double busbw_gbps = 0;
  double time_us = 0;
};

// allreduce_bench --min S --max S on 3 agents (--nnodes=3), shared memory on or off.
std::optional<AllreduceResult> run_allreduce(const Settings& s, std::size_t bytes, bool shm,
                                             std::string* why) {
  const std::uint16_t port = test::free_port();
  std::map<std::string, std::string> env;
  if (!shm) env["DDP_SHM_DISABLE"] = "1";
  Job job(shm ? "allreduce-shm" : "allreduce-tcp", env);
  const fs::path json = job.dir() / "allreduce.jsonl";
  job.set_argv({s.ddprun, "--nnodes=3", "--nproc_per_node=1", "--rdzv_backend=c10d",
                fmt::format("--rdzv_endpoint=127.0.0.1:{}", port),
                std::string("--rdzv_id=allreduce-") + (shm ? "shm" : "tcp"), "--no_python",
                s.allreduce_bench, "--min", std::to_string(bytes), "--max", std::to_string(bytes),
                "--seconds", fmt::format("{}", s.allreduce_seconds), "--json", json.string()});
  job.start_agent();
  if (!job.wait([&] { return test::port_listens(port) || job.child(0).done; }, 30) ||
      job.child(0).done) {
    *why = "the first agent did not host the store within 30 s:\n" + job.stderr_all();
    return std::nullopt;
  }
  job.start_agent();
  job.start_agent();
  const bool done = job.wait(
      [&] { return job.child(0).done && job.child(1).done && job.child(2).done; }, s.timeout_s);
  for (std::size_t i = 0; i < 3; ++i) {
    if (!done || !job.child(i).ok()) {
      *why = fmt::format("allreduce_bench agent {}: {}:\n{}", i, job.child(i).exit_text(),
                         job.stderr_all());
      return std::nullopt;
    }
  }
  const std::string text = test::read_text(json);
  try {
    AllreduceResult r;
    r.busbw_gbps = json_number(text, "busbw");
    r.time_us = json_number(text, "time_us");
    return r;
  } catch (const std::exception&) {
    *why = "allreduce_bench wrote no figure: " + text + "\n" + test::read_text(job.child(0).out);
    return std::nullopt;
  }
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

bool has(const std::vector<std::string>& items, const std::string& item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

// Why the torch modes cannot run here (no example, no ddp_torch beside ddprun, no torch
// for s.python), or "" when they can.
std::string torch_missing(const Settings& s) {
  if (!fs::exists(s.torch_example)) return s.torch_example + " does not exist";
  const fs::path package = fs::path(s.ddprun).parent_path() / "../lib/ddprun/python/ddp_torch";
  if (!fs::exists(package / "__init__.py")) {
    return "ddp_torch is not built beside ddprun (" + package.lexically_normal().string() +
           "; configure with -DDDP_WITH_TORCH=ON)";
  }
  test::TempDir dir("recovery-bench-torch");
  const auto found =
      test::run({s.python, "-c",
                 "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"},
                test::environment_with(), dir.path(), 30s);
  if (found.code != 0) return s.python + " has no module named 'torch'";
  return "";
}

// The state transfer's target for a join in place (`what` names it), against the
// all-reduce's bus bandwidth (shared memory; TCP's beside it); nothing without either.
void print_state_target(const std::string& what, const JoinResult& a,
                        const std::optional<AllreduceResult>& shm,
                        const std::optional<AllreduceResult>& tcp) {
  if (a.state_seconds <= 0 || !shm) return;
  const double gbps = static_cast<double>(a.state_bytes) / a.state_seconds / 1e9;
  const double ratio = gbps / shm->busbw_gbps;
  fmt::print(
      "target: {} >= 0.5x the all-reduce busbw at {:.2f} MiB: {:.2f} / {:.2f} GB/s = {:.2f}x: "
      "{}{}\n",
      what, static_cast<double>(a.state_bytes) / kMiB, gbps, shm->busbw_gbps, ratio,
      ratio >= 0.5 ? "met" : "NOT MET",
      tcp ? fmt::format(" (against the TCP all-reduce, {:.2f} GB/s: {:.2f}x)", tcp->busbw_gbps,
                        gbps / tcp->busbw_gbps)
          : "");
}

// The targets of one program's in-place mode, and its ratios to the restart mode.
void print_recovery_targets(const Settings& s, const std::map<Mode, RecoveryResult>& recovered,
                            Mode in, Mode restart) {
  if (!recovered.count(in)) return;
  const auto& r = recovered.at(in);
  const bool met = r.training_again_s <= s.dead_after() + 0.5 && r.steps_redone == 0;
  fmt::print(
      "target: {} training again within dead_after_s + 0.5 = {:.1f} s with 0 steps "
      "redone: {:.3f} s, {} redone: {}\n",
      mode_name(in), s.dead_after() + 0.5, r.training_again_s, r.steps_redone,
      met ? "met" : "NOT MET");
  if (recovered.count(restart)) {
    const auto& q = recovered.at(restart);
    fmt::print("recovery: {} {:.3f} s against {} {:.3f} s ({:.2f}x), {} against {} steps redone\n",
               mode_name(in), r.training_again_s, mode_name(restart), q.training_again_s,
               r.training_again_s > 0 ? q.training_again_s / r.training_again_s : 0.0,
               r.steps_redone, q.steps_redone);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  std::string only = "recovery,join,allreduce";
  std::string modes_text = "in_process,restart,torch_in_process,torch_restart";
  CLI::App app{
      "recovery_bench: a lost and a joining node, recovered in place and by restarts, on 3 ddprun "
      "agents running the demo (see the top of bench/recovery/recovery_bench.cc)"};
  app.add_option("--only", only, "parts to run: recovery, join, allreduce")->capture_default_str();
  app.add_option("--modes", modes_text,
                 "in_process, restart (the demo), torch_in_process, torch_restart (the PyTorch "
                 "example; no join line for torch_restart)")
      ->capture_default_str();
  app.add_option("--hidden", s.hidden, "the demo's hidden layers")->capture_default_str();
  app.add_option("--batch-size", s.batch_size, "the demo's batch per rank")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--keep-alive-interval", s.interval, "seconds")
      ->check(CLI::Range(0.05, 60.0))
      ->capture_default_str();
  app.add_option("--keep-alive-attempts", s.attempts, "keep_alive_max_attempt")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--checkpoint-every", s.checkpoint_every,
                 "restart mode's checkpoint interval in steps; the kill and the join come "
                 "halfway between two")
      ->check(CLI::Range(2, 1000000))
      ->capture_default_str();
  app.add_option("--warmup-steps", s.warmup_steps, "steps of the full world before the event")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--timeout", s.timeout_s, "seconds each wait may take")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app.add_option("--allreduce-seconds", s.allreduce_seconds, "allreduce_bench's time budget")
      ->capture_default_str();
  app.add_option("--data-dir", s.data_dir, "the demo's --data-dir (default: its own)");
  app.add_option("--ddprun", s.ddprun, "ddprun (default: next to this program)");
  app.add_option("--demo", s.demo, "train_fashion_mnist (default: next to this program)");
  app.add_option("--torch-example", s.torch_example, "the PyTorch example's train.py")
      ->capture_default_str();
  app.add_option("--python", s.python, "the Python that runs it (with torch)")
      ->capture_default_str();
  app.add_option("--allreduce-bench", s.allreduce_bench,
                 "allreduce_bench (default: next to this program)");
  CLI11_PARSE(app, argc, argv);
  const auto parts = split(only);
  const auto modes_list = split(modes_text);
  std::vector<Mode> modes;
  if (has(modes_list, "in_process")) modes.push_back(Mode::kInProcess);
  if (has(modes_list, "restart")) modes.push_back(Mode::kRestart);
  const std::string bin = test::exe_dir();
  if (s.ddprun.empty()) s.ddprun = bin + "/ddprun";
  if (s.demo.empty()) s.demo = bin + "/train_fashion_mnist";
  if (s.allreduce_bench.empty()) s.allreduce_bench = bin + "/allreduce_bench";
  if (has(modes_list, "torch_in_process") || has(modes_list, "torch_restart")) {
    if (const std::string why = torch_missing(s); !why.empty()) {
      fmt::print(stderr,
                 "recovery_bench: no torch_in_process or torch_restart lines (the PyTorch "
                 "example): {}\n",
                 why);
    } else {
      if (has(modes_list, "torch_in_process")) modes.push_back(Mode::kTorchInProcess);
      if (has(modes_list, "torch_restart")) modes.push_back(Mode::kTorchRestart);
    }
  }

  ::signal(SIGPIPE, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  std::string load;
  std::getline(std::ifstream("/proc/loadavg") >> std::ws, load);
  fmt::print(stderr,
             "recovery_bench: {} hardware thread(s), load average {}; the demo --hidden {} "
             "--batch-size {}; keep-alives {} s x {}; restart mode checkpoints every {} steps\n",
             std::thread::hardware_concurrency(),
             load.substr(0, load.find(' ', load.find(' ') + 1)), s.hidden, s.batch_size, s.interval,
             s.attempts, s.checkpoint_every);
  int failures = 0;
  std::map<Mode, RecoveryResult> recovered;
  std::map<Mode, JoinResult> joined;
  std::optional<AllreduceResult> shm, tcp;
  std::size_t state_bytes = 0;
  try {
    if (has(parts, "recovery")) {
      for (Mode m : modes) {
        std::string why;
        if (auto r = run_recovery(s, m, &why)) {
          recovered[m] = *r;
          if (!r->mode_ok) ++failures;
          fmt::print(
              "recovery mode={} dead_after_s={:.1f} training_again_s={:.3f} steps_redone={}\n",
              mode_name(m), s.dead_after(), r->training_again_s, r->steps_redone);
        } else {
          ++failures;
          fmt::print("recovery mode={} dead_after_s={:.1f} training_again_s=failed\n", mode_name(m),
                     s.dead_after());
          fmt::print(stderr, "recovery mode={}: {}\n", mode_name(m), tail(why, 6000));
        }
        std::fflush(stdout);
      }
    }
    if (has(parts, "join")) {
      for (Mode m : modes) {
        if (m == Mode::kTorchRestart) continue;  // a restarted PyTorch job's join is a restart
        std::string why;
        if (auto r = run_join(s, m, &why)) {
          joined[m] = *r;
          if (!r->mode_ok) ++failures;
          if (r->state_bytes > 0 && !runs_torch(m)) state_bytes = r->state_bytes;
          const double mib = static_cast<double>(r->state_bytes) / kMiB;
          const double gbps = r->state_seconds > 0
                                  ? static_cast<double>(r->state_bytes) / r->state_seconds / 1e9
                                  : 0.0;
          fmt::print("join mode={} training_s={:.3f} state_mib={:.2f} state_gbps={:.2f}\n",
                     mode_name(m), r->training_s, mib, gbps);
        } else {
          ++failures;
          fmt::print("join mode={} training_s=failed\n", mode_name(m));
          fmt::print(stderr, "join mode={}: {}\n", mode_name(m), tail(why, 6000));
        }
        std::fflush(stdout);
      }
    }
    if (has(parts, "allreduce")) {
      if (state_bytes == 0) {
        // No in-place join measured: the demo's state at these settings, from a short run alone.
        test::TempDir dir("recovery-bench-size");
        std::vector<std::string> argv{s.demo,
                                      "--hidden",
                                      s.hidden,
                                      "--batch-size",
                                      std::to_string(s.batch_size),
                                      "--max-steps",
                                      "1",
                                      "--train-limit",
                                      "1000",
                                      "--test-limit",
                                      "100",
                                      "--step-times"};
        if (!s.data_dir.empty()) {
          argv.push_back("--data-dir");
          argv.push_back(s.data_dir);
        }
        const auto run = test::run(argv, test::environment_with(), dir.path(), 60s);
        Output o;
        for (const auto& line : test::lines_of(run.out)) o.parse(line);
        // Alone, sync() broadcasts nothing: the size is the registered state's,
        // parameters and momentum (4 bytes each) plus 3 counters.
        if (!o.syncs.empty()) state_bytes = o.syncs.front().bytes;
        if (state_bytes == 0) {
          fmt::print(stderr, "recovery_bench: the demo's state size is unknown (its output: {})\n",
                     tail(run.output()));
        }
      }
      state_bytes -= state_bytes % 4;
      for (bool on : {true, false}) {
        if (state_bytes == 0) break;
        std::string why;
        auto r = run_allreduce(s, state_bytes, on, &why);
        const double state_gbps =
            joined.count(Mode::kInProcess) && joined[Mode::kInProcess].state_seconds > 0
                ? static_cast<double>(joined[Mode::kInProcess].state_bytes) /
                      joined[Mode::kInProcess].state_seconds / 1e9
                : 0.0;
        if (r) {
          (on ? shm : tcp) = r;
          fmt::print("allreduce ranks=3 bytes={} path={} busbw_gbps={:.2f} state_ratio={}\n",
                     state_bytes, on ? "shm" : "tcp", r->busbw_gbps,
                     state_gbps > 0 ? fmt::format("{:.2f}", state_gbps / r->busbw_gbps) : "n/a");
          fmt::print(stderr, "  allreduce path={}: {:.1f} us per op (mean)\n", on ? "shm" : "tcp",
                     r->time_us);
        } else {
          ++failures;
          fmt::print("allreduce ranks=3 bytes={} path={} busbw_gbps=failed\n", state_bytes,
                     on ? "shm" : "tcp");
          fmt::print(stderr, "allreduce path={}: {}\n", on ? "shm" : "tcp", tail(why, 6000));
        }
        std::fflush(stdout);
      }
    }
  } catch (const Interrupted&) {
    fmt::print(stderr, "recovery_bench: interrupted; everything it started is stopped\n");
    return 130;
  } catch (const std::exception& e) {
    fmt::print(stderr, "recovery_bench: error: {}\n", e.what());
    return 1;
  }

  // Targets.
  print_recovery_targets(s, recovered, Mode::kInProcess, Mode::kRestart);
  print_recovery_targets(s, recovered, Mode::kTorchInProcess, Mode::kTorchRestart);
  if (joined.count(Mode::kInProcess) && joined.count(Mode::kRestart)) {
    const auto& a = joined[Mode::kInProcess];
    const auto& b = joined[Mode::kRestart];
    fmt::print("join: in_process {:.3f} s against restart {:.3f} s ({:.2f}x)\n", a.training_s,
               b.training_s, a.training_s > 0 ? b.training_s / a.training_s : 0.0);
  }
  if (joined.count(Mode::kInProcess)) {
    print_state_target("state transfer", joined[Mode::kInProcess], shm, tcp);
  }
  if (joined.count(Mode::kTorchInProcess)) {
    const auto& a = joined[Mode::kTorchInProcess];
    fmt::print(
        "target: torch_in_process joining node training within 1 s of its agent's start: "
        "{:.3f} s: {}\n",
        a.training_s, a.training_s <= 1.0 ? "met" : "NOT MET");
    print_state_target("torch_in_process state transfer", a, shm, tcp);
  }
  if (g_leftovers > 0) {
    fmt::print(stderr, "recovery_bench: {} process(es) were left over (killed)\n", g_leftovers);
    ++failures;
  }
  return failures == 0 ? 0 : 1;
}
