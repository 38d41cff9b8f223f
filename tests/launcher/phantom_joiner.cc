// A joiner that dies right after taking its arrival index, for ddprun's
// end-to-end tests (ddprun_hardening_test.cc): it connects to the agents'
// store, takes an index on round 0's arrival counter as a node would, prints
// it and kills itself with SIGKILL before writing its record
// (rdzv/<run_id>/round_0/rec_<index>): a node killed between the two steps.
//
//   ddprun_phantom_joiner <host> <port> <run_id> after_rec0   wait for rec_0 first (node 0 arrived)
//   ddprun_phantom_joiner <host> <port> <run_id> now          take an index at once
//
// DDP_STORE_TOKEN, when set, is the store's token. Exit codes: 64 for bad
// usage, 1 when the store fails; otherwise it dies of SIGKILL.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "ddp/store/tcp_store.h"

int main(int argc, char** argv) {
  if (argc != 5 || (std::string(argv[4]) != "after_rec0" && std::string(argv[4]) != "now")) {
    std::fprintf(stderr, "usage: ddprun_phantom_joiner <host> <port> <run_id> after_rec0|now\n");
    return 64;
  }
  try {
    ddp::TcpStoreOptions options;
    options.host = argv[1];
    options.port = static_cast<std::uint16_t>(std::stoi(argv[2]));
    if (const char* token = std::getenv("DDP_STORE_TOKEN")) options.token = token;
    options.connect_timeout = std::chrono::seconds(60);
    options.timeout = std::chrono::seconds(60);
    ddp::TcpStore store(options);
    const std::string round = "rdzv/" + std::string(argv[3]) + "/round_0";
    if (std::string(argv[4]) == "after_rec0")
      store.wait({round + "/rec_0"}, std::chrono::seconds(60));
    const std::int64_t index = store.add(round + "/arrivals", 1) - 1;
    std::printf("%lld\n", static_cast<long long>(index));
    std::fflush(stdout);
    ::raise(SIGKILL);  // with its store connection open, as a killed node
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun_phantom_joiner: %s\n", e.what());
    return 1;
  }
  return 1;  // not reached
}
