// What ddprun reads from SLURM: host-list expansion (as `scontrol show
// hostnames` does it) and the job's environment (node count, node id, job id,
// the first host, workers per node).
//
// Every reader validates what it reads: a set variable with a value ddprun
// cannot use is a ddp::InvalidArgument whose origin() is the variable's name
// and whose what() is one line naming the variable and its value, e.g.
//   SLURM_NNODES: 'two' is not a positive integer
// Nothing here reads a variable it was not asked for, so a malformed variable
// that a command-line flag overrides is never an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::launcher {

// The most hosts one bracket range ("[1-65536]") may expand to: SLURM's own
// limit (scontrol refuses "[1-65537]").
inline constexpr std::uint64_t kMaxHostsPerRange = 65536;

// The most hosts expand_hostlist returns by default.
inline constexpr std::size_t kMaxHosts = std::size_t{1} << 20;

// Expands a SLURM host list into host names, in the order and spelling of
// `scontrol show hostnames <list>`:
//   - entries are separated by commas (or whitespace) outside brackets; empty
//     entries are skipped; order and duplicates are kept;
//   - "prefix[r,r,...]" expands every range r ("N" or "N-M", digits only) in
//     the order written, each number zero-padded to the width of the range's
//     first number as written: node[098-101] -> node098 ... node101,
//     n[1-02] -> n1 n2, n[01-100] -> n01 ... n99 n100;
//   - several bracket groups in one entry multiply out the way SLURM does:
//     with groups g1..gk the loops nest, outermost first, as g(k-1), g(k-2),
//     ..., g1, then gk innermost (rack[1-2]-node[01-02] -> rack1-node01
//     rack1-node02 rack2-node01 rack2-node02);
//   - text may sit between groups but not after the last one of an entry
//     (SLURM refuses "n[1-3]x").
// Throws ddp::InvalidArgument (origin "host list"; what() is one line,
// "host list: '<list>': <problem>") for a list SLURM refuses (a reversed
// range, an empty range, a suffix after the last ']', a range of more than
// kMaxHostsPerRange hosts) and for lists it would accept only by accident,
// which SLURM itself never produces: an unbalanced '[' or ']', nested
// brackets, anything but digits, ',' and one '-' per range inside brackets,
// numbers of more than 18 digits. Also throws for a list that names no host,
// and for one of more than `max_hosts` hosts.
std::vector<std::string> expand_hostlist(std::string_view list, std::size_t max_hosts = kMaxHosts);

// The first host of a SLURM host list, after checking the whole list as
// expand_hostlist does (without expanding it). Throws like expand_hostlist.
std::string first_host(std::string_view list);

// The entry for `node` (0-based) of a per-node count in SLURM's compressed
// form, "2(x3),1" (= 2,2,2,1), or of a plain count "8" (every node). Throws
// ddp::InvalidArgument (origin "count") when malformed, when a count is not
// positive, or when the list has no entry for `node`.
int count_for_node(std::string_view value, int node);

// Looks up an environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment (getenv).
EnvLookup process_environment();

// A SLURM job's environment as ddprun uses it. Each accessor reads its
// variables when called and throws ddp::InvalidArgument naming the variable
// and its value when a value is malformed or a needed variable is missing.
// Variables set to the empty string count as unset.
class SlurmEnvironment {
 public:
  explicit SlurmEnvironment(EnvLookup lookup = process_environment());

  // Whether this process runs in a SLURM job: SLURM_JOB_ID is set.
  bool in_job() const;

  // Whether it runs in a job step that srun started (SLURM_STEP_ID is set); in
  // the batch script itself (or a salloc shell) it is not, and SLURM_NODEID
  // is then 0 whatever the node.
  bool in_step() const;

  // SLURM_JOB_ID, a positive integer of at most 18 digits (also the run id).
  std::string job_id() const;

  // The port ddprun's rendezvous store uses under SLURM unless one is given:
  // 20000 + SLURM_JOB_ID mod 10000, so that jobs sharing a node rarely meet
  // on one port, and never in Linux's ephemeral range (32768 and up).
  std::uint16_t store_port() const;

  // The number of nodes, and where it came from: SLURM_NNODES (which srun sets
  // to the step's node count), else SLURM_JOB_NUM_NODES. A positive integer.
  struct Count {
    int value = 0;
    std::string variable;
  };
  Count num_nodes() const;

  // This node's index in the step (srun's SLURM_NODEID), a non-negative
  // integer. When SLURM_NODEID is unset: 0 for a single-node job, an error
  // otherwise.
  Count node_id() const;

  // The host list of the nodes ddprun runs on and the variable it came from:
  // SLURM_STEP_NODELIST in a step (srun sets it to the step's nodes, whose
  // first one is SLURM_NODEID 0, also when the step uses only part of the
  // job), else SLURM_JOB_NODELIST, else SLURM_NODELIST.
  struct HostList {
    std::string value;
    std::string variable;
  };
  HostList node_list() const;

  // The first host of node_list(): where node 0 serves the rendezvous store.
  std::string master_host() const;

  // Workers per node when SLURM says how many: SLURM_GPUS_ON_NODE when set
  // and positive (the GPUs of this node in this step), else
  // SLURM_NTASKS_PER_NODE (a count, or the compressed per-node form, read for
  // node_id()); nullopt when neither is set. `variable` names the source.
  std::optional<Count> workers_per_node() const;

  // The value of a variable, nullopt when unset or empty.
  std::optional<std::string> get(const std::string& name) const;

 private:
  EnvLookup lookup_;
};

}  // namespace ddp::launcher
