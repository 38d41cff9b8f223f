// allreduce_bench: float32 SUM allreduce over ddp's Gloo backend, sizes 4 KiB
// to 256 MiB, with nccl-tests' figures: time per op, algbw = bytes / time,
// busbw = algbw * 2(n-1)/n. Run it under ddprun (or env://) with 2+ ranks.
//
//   ddprun --standalone --nproc_per_node=2 allreduce_bench [--min 4K] [--max 256M]
//          [--algorithm auto|ring|bcube|direct] [--json out.jsonl]
//
// Rank 0 prints the table (and writes one JSON object per size with --json,
// with the algorithm the group ran).
//
// --verify: instead, checks the default group's all-reduce against a flat ring
// group over the same ranks (int64 bit for bit, float32 within 1e-5, sizes 0, 1,
// 7, 1001 and 1M + 3) and that the default group ran --expect's algorithm
// (e.g. hierarchical); exit 1 and a line per mismatch otherwise. What
// tests/cluster/hierarchical_allreduce_test.sh runs across network namespaces.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "ddp/store/prefix_store.h"
#include "ddp/worker/init.h"
#include "ddp/worker/process_group_gloo.h"

namespace {

std::size_t parse_size(const std::string& text) {
  std::size_t value = std::stoull(text);
  char unit = text.empty() ? ' ' : text.back();
  if (unit == 'K' || unit == 'k') value *= 1024;
  if (unit == 'M' || unit == 'm') value *= 1024 * 1024;
  if (unit == 'G' || unit == 'g') value *= 1024ull * 1024 * 1024;
  return value;
}

std::string human(std::size_t bytes) {
  if (bytes >= 1024 * 1024) return fmt::format("{}M", bytes / (1024 * 1024));
  if (bytes >= 1024) return fmt::format("{}K", bytes / 1024);
  return fmt::format("{}", bytes);
}

// The --verify mode (see above): 0 when every check passed.
int verify(ddp::ProcessGroup& pg, const std::string& expect) {
  ddp::GlooOptions flat_options;
  flat_options.hierarchical = false;
  flat_options.allreduce_algorithm = ddp::AllreduceAlgorithm::kRing;
  if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME")) flat_options.iface = iface;
  if (const char* host = std::getenv("DDP_GLOO_HOSTNAME")) flat_options.hostname = host;
  auto flat = ddp::make_gloo_process_group(
      std::make_shared<ddp::PrefixStore>("verify_flat/", ddp::job_store()), pg.rank(), pg.size(),
      flat_options);
  int failures = 0;
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001},
                            std::size_t{(1u << 20) + 3}}) {
    std::mt19937_64 gen(count * 7919 + static_cast<std::size_t>(pg.rank()));
    std::vector<std::int64_t> a(count), b;
    for (auto& x : a) x = static_cast<std::int64_t>(gen());
    b = a;
    std::vector<float> fa(count), fb;
    for (auto& x : fa) x = static_cast<float>(gen() % 2000) / 500.0f - 2.0f;
    fb = fa;
    pg.allreduce(ddp::Buffer::of(a))->wait();
    flat->allreduce(ddp::Buffer::of(b))->wait();
    pg.allreduce(ddp::Buffer::of(fa))->wait();
    flat->allreduce(ddp::Buffer::of(fb))->wait();
    const std::string ran = ddp::to_string(ddp::last_allreduce_algorithm(pg));
    if (!expect.empty() && ran != expect) {
      std::printf("verify: rank %d: count %zu ran %s, not %s\n", pg.rank(), count, ran.c_str(),
                  expect.c_str());
      ++failures;
    }
    if (a != b) {
      std::printf("verify: rank %d: int64 count %zu differs from the flat ring\n", pg.rank(),
                  count);
      ++failures;
    }
    for (std::size_t i = 0; i < count; ++i) {
      if (std::abs(fa[i] - fb[i]) > 1e-5f * std::max(1.0f, std::abs(fb[i]))) {
        std::printf("verify: rank %d: float32 count %zu [%zu]: %g, flat ring %g\n", pg.rank(),
                    count, i, static_cast<double>(fa[i]), static_cast<double>(fb[i]));
        ++failures;
        break;
      }
    }
  }
  if (failures == 0) {
    std::printf("verify: rank %d ok: algorithm %s, results equal the flat ring's\n", pg.rank(),
                ddp::to_string(ddp::last_allreduce_algorithm(pg)));
  }
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ddp allreduce benchmark"};
  std::string min_text = "4K", max_text = "256M", algorithm = "auto", json_path;
  double seconds_per_size = 1.0;
  app.add_option("--min", min_text, "smallest message (bytes, K/M suffix)");
  app.add_option("--max", max_text, "largest message");
  app.add_option("--algorithm", algorithm, "auto, ring, bcube or direct");
  app.add_option("--seconds", seconds_per_size, "approximate time budget per size");
  app.add_option("--json", json_path, "write one JSON object per size (rank 0)");
  std::string segment_text;
  app.add_option("--segment", segment_text, "Gloo ring segment size (default: GlooOptions' 1M)");
  std::string direct_text;
  app.add_option("--direct-max", direct_text, "largest message of the direct algorithm under auto");
  bool verify_mode = false;
  std::string expect;
  app.add_flag("--verify", verify_mode, "check against a flat ring group instead (see above)");
  app.add_option("--expect", expect, "with --verify: the algorithm the group must run");
  CLI11_PARSE(app, argc, argv);

  ddp::InitOptions options;
  if (algorithm == "ring")
    options.gloo.allreduce_algorithm = ddp::AllreduceAlgorithm::kRing;
  else if (algorithm == "bcube")
    options.gloo.allreduce_algorithm = ddp::AllreduceAlgorithm::kBcube;
  else if (algorithm == "direct")
    options.gloo.allreduce_algorithm = ddp::AllreduceAlgorithm::kDirect;
  else if (algorithm != "auto") {
    std::fprintf(stderr, "unknown --algorithm %s\n", algorithm.c_str());
    return 2;
  }
  if (!segment_text.empty()) options.gloo.max_segment_bytes = parse_size(segment_text);
  if (!direct_text.empty()) options.gloo.direct_max_bytes = parse_size(direct_text);
  ddp::init_process_group(options);
  auto pg = ddp::default_group();
  if (verify_mode) {
    const int rc = verify(*pg, expect);
    ddp::destroy_process_group();
    return rc;
  }
  const int n = pg->size();
  const std::size_t min_bytes = parse_size(min_text), max_bytes = parse_size(max_text);
  std::ofstream json;
  if (pg->rank() == 0 && !json_path.empty()) json.open(json_path);
  if (pg->rank() == 0) {
    std::printf("# ddp gloo allreduce, float32 sum, %d ranks, algorithm %s\n", n,
                algorithm.c_str());
    std::printf("%10s %8s %12s %12s %12s %12s\n", "size", "iters", "time_us", "median_us",
                "algbw_GB/s", "busbw_GB/s");
  }
  std::vector<float> buf(max_bytes / sizeof(float), 1.0f);
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const std::size_t count = bytes / sizeof(float);
    auto view = ddp::Buffer::of(buf.data(), count);
    // Warm up, then estimate the time of one op to size the timed loop.
    for (int i = 0; i < 3; ++i) pg->allreduce(view)->wait();
    auto t0 = std::chrono::steady_clock::now();
    pg->allreduce(view)->wait();
    double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // All ranks must agree on the iteration count: take rank 0's.
    std::vector<std::int64_t> iters_v = {std::clamp<std::int64_t>(
        static_cast<std::int64_t>(seconds_per_size / std::max(one, 1e-6)), 3, 2000)};
    pg->broadcast(ddp::Buffer::of(iters_v), 0)->wait();
    const auto iters = iters_v[0];
    pg->barrier()->wait();
    std::vector<double> each(static_cast<std::size_t>(iters));
    auto start = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iters; ++i) {
      auto t = std::chrono::steady_clock::now();
      pg->allreduce(view)->wait();
      each[static_cast<std::size_t>(i)] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    }
    const char* ran = ddp::to_string(ddp::last_allreduce_algorithm(*pg));
    std::vector<double> elapsed = {
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
    pg->allreduce(ddp::Buffer::of(elapsed), ddp::ReduceOp::kMax)->wait();
    double seconds = elapsed[0] / static_cast<double>(iters);
    std::sort(each.begin(), each.end());
    double median = each[each.size() / 2];
    double algbw = static_cast<double>(bytes) / seconds / 1e9;
    double busbw = algbw * 2.0 * (n - 1) / n;
    if (pg->rank() == 0) {
      std::printf("%10s %8lld %12.1f %12.1f %12.3f %12.3f\n", human(bytes).c_str(),
                  static_cast<long long>(iters), seconds * 1e6, median * 1e6, algbw, busbw);
      std::fflush(stdout);
      if (json.is_open()) {
        json
            << fmt::format(
                   R"({{"impl": "ddp", "algorithm": "{}", "bytes": {}, "iters": {}, "time_us": {:.2f}, "median_us": {:.2f}, "algbw": {:.4f}, "busbw": {:.4f}}})",
                   ran, bytes, iters, seconds * 1e6, median * 1e6, algbw, busbw)
            << "\n";
      }
    }
    if (bytes > max_bytes / 2) break;  // avoid overflow of the doubling at the top
  }
  ddp::destroy_process_group();
  return 0;
}
