// What an agent (ddprun) and one of its workers say to each other: the one
// place to read it. Three channels, each with its own header here:
//
//   the environment    agent -> worker   env_names.h: the names; WorkerRound below is
//                                        what a worker learns of its round
//   the progress page  worker -> agent   progress_page.h: one shared-memory page the
//                                        worker library writes on its hot path and the
//                                        agent's hang watch reads
//   the control channel, both ways       control_channel.h: a socket pair, one datagram
//                                        a message; the messages, one struct each:
//
//   message   direction        struct       meaning
//   hello     worker -> agent  Hello        it recovers in place (sent once, when the
//                                           worker library opens the channel)
//   abort     agent -> worker  Abort        its round ended: fail its collectives now
//   round     agent -> worker  WorkerRound  the round it is in now (ddp::reform() waits
//                                           for it): everything a new worker finds in
//                                           its environment, and the round's number
//   reformed  worker -> agent  Reformed     it re-formed its groups for that round
//   synced    worker -> agent  Synced       its state transfer (ddp::ReplicaState::sync)
//
// Each struct has one encode() and one decode_<type>(); decode(encode(x)) == x
// (seconds to the microsecond). A decode returns nullopt for a message of
// another type, one missing a field (every field is needed but hello's pid and
// abort's why) or one whose field is malformed or out of range: both sides
// treat what the other sends as untrusted (the worker runs user code). Fields
// a decode does not know are ignored, so either side may add one. What a side
// does with a message it cannot read: the agent ignores a report (warning);
// the worker library takes an `abort` as the end of its round all the same,
// and a `round` makes ddp::reform() throw ProtocolError.
//
// The same WorkerRound is written into a new worker's environment
// (environment_of) and into the `round` message a kept worker is sent, so the
// two cannot drift apart: one table maps each field to its message key and
// its variable. The worker library reads the environment (decode_environment)
// in init_process_group, and the message (decode_round) in ddp::reform().
// Everything here is a pure function: no blocking, no state, thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/worker_contract/control_channel.h"

namespace ddp::contract {

// What a worker learns of the round it is in.
struct WorkerRound {
  // The rendezvous round. The `round` message only: the environment has no
  // name for it (DDP_STORE_PREFIX holds it).
  int round = 0;
  int rank = 0;  // in the job (RANK, and ROLE_RANK: one role)
  int world_size = 1;
  int local_rank = 0;  // on this node
  int local_world_size = 1;
  int group_rank = 0;  // this node's rank among the round's nodes
  int group_world_size = 1;
  int restart_count = 0;       // restarts this node's agent made (torchrun's count)
  int job_restart_count = 0;   // restarts the job spent so far, on every node
  int membership_changes = 0;  // rounds the job re-formed for a node lost or admitted
  // PyTorch's env:// meeting point: a free port on group rank 0's node.
  std::string master_addr;
  int master_port = 0;
  // The agents' store, and the key prefix the round's workers own in it.
  std::string store_addr;
  int store_port = 0;
  std::string store_prefix;
  // How long a failed collective waits for the agent's word that the round
  // ended (a dead node's connections break before its keep-alives are missed);
  // the worker library uses at most 600 s.
  std::chrono::milliseconds change_grace{0};

  bool operator==(const WorkerRound&) const = default;
};

// The variables (name, value) that say `round` in a new worker's environment:
// torchrun's LOCAL_RANK, RANK, GROUP_RANK, ROLE_RANK, LOCAL_WORLD_SIZE,
// WORLD_SIZE, GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT, and ddprun's DDP_STORE_ADDR, DDP_STORE_PORT,
// DDP_STORE_PREFIX, DDP_CHANGE_GRACE_MS, DDP_JOB_RESTART_COUNT,
// DDP_MEMBERSHIP_CHANGES. Not the round's number (see there).
std::vector<std::pair<std::string, std::string>> environment_of(const WorkerRound& round);

// A variable's value, or nullopt when it is not set (a worker's getenv).
using EnvironmentLookup = std::function<std::optional<std::string>(const char* name)>;

// The inverse of environment_of: the round a worker ddprun started finds in
// its environment, read through `lookup`, with `round` left 0 (the
// environment has no name for it). The same checks as decode_round: nullopt
// when a variable is missing, not a number or out of range, and then
// `problem` (when not null) names the variable, or the values, that were wrong.
std::optional<WorkerRound> decode_environment(const EnvironmentLookup& lookup,
                                              std::string* problem = nullptr);

// `round`: the agent tells a kept worker the round it is in now.
control::Message encode(const WorkerRound& round);
std::optional<WorkerRound> decode_round(const control::Message& message);

// `hello`: the worker recovers in place.
struct Hello {
  bool in_place = true;
  std::int64_t pid = 0;  // the worker's, for logs (0: not said)
  bool operator==(const Hello&) const = default;
};
control::Message encode(const Hello& hello);
std::optional<Hello> decode_hello(const control::Message& message);

// `abort`: the round the worker is in ended; its collectives fail at once.
struct Abort {
  int round = 0;    // the round that ended
  std::string why;  // for the program's GroupChanged; may be empty. Its first
                    // kMaxWhyBytes are sent, and read.
  bool operator==(const Abort&) const = default;
};
inline constexpr std::size_t kMaxWhyBytes = 512;
control::Message encode(const Abort& abort);
std::optional<Abort> decode_abort(const control::Message& message);

// `reformed`: the worker's groups are re-formed for `round` (ddp::reform()).
struct Reformed {
  int round = 0;
  int rank = 0;              // the worker's rank in it
  double wait_seconds = 0;   // waiting for the agent to name the round
  double build_seconds = 0;  // making the new group
  bool operator==(const Reformed&) const = default;
};
control::Message encode(const Reformed& reformed);
std::optional<Reformed> decode_reformed(const control::Message& message);

// `synced`: the worker's state is the one rank `root` had (ReplicaState::sync).
struct Synced {
  // The round the worker synced in: the last one it was told (`round`), or
  // -1 when it was never told one (it started in its round).
  int round = -1;
  int root = 0;
  bool received = false;   // its memory was overwritten with the root's
  bool from_live = false;  // the root had live state (a survivor)
  std::int64_t bytes = 0;  // broadcast from the root
  double seconds = 0;      // the sync's wall time
  bool operator==(const Synced&) const = default;
};
control::Message encode(const Synced& synced);
std::optional<Synced> decode_synced(const control::Message& message);

}  // namespace ddp::contract
