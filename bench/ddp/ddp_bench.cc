// ddp_bench: data-parallel training throughput on 2 local ranks, side by side:
//   - ddp::torch::DistributedDataParallel (libtorch adapter) vs PyTorch's
//     DistributedDataParallel (/usr/bin/python3, torch 1.13, gloo): same MLP,
//     same batch, same bucket cap, synthetic data; at the defaults, with
//     gradient_as_bucket_view on both sides, and with the fp16 compression hook;
//   - the share of all-reduce time hidden behind the backward pass, with
//     buckets and with one whole-model bucket, from each DDP's own runtime
//     statistics under PyTorch's definition (its DDP logger's
//     backward_compute_comm_overlap_time / backward_comm_time): the all-reduce
//     span runs from the first bucket's launch to the last bucket's completion,
//     and the hidden part is the share of it before the backward pass ended;
//   - the step time that communication adds (step time minus the same training
//     without DDP), next to a blocking all-reduce of all gradients;
//   - the plain C++ path (OpenBLAS MLP + ddp::DistributedDataParallel), with
//     copies and with gradient_as_bucket_view (the model accumulates into DDP's
//     buckets), and the share of the step time without communication it keeps;
//   - what progress tracking costs that path: its buckets configuration run
//     with and without a progress page per rank (a sealed one-page memfd named
//     by DDP_PROGRESS_FD, made as ddprun's agent makes it), interleaved (off,
//     on, off, on...) over --repeat runs each so that drift cancels;
//     progress_overhead_pct is (median step time on / median step time off -
//     1) x 100. After each "on" run the driver reads both pages and checks that
//     they recorded the run (steps, and every collective of group "default"
//     issued and completed); a figure from pages that recorded nothing is
//     marked invalid.
// Every configuration runs as 2 processes of this binary (or of the Python
// script) started with env:// variables; rank 0 reports one RESULT line. A run
// that takes longer than --run-timeout is killed (its whole process group) and
// its row reads "timed out after N s"; the other rows still print.
//
//   ddp_bench [--layers 784,1024,1024,1024,1024,10] [--batch 64] [--steps 30] [--bucket-cap-mb 4]
//             [--repeat 3] [--run-timeout 180] [--progress-only]
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cblas.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "ddp/worker/ddp.h"
#include "ddp/worker/init.h"
#include "ddp/worker_contract/env_names.h"
#include "ddp/worker_contract/progress_page.h"
#include "mlp.h"
#include "net_util.h"
#ifdef DDP_WITH_TORCH
#include <torch/torch.h>

#include "ddp/worker/torch/distributed_data_parallel.h"
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string layers = "784,1024,1024,1024,1024,10";
  int batch = 64;
  int steps = 30;
  int warmup = 3;
  double bucket_cap_mb = 4;
  std::string mode;  // worker mode; empty: the driver
  std::string python = "/usr/bin/python3";
  int repeat = 3;
  int run_timeout_s = 180;
  bool progress_only = false;  // only the progress-tracking overhead
};

std::vector<int> parse_layers(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  if (out.size() < 2) throw std::runtime_error("--layers needs at least 2 widths");
  return out;
}

std::size_t param_count(const std::vector<int>& l) {
  std::size_t n = 0;
  for (std::size_t i = 0; i + 1 < l.size(); ++i)
    n += static_cast<std::size_t>(l[i]) * l[i + 1] + l[i + 1];
  return n;
}

// Times `steps` calls of step() between barriers; rank 0 prints the RESULT line.
// `extra` (optional) adds fields to the RESULT line after the timed loop.
template <typename Step>
void timed(const Args& a, ddp::ProcessGroup& pg, Step&& step,
           const std::function<std::string()>& extra = {}) {
  for (int i = 0; i < a.warmup; ++i) step();
  pg.barrier()->wait();
  const auto t0 = Clock::now();
  for (int i = 0; i < a.steps; ++i) step();
  pg.barrier()->wait();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (pg.rank() == 0) {
    std::printf("RESULT samples_per_s=%.1f step_ms=%.3f %s\n",
                static_cast<double>(a.steps) * a.batch * pg.size() / secs, 1000.0 * secs / a.steps,
                extra ? extra().c_str() : "");
    std::fflush(stdout);
  }
}

// Means of the Reducer's own per-step statistics over the timed steps.
struct StatSum {
  double comm = 0, exposed = 0, backward = 0;
  int n = 0;
  void add(const ddp::ReducerStats& s) {
    comm += s.comm_ms;
    exposed += s.exposed_comm_ms;
    backward += s.backward_ms;
    ++n;
  }
  std::string str() const {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "reducer_comm_ms=%.3f reducer_exposed_ms=%.3f reducer_backward_ms=%.3f",
                  n ? comm / n : 0.0, n ? exposed / n : 0.0, n ? backward / n : 0.0);
    return buf;
  }
};

ddp::ReducerOptions reducer_options(const Args& a, bool single_bucket) {
  ddp::ReducerOptions o;
  const double cap = single_bucket ? 1e6 : a.bucket_cap_mb;
  o.bucket_cap_bytes = static_cast<std::size_t>(cap * ddp::kMiB);
  o.first_bucket_cap_bytes =
      single_bucket ? o.bucket_cap_bytes : std::min<std::size_t>(ddp::kMiB, o.bucket_cap_bytes);
  return o;
}

void run_worker(const Args& a) {
  ddp::init_process_group();
  auto pg = ddp::default_group();
  const auto layers = parse_layers(a.layers);
  const std::string& m = a.mode;
  if (m == "allreduce") {
    std::vector<float> grads(param_count(layers), 1.0f);
    timed(a, *pg, [&] { pg->allreduce(ddp::Buffer::of(grads))->wait(); });
  } else if (m == "cpp" || m == "cpp-single" || m == "cpp-local" || m == "cpp-view") {
    openblas_set_num_threads(1);
    ddp::examples::Mlp model(layers, 1);
    std::vector<float> x(static_cast<std::size_t>(a.batch) * layers[0], 0.5f);
    std::vector<std::uint8_t> y(static_cast<std::size_t>(a.batch));
    for (int i = 0; i < a.batch; ++i) {
      x[static_cast<std::size_t>(i) * layers[0] + static_cast<std::size_t>(i) % layers[0]] = 2.0f;
      y[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i % layers.back());
    }
    if (m == "cpp-local") {
      timed(a, *pg, [&] {
        model.forward_loss(x.data(), y.data(), a.batch);
        model.backward(1.0f, {});
        model.sgd_step(0.01f, 0.0f, 0.0f);
      });
    } else {
      std::vector<ddp::Parameter> params;
      for (std::size_t i = 0; i < model.num_params(); ++i) {
        params.push_back({model.name(i), model.shape(i), ddp::Buffer::of(model.value(i)),
                          ddp::Buffer::of(model.own_grad(i).data(), model.own_grad(i).size())});
      }
      ddp::DdpOptions o;
      o.reducer = reducer_options(a, m == "cpp-single");
      const bool view = m == "cpp-view";
      o.reducer.gradient_as_bucket_view = view;
      ddp::DistributedDataParallel d(pg, params, {}, o);
      // With bucket views the model accumulates straight into DDP's buckets;
      // they move once, when the buckets are rebuilt after the first step.
      std::uint64_t layout = 0;
      auto point_grads = [&] {
        if (!view || layout == d.reducer().layout_version()) return;
        layout = d.reducer().layout_version();
        for (std::size_t i = 0; i < model.num_params(); ++i)
          model.grad(i) = static_cast<float*>(d.grad(i).data);
      };
      point_grads();
      StatSum stats;
      timed(
          a, *pg,
          [&] {
            d.begin_forward();
            model.forward_loss(x.data(), y.data(), a.batch);
            d.begin_backward();
            model.backward(1.0f, [&](std::size_t i) { d.grad_ready(i); });
            d.finalize();
            point_grads();
            stats.add(d.stats().reducer);
            model.sgd_step(0.01f, 0.0f, 0.0f);
          },
          [&] { return stats.str(); });
    }
#ifdef DDP_WITH_TORCH
  } else if (m == "torch" || m == "torch-single" || m == "torch-local" || m == "torch-fp16" ||
             m == "torch-view") {
    torch::set_num_threads(1);
    torch::manual_seed(0);
    torch::nn::Sequential net;
    for (std::size_t i = 0; i + 1 < layers.size(); ++i) {
      net->push_back(torch::nn::Linear(layers[i], layers[i + 1]));
      if (i + 2 < layers.size()) net->push_back(torch::nn::ReLU());
    }
    torch::manual_seed(1 + pg->rank());
    auto x = torch::randn({a.batch, layers[0]});
    auto y = torch::randint(0, layers.back(), {a.batch}, torch::kLong);
    torch::optim::SGD opt(net->parameters(), 0.01);
    if (m == "torch-local") {
      timed(a, *pg, [&] {
        opt.zero_grad();
        torch::cross_entropy_loss(net->forward(x), y).backward();
        opt.step();
      });
    } else {
      ddp::torch::DistributedDataParallelOptions o;
      o.reducer = reducer_options(a, m == "torch-single");
      if (m == "torch-fp16") o.reducer.comm_hook = ddp::fp16_compress_hook();
      if (m == "torch-view") o.reducer.gradient_as_bucket_view = true;
      ddp::torch::DistributedDataParallel model(net, pg, o);
      StatSum stats;
      timed(
          a, *pg,
          [&] {
            opt.zero_grad();
            torch::cross_entropy_loss(model.forward(x), y).backward();
            stats.add(model.stats());
            opt.step();
          },
          [&] { return stats.str(); });
    }
#endif
  } else {
    throw std::runtime_error("unknown --mode " + m);
  }
  ddp::destroy_process_group();
}

// What one run of a configuration gave: rank 0's RESULT fields (empty when it
// failed), and whether it was killed for overrunning its deadline.
struct RunOutcome {
  std::map<std::string, double> fields;
  bool timed_out = false;
};

// A configuration's command line, shortened for messages: the program's name
// and its --mode or flags.
std::string describe(const std::vector<std::string>& argv) {
  std::string text = argv.empty() ? "" : argv[0].substr(argv[0].rfind('/') + 1);
  for (std::size_t i = 1; i < argv.size(); ++i) {
    if (argv[i] == "--layers") break;  // the common flags follow; every run has them
    text += " " + argv[i].substr(argv[i].rfind('/') + 1);
  }
  // The Python flags come after the common ones.
  for (std::size_t i = 1; i < argv.size(); ++i) {
    if (argv[i] == "--local" || argv[i] == "--gradient-as-bucket-view" ||
        argv[i] == "--fp16-hook") {
      text += " " + argv[i];
    }
  }
  return text;
}

// true once `pid` has exited; the child stays a zombie (not reaped), so its
// process group cannot go away and its id cannot be reused while we still
// mean to signal it.
bool has_exited(pid_t pid) {
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    return true;  // not our child any more (cannot happen): nothing to wait for
  }
  return info.si_pid == pid;
}

// One rank's progress page, made as ddprun's agent makes it
// (agent/src/progress_page_file.cc): a one-page memfd, sealed against growing
// and shrinking, that starts with a progress::Page, mapped here to be read
// after the run. Close-on-exec here; the rank it is for clears the flag on its
// copy after fork(), so the other rank does not inherit it.
class ProgressPage {
 public:
  static std::unique_ptr<ProgressPage> create() {
    const int fd = ::memfd_create("ddp-bench-progress", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) throw std::runtime_error(std::string("memfd_create: ") + std::strerror(errno));
    void* memory = MAP_FAILED;
    if (::ftruncate(fd, static_cast<off_t>(ddp::progress::kPageBytes)) == 0 &&
        ::fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) == 0) {
      memory =
          ::mmap(nullptr, ddp::progress::kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (memory == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw std::runtime_error(std::string("cannot set up a progress page: ") + std::strerror(err));
    }
    auto* page = new (memory) ddp::progress::Page();  // magic and version; the rest zero
    return std::unique_ptr<ProgressPage>(new ProgressPage(fd, page));
  }
  ~ProgressPage() {
    ::close(fd_);
    ::munmap(page_, ddp::progress::kPageBytes);
  }
  ProgressPage(const ProgressPage&) = delete;
  ProgressPage& operator=(const ProgressPage&) = delete;

  int fd() const { return fd_; }

  // What the rank recorded, as "steps=S default issued=I completed=C" (its
  // group "default"); `ok` when steps > 0 and issued == completed > 0.
  std::string summary(bool& ok) const {
    const std::uint64_t steps = page_->steps.load();
    std::uint64_t issued = 0, completed = 0;
    bool found = false;
    for (const auto& slot : page_->groups) {
      if (slot.in_use.load(std::memory_order_acquire) == 0) continue;
      if (std::strncmp(slot.name, "default", sizeof slot.name) != 0) continue;
      found = true;
      issued = slot.issued.load();
      completed = slot.completed.load();
      break;
    }
    ok = steps > 0 && found && issued > 0 && issued == completed;
    char buf[160];
    std::snprintf(
        buf, sizeof buf, "steps=%llu %s issued=%llu completed=%llu",
        static_cast<unsigned long long>(steps), found ? "default" : "(no group \"default\")",
        static_cast<unsigned long long>(issued), static_cast<unsigned long long>(completed));
    return buf;
  }

 private:
  ProgressPage(int fd, ddp::progress::Page* page) : fd_(fd), page_(page) {}
  int fd_;
  ddp::progress::Page* page_;
};

// Runs `argv` as 2 ranks in a process group of their own; returns rank 0's
// RESULT fields. A run still going after `deadline` (PyTorch 1.13 on Python 3.11
// sometimes never finishes shutting one rank down) has its whole process group
// killed, so whatever the ranks started goes too, and is reported as timed out.
// With `page_fds` (one per rank), rank r inherits page_fds[r] as its
// DDP_PROGRESS_FD; without, no rank records progress.
RunOutcome run_pair(const std::vector<std::string>& argv, std::chrono::seconds deadline,
                    const std::vector<int>& page_fds = {}) {
  if (!page_fds.empty() && page_fds.size() != 2) throw std::runtime_error("2 pages, one a rank");
  std::vector<std::string> page_fd_text;
  for (int fd : page_fds) page_fd_text.push_back(std::to_string(fd));
  const auto give_up_at = Clock::now() + deadline;
  const int port = ddp::test::free_port();
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  const pid_t parent = ::getpid();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    // Rank 0 leads the group, rank 1 joins it; both sides call setpgid so the
    // group exists whichever runs first.
    const pid_t group = rank == 0 ? 0 : pids[0];
    const pid_t pid = ::fork();
    if (pid < 0) {
      if (!pids.empty()) {
        ::kill(-pids[0], SIGKILL);
        ::waitpid(pids[0], nullptr, 0);
      }
      ::close(pipe_fds[0]);
      ::close(pipe_fds[1]);
      throw std::runtime_error("fork failed");
    }
    if (pid == 0) {
      ::setpgid(0, group);
      // The ranks are outside the terminal's process group, so Ctrl-C on the
      // driver does not reach them: die with the driver instead.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", "2", 1);
      ::setenv("LOCAL_WORLD_SIZE", "2", 1);
      ::setenv("OMP_NUM_THREADS", "1", 1);
      ::unsetenv("DDP_STORE_ADDR");
      if (page_fds.empty()) {
        ::unsetenv(ddp::env_names::kProgressFd);
      } else {
        ::fcntl(page_fds[static_cast<std::size_t>(rank)], F_SETFD, 0);  // inherited by exec
        ::setenv(ddp::env_names::kProgressFd, page_fd_text[static_cast<std::size_t>(rank)].c_str(),
                 1);
      }
      if (rank == 0) ::dup2(pipe_fds[1], 1);  // dup2 clears close-on-exec on fd 1
      std::vector<char*> args;
      for (const auto& s : argv) args.push_back(const_cast<char*>(s.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::setpgid(pid, rank == 0 ? pid : pids[0]);
    pids.push_back(pid);
  }
  const pid_t group = pids[0];
  ::close(pipe_fds[1]);
  auto remaining_ms = [&] {
    return static_cast<int>(std::max<std::int64_t>(
        0,
        std::chrono::duration_cast<std::chrono::milliseconds>(give_up_at - Clock::now()).count()));
  };
  // Rank 0's output until it closes stdout (normally at exit) or time runs out.
  std::string out;
  bool timed_out = false;
  char buf[4096];
  while (true) {
    pollfd pfd{pipe_fds[0], POLLIN, 0};
    const int ready = ::poll(&pfd, 1, remaining_ms());
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      timed_out = true;
      break;
    }
    const ssize_t n = ::read(pipe_fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(pipe_fds[0]);
  // Then both ranks' exits, by the same deadline.
  while (!timed_out && !(has_exited(pids[0]) && has_exited(pids[1]))) {
    if (remaining_ms() == 0) {
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // The leader is not reaped yet, so the group id is still ours: kill whatever
  // is left in it (everything on a timeout; any stray grandchild otherwise).
  ::kill(-group, SIGKILL);
  bool ok = !timed_out;
  for (pid_t pid : pids) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  RunOutcome outcome;
  outcome.timed_out = timed_out;
  const auto pos = out.find("RESULT ");
  if (timed_out) {
    std::fprintf(stderr, "ddp_bench: %s timed out after %lld s; its process group was killed%s\n",
                 describe(argv).c_str(), static_cast<long long>(deadline.count()),
                 pos == std::string::npos ? "" : " (its RESULT line is not used)");
    return outcome;
  }
  if (!ok || pos == std::string::npos) {
    std::fprintf(stderr, "ddp_bench: %s failed:\n%s\n", describe(argv).c_str(), out.c_str());
    return outcome;
  }
  std::stringstream ss(out.substr(pos + 7, out.find('\n', pos) - pos - 7));
  std::string kv;
  while (ss >> kv) {
    const auto eq = kv.find('=');
    if (eq != std::string::npos) outcome.fields[kv.substr(0, eq)] = std::stod(kv.substr(eq + 1));
  }
  return outcome;
}

// A configuration whose every run timed out is this one key; see succeeded().
constexpr const char* kTimedOutKey = "timed_out_after_s";

bool succeeded(const std::map<std::string, double>& r) {
  return !r.empty() && !r.count(kTimedOutKey);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string fmt_ms(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", ms);
  return buf;
}

// Progress tracking's cost on the plain C++ path, buckets: `argv` (its "cpp"
// mode) runs --repeat times without progress pages and as many times with a
// fresh page per rank, interleaved (off, on, off, on...) so that drift on a
// shared machine falls on both. Prints a human line with both median step
// times and the runs, then progress_overhead_pct. Each "on" run's pages are
// read back: steps > 0 and, for group "default", issued == completed > 0, or
// the figure is marked invalid (the ranks recorded nothing, so it measured
// nothing).
void progress_overhead(const Args& a, const std::vector<std::string>& argv) {
  const auto deadline = std::chrono::seconds(a.run_timeout_s);
  std::vector<double> off, on;
  std::string off_text, on_text, recorded;
  bool valid = true;
  for (int i = 0; i < std::max(a.repeat, 1); ++i) {
    const RunOutcome r_off = run_pair(argv, deadline);
    if (r_off.fields.count("step_ms")) {
      off.push_back(r_off.fields.at("step_ms"));
      off_text += (off_text.empty() ? "" : " ") + fmt_ms(off.back());
    }
    std::vector<std::unique_ptr<ProgressPage>> pages;
    pages.push_back(ProgressPage::create());
    pages.push_back(ProgressPage::create());
    const RunOutcome r_on = run_pair(argv, deadline, {pages[0]->fd(), pages[1]->fd()});
    if (!r_on.fields.count("step_ms")) continue;  // run_pair said why
    on.push_back(r_on.fields.at("step_ms"));
    on_text += (on_text.empty() ? "" : " ") + fmt_ms(on.back());
    recorded.clear();
    for (std::size_t rank = 0; rank < pages.size(); ++rank) {
      bool ok = false;
      const std::string summary = pages[rank]->summary(ok);
      recorded += (rank == 0 ? "rank 0 " : "; rank " + std::to_string(rank) + " ") + summary;
      if (!ok) {
        valid = false;
        std::fprintf(stderr,
                     "ddp_bench: warning: after \"on\" run %d, rank %zu's progress page did not "
                     "record the run (%s; expected steps > 0 and issued == completed > 0 for "
                     "group \"default\"): progress_overhead_pct is invalid\n",
                     i + 1, rank, summary.c_str());
      }
    }
  }
  std::printf(
      "\nprogress tracking, plain C++ (buckets): step %s ms off, %s ms on (medians of %zu and %zu "
      "runs, interleaved off/on; target: within 1%%)\n"
      "  step ms off: %s; on: %s; pages after the last \"on\" run: %s\n",
      off.empty() ? "n/a" : fmt_ms(median(off)).c_str(),
      on.empty() ? "n/a" : fmt_ms(median(on)).c_str(), off.size(), on.size(),
      off_text.empty() ? "none" : off_text.c_str(), on_text.empty() ? "none" : on_text.c_str(),
      recorded.empty() ? "none" : recorded.c_str());
  if (off.empty() || on.empty()) {
    std::printf("progress_overhead_pct=n/a (every run %s failed)\n", off.empty() ? "off" : "on");
  } else {
    std::printf("progress_overhead_pct=%.2f%s\n", (median(on) / median(off) - 1) * 100,
                valid ? "" : " (INVALID: a progress page did not record its run; see above)");
  }
  std::fflush(stdout);
}

int run_driver(const Args& a, const std::string& self) {
  const auto layers = parse_layers(a.layers);
  const std::vector<std::string> common = {"--layers",        a.layers,
                                           "--batch",         std::to_string(a.batch),
                                           "--steps",         std::to_string(a.steps),
                                           "--warmup",        std::to_string(a.warmup),
                                           "--bucket-cap-mb", std::to_string(a.bucket_cap_mb)};
  // The machine may be shared: each configuration runs `repeat` times and the
  // fastest run counts (the least disturbed one).
  // A run that overran its deadline counts as failed; when every run of a
  // configuration did, its row says so.
  auto best_of = [&](const std::vector<std::string>& argv) {
    std::map<std::string, double> best;
    bool any_timed_out = false;
    for (int i = 0; i < std::max(a.repeat, 1); ++i) {
      auto r = run_pair(argv, std::chrono::seconds(a.run_timeout_s));
      any_timed_out = any_timed_out || r.timed_out;
      auto& f = r.fields;
      if (!f.empty() && (best.empty() || f["samples_per_s"] > best["samples_per_s"])) best = f;
    }
    if (best.empty() && any_timed_out) best[kTimedOutKey] = a.run_timeout_s;
    return best;
  };
  auto mode_argv = [&](const std::string& m) {
    std::vector<std::string> v = {self, "--mode", m};
    v.insert(v.end(), common.begin(), common.end());
    return v;
  };
  auto mode = [&](const std::string& m) { return best_of(mode_argv(m)); };
  if (a.progress_only) {
    std::printf(
        "ddp_bench: progress tracking's overhead, 2 ranks on this machine, plain C++ MLP %s "
        "(%.1f M params), batch %d per rank, %d steps, bucket cap %.1f MiB, %d runs off and %d "
        "on, interleaved, %d s per run at most\n",
        a.layers.c_str(), static_cast<double>(param_count(layers)) / 1e6, a.batch, a.steps,
        a.bucket_cap_mb, std::max(a.repeat, 1), std::max(a.repeat, 1), a.run_timeout_s);
    std::fflush(stdout);
    progress_overhead(a, mode_argv("cpp"));
    return 0;
  }
  std::printf(
      "ddp_bench: 2 ranks on this machine, MLP %s (%.1f M params, %.1f MiB of gradients), "
      "batch %d per rank, %d steps, bucket cap %.1f MiB, best of %d runs, %d s per run at most\n",
      a.layers.c_str(), static_cast<double>(param_count(layers)) / 1e6,
      static_cast<double>(param_count(layers)) * 4 / static_cast<double>(ddp::kMiB), a.batch,
      a.steps, a.bucket_cap_mb, a.repeat, a.run_timeout_s);
  std::fflush(stdout);
  auto allreduce = mode("allreduce");
  auto python = [&](std::vector<std::string> flags) {
    std::vector<std::string> v = {
        a.python,          std::string(DDP_BENCH_DIR) + "/torch_ddp_bench.py",
        "--layers",        a.layers,
        "--batch",         std::to_string(a.batch),
        "--steps",         std::to_string(a.steps),
        "--warmup",        std::to_string(a.warmup),
        "--bucket-cap-mb", std::to_string(a.bucket_cap_mb)};
    v.insert(v.end(), flags.begin(), flags.end());
    return best_of(v);
  };
  auto pytorch = python({});
  auto pytorch_view = python({"--gradient-as-bucket-view"});
  auto pytorch_fp16 = python({"--fp16-hook"});
  auto pytorch_local = python({"--local"});
  using Result = std::map<std::string, double>;
  const Result none;

  std::printf("\n%-46s %10s %9s %12s\n", "configuration", "samples/s", "step ms", "vs PyTorch");
  auto row = [](const char* name, Result& r, const Result& reference) {
    if (r.count(kTimedOutKey)) {
      std::printf(
          "%-46s %s\n", name,
          ("timed out after " + std::to_string(static_cast<int>(r[kTimedOutKey])) + " s").c_str());
    } else if (r.empty()) {
      std::printf("%-46s %10s %9s\n", name, "failed", "-");
    } else if (!succeeded(reference)) {
      std::printf("%-46s %10.1f %9.2f\n", name, r["samples_per_s"], r["step_ms"]);
    } else {
      std::printf("%-46s %10.1f %9.2f %11.2fx\n", name, r["samples_per_s"], r["step_ms"],
                  r["samples_per_s"] / reference.at("samples_per_s"));
    }
  };
  row("blocking all-reduce of all gradients", allreduce, none);
  row("PyTorch DDP (python3, torch 1.13, gloo)", pytorch, none);
  row("PyTorch DDP, gradient_as_bucket_view", pytorch_view, none);
  row("PyTorch DDP, fp16 compress hook", pytorch_fp16, none);
  row("PyTorch without DDP (no communication)", pytorch_local, none);
#ifdef DDP_WITH_TORCH
  auto torch_ddp = mode("torch");
  auto torch_view = mode("torch-view");
  auto torch_fp16 = mode("torch-fp16");
  auto torch_single = mode("torch-single");
  auto torch_local = mode("torch-local");
  row("ddp::torch adapter, buckets", torch_ddp, pytorch);
  row("ddp::torch adapter, gradient_as_bucket_view", torch_view, pytorch_view);
  row("ddp::torch adapter, fp16 compress hook", torch_fp16, pytorch_fp16);
  row("ddp::torch adapter, one whole-model bucket", torch_single, pytorch);
  row("libtorch without communication", torch_local, pytorch_local);
#endif
  auto cpp = mode("cpp");
  auto cpp_view = mode("cpp-view");
  auto cpp_single = mode("cpp-single");
  auto cpp_local = mode("cpp-local");
  row("plain C++ (OpenBLAS MLP + ddp::DDP), buckets", cpp, pytorch);
  row("plain C++, gradient_as_bucket_view", cpp_view, pytorch_view);
  row("plain C++, one whole-model bucket", cpp_single, pytorch);
  row("plain C++ without communication", cpp_local, pytorch_local);

  // hidden = overlap / span, from the DDP's own statistics (-1: not available)
  auto hidden = [](Result& r) {
    if (r.count("torch_comm_ms") && r["torch_comm_ms"] > 0) {
      return std::clamp(r["torch_overlap_ms"] / r["torch_comm_ms"], 0.0, 1.0);
    }
    if (r.count("reducer_comm_ms") && r["reducer_comm_ms"] > 0) {
      return std::clamp(1.0 - r["reducer_exposed_ms"] / r["reducer_comm_ms"], 0.0, 1.0);
    }
    return -1.0;
  };
  std::printf(
      "\nall-reduce hidden behind the backward pass (each DDP's own statistics, PyTorch's "
      "definition:\n"
      "the part of the all-reduce span, first launch to last completion, before backward ended)\n");
  auto hidden_row = [&](const char* name, Result& r) {
    if (!succeeded(r)) return;
    const double span = r.count("torch_comm_ms") ? r["torch_comm_ms"] : r["reducer_comm_ms"];
    const double h = hidden(r);
    if (h < 0) {
      std::printf("%-46s (no statistics)\n", name);
    } else {
      std::printf("%-46s span %6.2f ms, hidden %6.2f ms = %3.0f%%\n", name, span, h * span,
                  100 * h);
    }
  };
  hidden_row("PyTorch DDP, buckets", pytorch);
  hidden_row("PyTorch DDP, gradient_as_bucket_view", pytorch_view);
#ifdef DDP_WITH_TORCH
  hidden_row("ddp::torch adapter, buckets", torch_ddp);
  hidden_row("ddp::torch adapter, gradient_as_bucket_view", torch_view);
  hidden_row("ddp::torch adapter, one whole-model bucket", torch_single);
#endif
  hidden_row("plain C++, buckets", cpp);
  hidden_row("plain C++, gradient_as_bucket_view", cpp_view);
  hidden_row("plain C++, one whole-model bucket", cpp_single);

  std::printf("\nstep time added by communication (step ms minus the same training without DDP)\n");
  auto added = [](const char* name, Result& r, Result& local) {
    if (!succeeded(r) || !succeeded(local)) return;
    std::printf("%-46s %6.2f ms\n", name, r["step_ms"] - local["step_ms"]);
  };
  added("PyTorch DDP, buckets", pytorch, pytorch_local);
  added("PyTorch DDP, gradient_as_bucket_view", pytorch_view, pytorch_local);
#ifdef DDP_WITH_TORCH
  added("ddp::torch adapter, buckets", torch_ddp, torch_local);
  added("ddp::torch adapter, gradient_as_bucket_view", torch_view, torch_local);
  added("ddp::torch adapter, one whole-model bucket", torch_single, torch_local);
#endif
  added("plain C++, buckets", cpp, cpp_local);
  added("plain C++, gradient_as_bucket_view", cpp_view, cpp_local);
  added("plain C++, one whole-model bucket", cpp_single, cpp_local);
  if (succeeded(allreduce)) {
    std::printf("%-46s %6.2f ms\n", "(a blocking all-reduce of all gradients)",
                allreduce["step_ms"]);
  }

  std::printf("\n");
  auto percent = [&](Result& r) {
    const double h = hidden(r);
    return h < 0 ? std::string("n/a")
                 : std::to_string(static_cast<int>(std::lround(100 * h))) + "%";
  };
#ifdef DDP_WITH_TORCH
  if (succeeded(torch_ddp) && succeeded(pytorch)) {
    std::printf("libtorch adapter / PyTorch DDP samples/s: %.2fx (target >= 2x)\n",
                torch_ddp["samples_per_s"] / pytorch["samples_per_s"]);
  }
  std::printf(
      "all-reduce hidden, libtorch adapter: buckets %s, one whole-model bucket %s "
      "(target >= 60%%); PyTorch DDP, buckets: %s\n",
      percent(torch_ddp).c_str(), percent(torch_single).c_str(), percent(pytorch).c_str());
#endif
  std::printf("all-reduce hidden, plain C++: buckets %s, one whole-model bucket %s\n",
              percent(cpp).c_str(), percent(cpp_single).c_str());
  // Step time without communication over step time with DDP (issue 34: >= 90%).
  auto share = [&](Result& r) {
    return succeeded(r) && succeeded(cpp_local)
               ? fmt_ms(100 * cpp_local["step_ms"] / r["step_ms"]) + "%"
               : std::string("n/a");
  };
  std::printf(
      "plain C++ DDP step time without communication / with DDP: buckets %s, "
      "gradient_as_bucket_view %s (target >= 90%%)\n",
      share(cpp).c_str(), share(cpp_view).c_str());
  progress_overhead(a, mode_argv("cpp"));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"ddp_bench: ddp's DDP vs PyTorch DDP on 2 local ranks"};
  app.add_option("--layers", a.layers, "MLP widths, comma-separated")->capture_default_str();
  app.add_option("--batch", a.batch, "samples per rank and step")->capture_default_str();
  app.add_option("--steps", a.steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed steps first")->capture_default_str();
  app.add_option("--bucket-cap-mb", a.bucket_cap_mb, "bucket cap (MiB) for both DDPs")
      ->capture_default_str();
  app.add_option("--python", a.python, "Python with torch 1.13")->capture_default_str();
  app.add_option("--repeat", a.repeat,
                 "runs per configuration; the fastest counts (the progress overhead: "
                 "this many runs off and on each, and the medians count)")
      ->capture_default_str();
  app.add_option("--run-timeout", a.run_timeout_s,
                 "seconds one run of a configuration (2 ranks) may take; one still going then "
                 "is killed with everything it started and reported as timed out")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  app.add_flag("--progress-only", a.progress_only,
               "run only the progress-tracking overhead comparison (plain C++, buckets, "
               "--repeat runs without progress pages and --repeat with, interleaved)");
  app.add_option("--mode", a.mode, "internal: run as one rank of a configuration");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!a.mode.empty()) {
      run_worker(a);
      return 0;
    }
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) throw std::runtime_error("cannot locate /proc/self/exe");
    self[n] = '\0';
    return run_driver(a, self);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_bench: error: %s\n", e.what());
    return 1;
  }
}
