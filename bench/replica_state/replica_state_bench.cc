// replica_state_bench: what ReplicaState::sync costs against the all-reduce
// of the same bytes, on the same group, interleaved in one run (so that a
// loaded machine slows both alike). Run it under ddprun with 2+ ranks:
//
//   ddprun --standalone --nproc_per_node=3 replica_state_bench [--hidden 512,256]
//          [--iters 50] [--parts]
//
// The state is the demo's (train_fashion_mnist --hidden H: an MLP 784-H...-10,
// float32 weights and biases and as many momentum buffers, 3 int64 counters;
// --hidden 512,256 is recovery_bench's 4.09 MiB). Every rank syncs once first,
// so all are live and rank 0 stays the root: each timed sync moves rank 0's
// state to the others, as a newcomer receives a survivor's. Each iteration,
// after a barrier: one sync(), then (after another barrier) one float32 SUM
// all-reduce of the state's bytes; a time is the slowest rank's. Rank 0
// prints, medians over --iters:
//
//   replica_state ranks=N bytes=B buffers=K sync_ms=S allreduce_ms=A
//     state_gbps=<B/S> busbw_gbps=<B/A x 2(N-1)/N> state_ratio=<state_gbps/busbw_gbps>
//     first_sync_ms=<F>
//
// The target: state_ratio >= 0.5. first_sync_ms is the first sync (a
// fresh start's: rank 0's state to the others, not in the medians): the
// group's first large collective, as a newcomer's sync after a re-form is
// (cold shared memory, fresh staging memory).
//
// --parts adds, each timed alone the same way, the liveness table's
// all-reduce (N x 5 int64, sync()'s first step) and the pieces of the
// transfer as it was before it staged small buffers together: one all-reduce
// per buffer (the K buffers issued before the first wait) and the counters'
// broadcast. DDP_DEBUG=DETAIL gives every collective the cross-rank check the
// torch backend's groups have.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "ddp/worker/init.h"
#include "ddp/worker/replica_state.h"

namespace {

using Clock = std::chrono::steady_clock;

// The slowest rank's seconds for `op`, started together after a barrier.
double timed(ddp::ProcessGroup& pg, const std::function<void()>& op) {
  pg.barrier()->wait();
  const auto start = Clock::now();
  op();
  std::vector<double> seconds = {std::chrono::duration<double>(Clock::now() - start).count()};
  pg.allreduce(ddp::Buffer::of(seconds), ddp::ReduceOp::kMax)->wait();
  return seconds[0];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<std::size_t> parse_hidden(const std::string& text) {
  std::vector<std::size_t> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t comma = text.find(',', pos);
    out.push_back(std::stoull(text.substr(pos, comma - pos)));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ReplicaState::sync against the all-reduce of the same bytes"};
  std::string hidden_text = "512,256";
  int iters = 50;
  bool parts = false;
  app.add_option("--hidden", hidden_text, "the demo MLP's hidden layers")->capture_default_str();
  app.add_option("--iters", iters, "timed iterations")->capture_default_str();
  app.add_flag("--parts", parts, "also time sync()'s parts alone");
  CLI11_PARSE(app, argc, argv);

  ddp::init_process_group();
  auto pg = ddp::default_group();
  const int rank = pg->rank();
  const int n = pg->size();

  // Weights, biases and their momentum buffers, filled with rank-specific values.
  std::vector<std::size_t> widths = {784};
  for (std::size_t h : parse_hidden(hidden_text)) widths.push_back(h);
  widths.push_back(10);
  std::vector<std::vector<float>> buffers;
  for (int copy = 0; copy < 2; ++copy) {
    for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
      buffers.emplace_back(widths[l] * widths[l + 1], static_cast<float>(rank + 1));
      buffers.emplace_back(widths[l + 1], static_cast<float>(rank + 1));
    }
  }
  std::vector<std::int64_t> counters = {rank, 2 * rank, 3 * rank};
  ddp::ReplicaState state;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    state.add(fmt::format("buffer{}", i), ddp::Buffer::of(buffers[i]));
  }
  for (std::size_t i = 0; i < counters.size(); ++i) {
    state.add(fmt::format("counter{}", i), &counters[i]);
  }
  const std::size_t bytes = state.bytes();
  // The group's first large collective, as a newcomer's sync is after a
  // re-form: every rank live afterwards, so rank 0 stays the root.
  const double first_sync_s = timed(*pg, [&] { state.sync(*pg); });

  std::vector<float> flat(bytes / sizeof(float), 1.0f);
  std::vector<std::int64_t> table(static_cast<std::size_t>(n) * 5, 0);
  std::vector<double> sync_s, allreduce_s, table_s, per_buffer_s, counters_s;
  for (int i = 0; i < iters; ++i) {
    sync_s.push_back(timed(*pg, [&] { state.sync(*pg); }));
    allreduce_s.push_back(timed(*pg, [&] { pg->allreduce(ddp::Buffer::of(flat))->wait(); }));
    if (!parts) continue;
    table_s.push_back(timed(*pg, [&] { pg->allreduce(ddp::Buffer::of(table))->wait(); }));
    per_buffer_s.push_back(timed(*pg, [&] {
      std::vector<ddp::WorkPtr> works;
      for (auto& b : buffers) works.push_back(pg->allreduce(ddp::Buffer::of(b)));
      for (auto& w : works) w->wait();
    }));
    counters_s.push_back(timed(*pg, [&] { pg->broadcast(ddp::Buffer::of(counters), 0)->wait(); }));
  }
  if (rank == 0) {
    const double s = median(sync_s);
    const double a = median(allreduce_s);
    const double state_gbps = static_cast<double>(bytes) / s / 1e9;
    const double busbw = static_cast<double>(bytes) / a / 1e9 * 2.0 * (n - 1) / n;
    fmt::print(
        "replica_state ranks={} bytes={} buffers={} sync_ms={:.3f} allreduce_ms={:.3f} "
        "state_gbps={:.2f} busbw_gbps={:.2f} state_ratio={:.2f} first_sync_ms={:.3f}\n",
        n, bytes, buffers.size(), s * 1e3, a * 1e3, state_gbps, busbw, state_gbps / busbw,
        first_sync_s * 1e3);
    if (parts) {
      fmt::print(
          "parts table_allreduce_ms={:.3f} per_buffer_allreduces_ms={:.3f} "
          "counters_broadcast_ms={:.3f}\n",
          median(table_s) * 1e3, median(per_buffer_s) * 1e3, median(counters_s) * 1e3);
    }
    std::fflush(stdout);
  }
  ddp::destroy_process_group();
  return 0;
}
