// Joining the job: the process group from the environment (torchrun's env://
// contract, or ddprun's own store).
//
//   ddp::init_process_group();                 // reads the environment
//   auto pg = ddp::default_group();
//   pg->allreduce(ddp::Buffer::of(grads))->wait();
//   ddp::destroy_process_group();
//
// Environment, in order of precedence:
// - ddprun: DDP_STORE_ADDR, DDP_STORE_PORT, DDP_STORE_PREFIX, DDP_STORE_TOKEN
//   (a TcpStore client on the agent's store, inside PrefixStore(DDP_STORE_PREFIX)
//   so a worker of an old round never touches a newer round's keys), RANK, WORLD_SIZE.
// - env:// (by hand, srun, mpirun): MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE;
//   rank 0 hosts a StoreServer on MASTER_PORT in-process, every rank connects to it.
// - Always: LOCAL_RANK (default 0), LOCAL_WORLD_SIZE (default 1), DDP_DEBUG=DETAIL
//   (collective consistency checks), GLOO_SOCKET_IFNAME / DDP_GLOO_HOSTNAME (the
//   address Gloo binds), DDP_TIMEOUT (seconds; overrides InitOptions::timeout).
// Missing or malformed variables throw InvalidArgument naming the variable.
//
// The functions below are thread-safe; init/destroy must not race with
// collectives issued on the groups they own.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/worker/process_group.h"
#include "ddp/worker/process_group_gloo.h"

namespace ddp {

class Store;

struct InitOptions {
  // "gloo" (CPU) or "nccl" (CUDA; device = LOCAL_RANK).
  std::string backend = "gloo";
  // Bound of the rendezvous (store connection, peers showing up) and of every collective.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  // Overrides of the environment (for tests and custom launchers). With `store`
  // set, the environment's store variables are ignored and `store` is the job's
  // store (it should be private to this job / round).
  std::optional<int> rank;
  std::optional<int> world_size;
  std::shared_ptr<Store> store;
  // Gloo transport settings (hostname/iface are filled from the environment when empty).
  GlooOptions gloo;
  // Recover in place (recovery.h): when the job's membership changes, keep
  // this process and re-form its groups instead of being restarted. Takes
  // effect under an agent that offers a control channel (ddprun).
  bool recover_in_place = false;
};

// Joins the default group. Blocks until every rank has joined (at most timeout).
// With recover_in_place, a round that ends while this worker joins it is
// followed into the next one (the agent names it), within the same timeout.
// Throws InvalidArgument (bad/missing environment, unknown backend, already
// initialized), TimeoutError / NetworkError (store or peers unreachable).
void init_process_group(InitOptions options = {});

// Leaves the job: destroys every group, waits (bounded) until all ranks have
// called it when this rank hosts the env:// store, then stops it. No-op when
// not initialized.
void destroy_process_group();

bool is_initialized();

// The default group's rank and size, and this node's local rank / size.
// Throw InvalidArgument when not initialized.
int rank();
int world_size();
int local_rank();
int local_world_size();

// The default group, and the job's store (inside the job's prefix).
std::shared_ptr<ProcessGroup> default_group();
std::shared_ptr<Store> job_store();

// A new group over `ranks` of the default group (empty: all ranks), with its own
// store namespace "pg/<n>" (n counts new_group calls, which every rank of the
// default group must make in the same order, as in PyTorch). Returns nullptr on
// ranks outside `ranks`. Ranks in the new group are numbered in the order given.
// backend: empty = the default group's.
std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks = {},
                                        const std::string& backend = "");

// The rank logger, logger(), is in ddp/worker/logger.h: the one header of the
// worker library that includes spdlog.

}  // namespace ddp
