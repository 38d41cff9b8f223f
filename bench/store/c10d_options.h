// The options with which store_bench makes c10d's TCPStore (torch 1.13), server
// or client, in every mode: no worker count to wait for, the given timeout.
// Only where DDP_STORE_BENCH_WITH_C10D is set (the benchmark built with libtorch).
#pragma once

#include <chrono>
#include <cstdint>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace ddp::bench {

inline c10d::TCPStoreOptions c10d_options(std::uint16_t port, bool is_server,
                                          std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = is_server;
  o.numWorkers = c10::nullopt;
  o.waitWorkers = false;
  o.timeout = timeout;
  return o;
}

}  // namespace ddp::bench
