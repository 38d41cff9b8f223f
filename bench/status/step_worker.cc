// status_bench_worker: the job of status_bench's overhead runs. A DDP worker
// (ddp::worker, Gloo) whose steps do a fixed amount of real work, so that CPU
// taken from it (by the agent answering scrapes) shows as longer steps:
//
//   status_bench_worker <out_dir> <steps> <passes>
//
// Each step: forward (nothing), `passes` passes of multiply-adds over 64 Ki
// floats, the result written as the gradient of a 64 Ki-float parameter, then
// DDP's all-reduce of it (finalize). The rank times every step after the first
// 5 (warm-up) and writes "<mean step ms> <steps timed>" to <out_dir>/rank_<r>.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddp/worker/ddp.h"
#include "ddp/worker/init.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: status_bench_worker <out_dir> <steps> <passes>\n");
    return 64;
  }
  const std::string out_dir = argv[1];
  const long steps = std::atol(argv[2]);
  const long passes = std::atol(argv[3]);
  constexpr long kWarmup = 5;
  if (steps <= kWarmup || passes < 1) {
    std::fprintf(stderr, "status_bench_worker: needs steps > %ld and passes >= 1\n", kWarmup);
    return 64;
  }

  ddp::init_process_group();
  const int rank = ddp::rank();
  constexpr std::size_t kN = 64 * 1024;
  std::vector<float> w(kN, 1.0f), g(kN), x(kN), acc(kN, 0.0f);
  for (std::size_t i = 0; i < kN; ++i) x[i] = static_cast<float>(i % 97) * 0.01f;
  std::vector<ddp::Parameter> params = {{"w", {}, ddp::Buffer::of(w), ddp::Buffer::of(g)}};
  ddp::DistributedDataParallel model(ddp::default_group(), params);

  double timed_ms = 0;
  for (long step = 0; step < steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    model.begin_forward();
    for (long p = 0; p < passes; ++p) {
      for (std::size_t i = 0; i < kN; ++i) acc[i] = acc[i] * 0.999f + x[i] * w[i];
    }
    model.begin_backward();
    ddp::Buffer grad = model.grad(0);
    std::copy(acc.begin(), acc.end(), static_cast<float*>(grad.data));
    model.grad_ready(0);
    model.finalize();
    const auto end = std::chrono::steady_clock::now();
    if (step >= kWarmup) timed_ms += std::chrono::duration<double, std::milli>(end - start).count();
  }
  const long timed = steps - kWarmup;
  const std::string path = out_dir + "/rank_" + std::to_string(rank);
  if (FILE* f = std::fopen((path + ".tmp").c_str(), "w")) {
    // acc's first value keeps the work from being optimized away.
    std::fprintf(f, "%.6f %ld %g\n", timed_ms / static_cast<double>(timed), timed, acc[1]);
    std::fclose(f);
    std::rename((path + ".tmp").c_str(), path.c_str());
  }
  ddp::destroy_process_group();
  return 0;
}
