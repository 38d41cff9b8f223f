// ddp_worker_smoke: a worker program for the launcher tests. It joins through
// ddp::init_process_group() (ddprun's store or env://), runs every collective
// for every dtype and op against a locally computed reference, uses two extra
// groups at once, and reports "SMOKE OK rank R/W". Modes (argv[1]):
//   all       (default) the above
//   missing   the last rank never calls the collective; the others must get a
//             TimeoutError naming it
//   mismatch  rank 1 passes a different size; with DDP_DEBUG=DETAIL every rank
//             must get InvalidArgument naming both calls
//   sampler   prints this rank's DistributedSampler indices for (n=103, seed=3, epoch=1)
//   peer-dies the last rank SIGKILLs itself; the others' all-reduce must fail
//             with NetworkError naming it, long before the group's timeout
// Exit code 0 on success, 1 on a failed check, 2 on an unexpected error.
#include <unistd.h>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "ddp/common/error.h"
#include "ddp/worker/distributed_sampler.h"
#include "ddp/worker/init.h"
#include "ddp/worker/logger.h"
#include "test_util.h"

namespace {

using namespace ddp;
using namespace ddp::test;

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::cerr << "CHECK FAILED rank " << ddp::rank() << ": " << what << std::endl;
  }
}

void run_all() {
  auto pg = default_group();
  const int world = pg->size();
  const int me = pg->rank();
  for (DType dtype : all_dtypes()) {
    for (ReduceOp op : all_ops()) {
      for (std::size_t count : {std::size_t{3}, std::size_t{40000}}) {
        TypedBuffer buf(dtype, count);
        for (std::size_t i = 0; i < count; ++i) buf.set(i, input_value(op, dtype, me, i));
        pg->allreduce(buf.view(), op)->wait();
        for (std::size_t i = 0; i < count; ++i) {
          if (buf.get(i) != expected_value(op, dtype, world, i)) {
            check(false, fmt::format("allreduce {} {} count {} at {}: {} != {}", to_string(dtype),
                                     to_string(op), count, i, buf.get(i),
                                     expected_value(op, dtype, world, i)));
            break;
          }
        }
        // reduce_scatter over the same inputs
        TypedBuffer in(dtype, count * world), out(dtype, count);
        for (std::size_t i = 0; i < in.count(); ++i) in.set(i, input_value(op, dtype, me, i));
        pg->reduce_scatter(out.view(), in.view(), op)->wait();
        for (std::size_t i = 0; i < count; ++i) {
          if (out.get(i) != expected_value(op, dtype, world, me * count + i)) {
            check(false,
                  fmt::format("reduce_scatter {} {} at {}", to_string(dtype), to_string(op), i));
            break;
          }
        }
        // reduce to the last rank
        TypedBuffer red(dtype, count);
        for (std::size_t i = 0; i < count; ++i) red.set(i, input_value(op, dtype, me, i));
        pg->reduce(red.view(), world - 1, op)->wait();
        if (me == world - 1) {
          for (std::size_t i = 0; i < count; ++i) {
            if (red.get(i) != expected_value(op, dtype, world, i)) {
              check(false, fmt::format("reduce {} {} at {}", to_string(dtype), to_string(op), i));
              break;
            }
          }
        }
      }
    }
    TypedBuffer b(dtype, 777);
    for (std::size_t i = 0; i < b.count(); ++i) b.set(i, me == 0 ? (i % 50) : 0);
    pg->broadcast(b.view(), 0)->wait();
    for (std::size_t i = 0; i < b.count(); ++i) {
      if (b.get(i) != static_cast<double>(i % 50)) {
        check(false, fmt::format("broadcast {} at {}", to_string(dtype), i));
        break;
      }
    }
    TypedBuffer gin(dtype, 9), gout(dtype, 9 * world);
    for (std::size_t i = 0; i < 9; ++i) gin.set(i, me * 10 + i);
    pg->allgather(gout.view(), gin.view())->wait();
    for (int r = 0; r < world; ++r) {
      for (std::size_t i = 0; i < 9; ++i) {
        check(gout.get(r * 9 + i) == r * 10 + static_cast<double>(i),
              fmt::format("allgather {} rank {} at {}", to_string(dtype), r, i));
      }
    }
  }
  pg->barrier()->wait();
  // point to point around the ring
  std::vector<std::int64_t> out(100, me), in(100, -1);
  auto s = pg->send(Buffer::of(out), (me + 1) % world, 5);
  auto r = pg->recv(Buffer::of(in), (me + world - 1) % world, 5);
  s->wait();
  r->wait();
  check(in[99] == (me + world - 1) % world, "send/recv ring");
  // Two more groups used at once from two threads.
  auto g1 = new_group();
  auto g2 = new_group();
  std::thread t([&] {
    for (int k = 0; k < 20; ++k) {
      std::vector<float> v(5000, 1.0f);
      g1->allreduce(Buffer::of(v))->wait();
      check(v[0] == static_cast<float>(world), "group 1 allreduce");
    }
  });
  for (int k = 0; k < 20; ++k) {
    std::vector<double> v(3000, 2.0);
    g2->allreduce(Buffer::of(v), ReduceOp::kMax)->wait();
    check(v[2999] == 2.0, "group 2 allreduce");
  }
  t.join();
  // A subgroup of the even ranks.
  std::vector<int> evens;
  for (int r2 = 0; r2 < world; r2 += 2) evens.push_back(r2);
  auto g3 = new_group(evens);
  check((me % 2 == 0) == (g3 != nullptr), "new_group membership");
  if (g3) {
    std::vector<std::int32_t> v(10, me);
    g3->allreduce(Buffer::of(v))->wait();
    int expected = 0;
    for (int e : evens) expected += e;
    check(v[0] == expected, "subgroup allreduce");
  }
}

void run_missing() {
  auto pg = default_group();
  const int world = pg->size();
  if (pg->rank() == world - 1) {
    // Stay connected but never enter the collective; leave after the others timed out.
    std::this_thread::sleep_for(std::chrono::seconds(4));
    return;
  }
  std::vector<float> v(1000, 1.0f);
  try {
    pg->allreduce(Buffer::of(v))->wait();
    check(false, "allreduce without the last rank succeeded");
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    std::cout << "TIMEOUT rank " << pg->rank() << ": " << what << std::endl;
    check(what.find(fmt::format("ranks that did not arrive: [{}]", world - 1)) != std::string::npos,
          "timeout names the missing rank: " + what);
  }
}

void run_peer_dies() {
  auto pg = default_group();
  const int world = pg->size();
  pg->barrier()->wait();
  if (pg->rank() == world - 1) ::raise(SIGKILL);
  std::vector<float> v(100000, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  try {
    pg->allreduce(Buffer::of(v))->wait();
    check(false, "allreduce with a dead rank succeeded");
  } catch (const NetworkError& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    std::string what = e.what();
    std::cout << "PEER DIED rank " << pg->rank() << " after " << ms << " ms: " << what << std::endl;
    check(what.find(fmt::format("rank {}", world - 1)) != std::string::npos,
          "the error names the dead rank: " + what);
    check(ms < 10000, fmt::format("the dead rank was noticed after {} ms", ms));
  }
  // Skip destroy_process_group: rank 0 would keep the store up for the dead rank
  // until the timeout.
  if (failures == 0) std::cout << "SMOKE OK rank " << pg->rank() << "/" << world << std::endl;
  std::cout.flush();
  ::_exit(failures == 0 ? 0 : 1);
}

void run_mismatch() {
  auto pg = default_group();
  std::vector<float> v(pg->rank() == 1 ? 20 : 10, 1.0f);
  try {
    pg->allreduce(Buffer::of(v))->wait();
    check(false, "mismatched allreduce succeeded");
  } catch (const InvalidArgument& e) {
    std::string what = e.what();
    std::cout << "MISMATCH rank " << pg->rank() << ": " << what << std::endl;
    check(what.find("count=20") != std::string::npos && what.find("count=10") != std::string::npos,
          "mismatch message names both sizes: " + what);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "all";
  try {
    init_process_group();
    if (mode == "all") {
      run_all();
    } else if (mode == "missing") {
      run_missing();
    } else if (mode == "mismatch") {
      run_mismatch();
    } else if (mode == "peer-dies") {
      run_peer_dies();
    } else if (mode == "sampler") {
      DistributedSampler sampler(103, world_size(), rank(), true, 3);
      sampler.set_epoch(1);
      std::string line;
      // Appended in two steps: " " + std::to_string(i) is a false -Wrestrict
      // of GCC 12 at -O3.
      for (auto i : sampler.indices()) line.append(1, ' ').append(std::to_string(i));
      std::cout << "SAMPLER " << rank() << ":" << line << std::endl;
    } else {
      std::cerr << "unknown mode " << mode << std::endl;
      return 2;
    }
    logger()->info("smoke '{}' done with {} failed checks", mode, failures);
    if (failures == 0) std::cout << "SMOKE OK rank " << rank() << "/" << world_size() << std::endl;
    destroy_process_group();
  } catch (const std::exception& e) {
    std::cerr << "SMOKE ERROR: " << e.what() << std::endl;
    return 2;
  }
  return failures == 0 ? 0 : 1;
}
