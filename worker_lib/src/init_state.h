// What init_process_group sets up, process-wide, and the helpers that
// init.cc and in-place recovery (recovery/reform.cc) share to make a round's
// store and groups. Internal to the worker library.
//
// Thread-safety: InitState is guarded by its own mutex, which every public
// entry point (init.h, recovery.h) holds while it reads or changes it.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <spdlog/logger.h>

#include "ddp/store/store.h"
#include "ddp/store_server/store_server.h"
#include "ddp/worker/init.h"
#include "ddp/worker/process_group.h"

namespace ddp::detail {

class ControlClient;

struct InitState {
  std::mutex mutex;
  bool initialized = false;
  InitOptions options;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::unique_ptr<StoreServer> server;  // env:// on rank 0
  std::shared_ptr<Store> store;         // the job's store, prefixed
  // ddprun's store before the round's prefix, and where it is (a round of an
  // in-place recovery may name another one).
  std::shared_ptr<Store> base_store;
  std::string store_addr;
  int store_port = 0;
  std::string store_token;
  // The agent's control channel when this worker recovers in place.
  detail::ControlClient* control = nullptr;
  std::shared_ptr<ProcessGroup> group;
  std::vector<std::shared_ptr<ProcessGroup>> subgroups;
  int next_group = 0;
  std::shared_ptr<spdlog::logger> logger;
};

// The process's one InitState.
InitState& init_state();
// init_state(), or InvalidArgument (`what` named) when not initialized.
InitState& initialized_state(const char* what);

// A group of `backend` ("gloo" or "nccl"; else InvalidArgument) named `name`,
// as `options` say; with in-place recovery its failures are explained by the
// agent's control channel. Blocks until every rank made it (see the backends).
std::shared_ptr<ProcessGroup> make_group(const std::string& backend, std::shared_ptr<Store> store,
                                         int rank, int size, const InitOptions& options,
                                         int local_rank, const std::string& name);
// A client of the TCP store at host:port (`timeout` to connect and per call).
std::shared_ptr<Store> connect_store(const std::string& host, int port, const std::string& token,
                                     std::chrono::milliseconds timeout);

}  // namespace ddp::detail
