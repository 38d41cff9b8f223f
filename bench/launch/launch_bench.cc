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
//   3. hang detection: ddprun's own, with no torchrun counterpart (torchrun has
//      no hang detector: a job stuck in a collective waits for the collective's
//      timeout, 30 min by default). Each run is
//        ddprun --standalone --nproc_per_node=2 --hang_timeout=T --max_restarts=0
//               --log_dir D --no_python ddprun_progress_worker sleep_before 1 5 --mark_dir M
//      rank 1 blocks forever before step 5's all-reduce, writing M/stall_1
//      (CLOCK_REALTIME) the moment it stalls. detect_s = the mtime of the
//      incident file ddprun writes (D/<run_id>_<random>/attempt_0/hang_0_node0.json,
//      nanoseconds from stat) - the stall's time; the median over runs is
//      printed as "hang detect_s=<s> timeout_s=<T>" (target: detect_s <= T + 1).
//
// Debian's torchrun 1.13 cannot parse its own default -r/-t values on Python
// 3.11 (IntFlag iteration skips 0), so torchrun runs with a sitecustomize.py on
// PYTHONPATH that fixes Std.from_str.
//
//   launch_bench [runs] [--hang_timeout T] [--hang_runs N] [--hang_only]
//
// runs: of 1. and 2. (default 20); T: seconds (default 3); N: hang runs
// (default 3); --hang_only: only 3.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
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

// One hang run (see 3. at the top): how long after the stall began the
// incident file was written, or why there is no figure.
struct HangRun {
  std::optional<double> detect_s;
  std::string problem;
};

HangRun hang_once(const std::string& ddprun, const std::string& worker,
                  const std::string& timeout_s) {
  const ddp::test::TempDir dir("launch-bench-hang");
  const fs::path marks = dir.path() / "marks";
  const fs::path logs = dir.path() / "logs";
  fs::create_directories(marks);
  const std::vector<std::string> argv = {ddprun,
                                         "--standalone",
                                         "--nproc_per_node=2",
                                         "--hang_timeout=" + timeout_s,
                                         "--max_restarts=0",
                                         "--log_dir",
                                         logs.string(),
                                         "--no_python",
                                         worker,
                                         "sleep_before",
                                         "1",
                                         "5",
                                         "--mark_dir",
                                         marks.string()};
  std::vector<ddp::test::Child> children;
  children.push_back(ddp::test::spawn(argv, ddp::test::environment_with({}), dir.path(), "ddprun",
                                      {.own_group = true, .die_with_parent = true}));
  // A ddprun that never notices waits for Gloo's timeout: give up well before.
  const auto limit =
      std::chrono::seconds(60) + std::chrono::duration_cast<std::chrono::seconds>(
                                     std::chrono::duration<double>(std::stod(timeout_s)));
  ddp::test::wait_children(children, std::chrono::steady_clock::now() + limit);
  ddp::test::kill_children(children);
  const ddp::test::Child& c = children.front();
  HangRun result;
  auto fail = [&](const std::string& why) {
    std::string err = ddp::test::read_text(c.err);
    if (err.size() > 2000) err = "..." + err.substr(err.size() - 2000);
    result.problem =
        why + " (ddprun: " +
        (c.killed ? "killed after " + std::to_string(limit.count()) + " s" : c.exit_text()) +
        "); its stderr:\n" + err;
    return result;
  };
  std::optional<fs::path> incident;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(logs, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("hang_", 0) == 0 && name.size() > 5 &&
        name.compare(name.size() - 5, 5, ".json") == 0) {
      incident = it->path();
      break;
    }
  }
  std::ifstream stall_in(marks / "stall_1");
  std::string stall_text;
  stall_in >> stall_text;
  if (stall_text.empty()) return fail("rank 1 never reached its stall");
  if (!incident) return fail("ddprun wrote no incident file");
  struct stat st {};
  if (::stat(incident->c_str(), &st) != 0) return fail("cannot stat " + incident->string());
  const long double written =
      static_cast<long double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec / 1e9L;
  result.detect_s = static_cast<double>(written - std::stold(stall_text));
  // The figure stands either way, but say when the run did not go as expected.
  std::string body = ddp::test::read_text(*incident);
  body.erase(std::remove_if(body.begin(), body.end(),
                            [](unsigned char ch) { return std::isspace(ch) != 0; }),
             body.end());
  if (body.find("\"culprits\":[1]") == std::string::npos) {
    std::fprintf(stderr, "launch_bench: warning: %s does not name rank 1 alone as the culprit\n",
                 incident->c_str());
  }
  if (c.killed) {
    std::fprintf(stderr, "launch_bench: warning: ddprun had not exited %lld s after it started\n",
                 static_cast<long long>(limit.count()));
  } else if (c.code() == 0) {
    std::fprintf(stderr, "launch_bench: warning: ddprun exited 0 after a hang with no restarts\n");
  }
  return result;
}

// "--name=value" or "--name value" at argv[i] (then i moves past the value).
std::optional<std::string> flag_value(int argc, char** argv, int& i, const std::string& name) {
  const std::string arg = argv[i];
  if (arg.rfind(name + "=", 0) == 0) return arg.substr(name.size() + 1);
  if (arg == name && i + 1 < argc) return std::string(argv[++i]);
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 20;
  std::string hang_timeout = "3";
  int hang_runs = 3;
  bool hang_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (auto v = flag_value(argc, argv, i, "--hang_timeout")) {
      hang_timeout = *v;
    } else if (auto n = flag_value(argc, argv, i, "--hang_runs")) {
      hang_runs = std::atoi(n->c_str());
    } else if (arg == "--hang_only") {
      hang_only = true;
    } else if (!arg.empty() && arg[0] != '-') {
      runs = std::max(1, std::atoi(arg.c_str()));
    } else {
      std::fprintf(stderr,
                   "usage: launch_bench [runs] [--hang_timeout SECONDS] [--hang_runs N] "
                   "[--hang_only]\n");
      return 64;
    }
  }
  char* end = nullptr;
  const double hang_timeout_s = std::strtod(hang_timeout.c_str(), &end);
  if (end == hang_timeout.c_str() || *end != '\0' || !(hang_timeout_s > 0) || hang_runs < 1) {
    std::fprintf(stderr, "launch_bench: --hang_timeout needs seconds > 0, --hang_runs N >= 1\n");
    return 64;
  }
  const fs::path bin = ddp::test::exe_dir();
  const std::string ddprun = (bin / "ddprun").string();
  const std::string worker = (bin / "launch_bench_restart_worker").string();
  const std::string progress_worker = (bin / "ddprun_progress_worker").string();

  // 3. Hang detection (ddprun only; torchrun has none).
  auto hang = [&] {
    std::printf(
        "\nhang detection: ddprun --hang_timeout=%s, 2 workers (ddprun_progress_worker), rank 1 "
        "blocks before step 5's all-reduce; detect_s = incident file written - stall began; "
        "runs: %d\n",
        hang_timeout.c_str(), hang_runs);
    std::fflush(stdout);
    if (::access(progress_worker.c_str(), X_OK) != 0) {
      std::printf("hang: skipped: %s is not built (it is a test program: DDP_BUILD_TESTS=ON)\n",
                  progress_worker.c_str());
      return true;
    }
    std::vector<double> detect;
    std::string each;
    for (int i = 0; i < hang_runs; ++i) {
      const HangRun r = hang_once(ddprun, progress_worker, hang_timeout);
      if (!r.detect_s) {
        std::fprintf(stderr, "launch_bench: hang run %d: %s\n", i + 1, r.problem.c_str());
        each += " failed";
        continue;
      }
      detect.push_back(*r.detect_s);
      char buf[32];
      std::snprintf(buf, sizeof buf, " %.2f", *r.detect_s);
      each += buf;
    }
    std::printf("hang runs, detect_s each:%s (s; median over %zu of %d)\n", each.c_str(),
                detect.size(), hang_runs);
    std::printf(
        "torchrun: no hang detector; its figure: none; the job waits for the collective timeout "
        "(30 min by default)\n");
    if (detect.empty()) {
      std::fprintf(stderr, "launch_bench: every hang run failed\n");
      return false;
    }
    const double d = median(detect);
    std::printf("hang detect_s=%.2f timeout_s=%s\n", d, hang_timeout.c_str());
    std::printf("target: detect_s <= timeout_s + 1: %s\n",
                d <= hang_timeout_s + 1 ? "met" : "MISSED");
    std::fflush(stdout);
    return true;
  };
  if (hang_only) return hang() ? 0 : 1;

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
  std::fflush(stdout);
  return hang() ? 0 : 1;
}
