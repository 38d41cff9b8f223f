// launch_bench: ddprun against torchrun (torch 1.13 in /usr/bin/python3), side
// by side, in one run.
//
//   1. wall time and peak memory of
//        ddprun   --standalone --nproc_per_node=2 --no_python true
//        torchrun --standalone --nproc_per_node=2 --monitor_interval 0.1 --no_python true
//      Peak memory is ru_maxrss from wait4() on the launcher: the largest
//      resident set of the launcher and the processes it waited for (the
//      workers are `true`, so this is the agent's own peak).
//   2. restart latency: a worker records its death time and SIGKILLs itself on
//      attempt 0; the replacement records its start time (CLOCK_MONOTONIC,
//      system-wide). Latency = replacement start - death, median over runs.
//
// Debian's torchrun 1.13 cannot parse its own default -r/-t values on Python
// 3.11 (IntFlag iteration skips 0), so torchrun runs with a sitecustomize.py on
// PYTHONPATH that fixes Std.from_str. Usage: launch_bench [runs] (default 20).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "../support/torchrun_fix.h"
#include "process_util.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;

struct Sample {
  double wall_ms = 0;
  long maxrss_kib = 0;
  int code = -1;
};

// Not ddp::test::spawn(): the launcher's peak memory comes from wait4(), and
// its output goes to /dev/null, not to files that would take part in the time.
Sample run(const std::vector<std::string>& argv,
           const std::map<std::string, std::string>& extra_env) {
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : ddp::test::environment_with(extra_env)) {
    env_strings.push_back(k + "=" + v);
  }
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  auto start = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    int null_fd = ::open("/dev/null", O_WRONLY);
    ::dup2(null_fd, 1);
    ::dup2(null_fd, 2);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  int status = 0;
  rusage usage{};
  ::wait4(pid, &status, 0, &usage);
  Sample s;
  s.wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  s.maxrss_kib = usage.ru_maxrss;
  s.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

long long read_ns(const fs::path& path) {
  std::ifstream in(path);
  long long v = -1;
  in >> v;
  return v;
}

struct Figures {
  bool ok = false;
  double wall_ms = 0;  // median
  double wall_min_ms = 0;
  long maxrss_kib = 0;    // max over runs
  double restart_ms = 0;  // median
  double restart_min_ms = 0;
  double restart_max_ms = 0;
  int runs = 0;
  int restart_runs = 0;
};

Figures measure(const std::vector<std::string>& launcher,
                const std::map<std::string, std::string>& env, const std::string& restart_worker,
                int runs, int restart_runs) {
  Figures f;
  std::vector<double> walls;
  std::vector<std::string> argv = launcher;
  for (const char* a : {"--standalone", "--nproc_per_node=2", "--no_python", "true"})
    argv.push_back(a);
  for (int i = 0; i < runs; ++i) {
    Sample s = run(argv, env);
    if (s.code != 0) {
      std::fprintf(stderr, "launch_bench: %s exited %d\n", launcher.back().c_str(), s.code);
      return f;
    }
    walls.push_back(s.wall_ms);
    f.maxrss_kib = std::max(f.maxrss_kib, s.maxrss_kib);
  }
  f.wall_ms = median(walls);
  f.wall_min_ms = *std::min_element(walls.begin(), walls.end());
  f.runs = runs;

  std::vector<double> latencies;
  for (int i = 0; i < restart_runs; ++i) {
    const ddp::test::TempDir dir("launch-bench");
    const std::string pattern = dir.str();
    std::vector<std::string> rargv = launcher;
    for (const char* a :
         {"--standalone", "--nproc_per_node=2", "--max_restarts=1", "--no_python"}) {
      rargv.push_back(a);
    }
    rargv.push_back(restart_worker);
    rargv.push_back(pattern);
    Sample s = run(rargv, env);
    long long death = read_ns(fs::path(pattern) / "death");
    long long born = read_ns(fs::path(pattern) / "start_1_0");
    if (s.code != 0 || death < 0 || born < 0) {
      std::fprintf(stderr, "launch_bench: restart run of %s failed (exit %d)\n",
                   launcher.back().c_str(), s.code);
      return f;
    }
    latencies.push_back(static_cast<double>(born - death) / 1e6);
  }
  f.restart_ms = median(latencies);
  f.restart_min_ms = *std::min_element(latencies.begin(), latencies.end());
  f.restart_max_ms = *std::max_element(latencies.begin(), latencies.end());
  f.restart_runs = restart_runs;
  f.ok = true;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  const fs::path bin = ddp::test::exe_dir();
  const std::string ddprun = (bin / "ddprun").string();
  const std::string worker = (bin / "launch_bench_restart_worker").string();

  // sitecustomize.py that fixes torch 1.13's Std.from_str on Python 3.11.
  const ddp::test::TempDir site_dir("launch-bench-site");
  const std::string site = site_dir.str();
  std::ofstream(fs::path(site) / "sitecustomize.py") << ddp::bench::kTorchrunSiteCustomize;

  std::printf("launch_bench: %d runs each (restart latency: %d runs ddprun, %d torchrun)\n", runs,
              runs, std::max(1, runs / 5));
  Figures d = measure({ddprun}, {}, worker, runs, runs);
  const bool have_torch =
      std::system("/usr/bin/python3 -c 'import torch.distributed.run' >/dev/null 2>&1") == 0;
  Figures t;
  if (have_torch) {
    t = measure({"/usr/bin/python3", "-m", "torch.distributed.run", "--monitor_interval", "0.1"},
                {{"PYTHONPATH", site}}, worker, std::max(1, runs / 5), std::max(1, runs / 5));
  }
  if (!d.ok) {
    std::fprintf(stderr, "launch_bench: ddprun runs failed\n");
    return 1;
  }

  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::printf("\n%-44s %14s %14s %10s\n", "metric", "ddprun", "torchrun", "ratio");
  std::printf(
      "%-44s %14.1f %14s %9.0fx\n", "wall time, 2 no-op workers (median ms)", d.wall_ms,
      t.ok ? std::to_string(t.wall_ms).substr(0, std::to_string(t.wall_ms).find('.') + 2).c_str()
           : "n/a",
      ratio(t.wall_ms, d.wall_ms));
  std::printf("%-44s %14.1f %14s\n", "wall time (min ms)", d.wall_min_ms,
              t.ok ? std::to_string(static_cast<long>(t.wall_min_ms)).c_str() : "n/a");
  std::printf("%-44s %14.1f %14.1f %9.1fx\n", "peak RSS of the launcher (MiB)",
              d.maxrss_kib / 1024.0, t.maxrss_kib / 1024.0,
              ratio(static_cast<double>(t.maxrss_kib), static_cast<double>(d.maxrss_kib)));
  std::printf("%-44s %14.2f %14.1f %9.0fx\n", "restart latency, death -> replacement (median ms)",
              d.restart_ms, t.restart_ms, ratio(t.restart_ms, d.restart_ms));
  std::printf("%-44s %7.2f..%-6.2f %6.0f..%-7.0f\n", "restart latency (min..max ms)",
              d.restart_min_ms, d.restart_max_ms, t.restart_min_ms, t.restart_max_ms);
  std::printf(
      "\ntargets: wall >= 50x less than torchrun: %s; agent peak <= 10 MiB: %s; "
      "median restart <= 20 ms: %s\n",
      t.ok ? (ratio(t.wall_ms, d.wall_ms) >= 50 ? "met" : "MISSED") : "n/a (no torch)",
      d.maxrss_kib <= 10 * 1024 ? "met" : "MISSED", d.restart_ms <= 20 ? "met" : "MISSED");
  return 0;
}
