// A DDP worker (ddp::worker, Gloo) with faults to inject, for ddprun's
// progress, hang and straggler tests:
//
//   ddprun_progress_worker <mode> <culprit rank> <step k> [--steps N] [--step_ms M]
//                          [--linger_ms L] [--first_ms F] [--pause_ms P]
//
// Every rank builds a tiny DistributedDataParallel model and runs N steps;
// each step "computes" (sleeps M ms), then reduces its gradients (one
// allreduce). After the loop every rank lingers L ms (an evaluation, a
// checkpoint) and leaves. Modes (the culprit is the rank named; "k" a step):
//   healthy       nothing goes wrong
//   sleep_before  the culprit blocks forever before step k's collective
//   skip          the culprit skips step k's collective (and so finishes one early)
//   stop          the culprit stops issuing collectives at step k and spins, alive
//   slow          the culprit computes 3x longer each step (a straggler, no hang)
//   no_exit       every rank finishes; the culprit never exits
//   checkpoint    healthy, with a first step of F ms and every rank pausing P ms at step k
//   fail          the culprit exits with code 3 before step k, on every attempt
// Faults other than fail happen on the first attempt only (TORCHELASTIC_RESTART_COUNT
// 0), so a restarted group succeeds. With --mark_dir D the culprit writes D/stall_<rank>
// (CLOCK_REALTIME seconds, as text) the moment its fault begins (for skip: when
// it finishes its loop, a collective short).
// The culprit's blocking functions have names a stack shows:
// progress_worker_blocks_forever, progress_worker_spins_forever.
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ddp/worker/ddp.h"
#include "ddp/worker/init.h"

extern "C" [[noreturn]] __attribute__((noinline)) void progress_worker_blocks_forever() {
  for (;;) ::pause();
}

extern "C" [[noreturn]] __attribute__((noinline)) void progress_worker_spins_forever() {
  volatile std::uint64_t n = 0;
  for (;;) n = n + 1;
}

namespace {

std::string mark_dir;

void mark_stall(int rank) {
  if (mark_dir.empty()) return;
  const std::string path = mark_dir + "/stall_" + std::to_string(rank);
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  if (FILE* f = std::fopen((path + ".tmp").c_str(), "w")) {
    std::fprintf(f, "%ld.%09ld\n", static_cast<long>(now.tv_sec), now.tv_nsec);
    std::fclose(f);
    std::rename((path + ".tmp").c_str(), path.c_str());
  }
}

// The value after `name` among the options (after the 3 positional arguments), or "".
const char* arg_text(int argc, char** argv, const char* name) {
  for (int i = 4; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return "";
}

void sleep_ms(long ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

long option(int argc, char** argv, const char* name, long fallback) {
  const char* text = arg_text(argc, argv, name);
  return *text == '\0' ? fallback : std::atol(text);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: ddprun_progress_worker <mode> <culprit rank> <step k> [options]\n");
    return 64;
  }
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const bool first_attempt = restart == nullptr || std::string(restart) == "0";
  const std::string mode = first_attempt || std::strcmp(argv[1], "fail") == 0 ? argv[1] : "healthy";
  mark_dir = arg_text(argc, argv, "--mark_dir");
  const int culprit = std::atoi(argv[2]);
  const long k = std::atol(argv[3]);
  const long steps = option(argc, argv, "--steps", 40);
  const long step_ms = option(argc, argv, "--step_ms", 50);
  const long linger_ms = option(argc, argv, "--linger_ms", 0);
  const long first_ms = option(argc, argv, "--first_ms", step_ms);
  const long pause_ms = option(argc, argv, "--pause_ms", 0);

  ddp::init_process_group();
  const int rank = ddp::rank();
  const bool me = rank == culprit;
  std::vector<float> w1(256, 1.0f), g1(256), w2(64, 1.0f), g2(64);
  std::vector<ddp::Parameter> params = {{"w1", {}, ddp::Buffer::of(w1), ddp::Buffer::of(g1)},
                                        {"w2", {}, ddp::Buffer::of(w2), ddp::Buffer::of(g2)}};
  ddp::DistributedDataParallel model(ddp::default_group(), params);
  for (long step = 0; step < steps; ++step) {
    long compute = step == 0 ? first_ms : step_ms;
    if (mode == "slow" && me) compute *= 3;
    if (mode == "checkpoint" && step == k) compute += pause_ms;
    sleep_ms(compute);
    if (me && step == k) {
      if (mode == "sleep_before") {
        mark_stall(rank);
        progress_worker_blocks_forever();
      }
      if (mode == "stop") {
        mark_stall(rank);
        progress_worker_spins_forever();
      }
      if (mode == "skip") continue;
      if (mode == "fail") {
        std::fprintf(stderr, "rank %d fails before step %ld\n", rank, step);
        std::fflush(nullptr);
        std::_Exit(3);
      }
    }
    model.begin_forward();
    model.begin_backward();
    for (std::size_t i = 0; i < model.num_parameters(); ++i) {
      ddp::Buffer grad = model.grad(i);
      std::fill_n(static_cast<float*>(grad.data), grad.count, static_cast<float>(rank + step));
      model.grad_ready(i);
    }
    model.finalize();
  }
  std::printf("rank %d finished %ld steps\n", rank, steps);
  std::fflush(stdout);
  if (mode == "skip" && me) mark_stall(rank);
  sleep_ms(linger_ms);
  ddp::destroy_process_group();
  if (mode == "no_exit" && me) {
    mark_stall(rank);
    progress_worker_blocks_forever();
  }
  return 0;
}
