// --rdzv_conf's keys, one table: each key's name, the kind of value it takes
// (which says how it is read and checked) and the field of LaunchConfig it
// sets. A key's default is that field's default, declared once, in the struct
// that owns it (RendezvousParams, RendezvousConfig, AgentOptions).
#pragma once

#include <chrono>
#include <string>
#include <variant>
#include <vector>

#include "ddp/launcher/host_facts.h"
#include "ddp/launcher/launch_config.h"

namespace ddp::launcher {

enum class RdzvConfKind {
  kSeconds,          // seconds, whole or fractional, >= 0
  kPositiveSeconds,  // seconds, > 0
  kPositiveInt,      // an integer in 1..1000000
  kBool,             // 1/true/True or 0/false/False
  kProtocol,         // http or https (true: https)
  kReadableFile,     // a path this process can read
  kName,             // a non-empty text
  kPasswordFile,     // a readable file whose first line (the password) is stored
  kStoreType,        // torchrun's c10d store_type: tcp (the only store ddprun's c10d uses)
  kIgnored,          // a torchrun key ddprun accepts and ignores, with a warning naming why
};

// Where a key's value goes; the alternative matches the kind: milliseconds
// for seconds, int for kPositiveInt, bool for kBool and kProtocol, nothing
// (monostate) for kStoreType and kIgnored, a string for the others.
using RdzvConfField =
    std::variant<std::monostate, std::chrono::milliseconds*, int*, bool*, std::string*>;

struct RdzvConfKey {
  const char* key;
  RdzvConfKind kind;
  // Only with --rdzv_backend=etcd.
  bool etcd_only;
  RdzvConfField (*field)(LaunchConfig&);
  // kIgnored: why the key is ignored (the warning's reason).
  const char* ignored_because = nullptr;
};

// Every key, in the order the "unknown key" message lists them.
const std::vector<RdzvConfKey>& rdzv_conf_table();

// The key called `key`, or null.
const RdzvConfKey* find_rdzv_conf_key(const std::string& key);

// --rdzv_conf's keys for --help: those of every backend (the seconds
// first), then etcd's, then the torchrun keys that are accepted and ignored.
std::string rdzv_conf_help_keys();

// Reads `text` ("k=v,k=v"; the last of a repeated key wins) into
// c.rdzv_conf and the fields of its keys (join_timeout or its torchrun
// spelling `timeout` first, never both, then the keys in name order); an
// ignored key adds a line to c.warnings. `what` names the option ("--rdzv_conf" or
// "--rdzv_conf (from PET_RDZV_CONF)"); `backend` is --rdzv_backend's value.
// Also sets c.rendezvous.connect_timeout to the join timeout. Throws
// UsageError naming the key.
void apply_rdzv_conf(const std::string& text, const std::string& what, const std::string& backend,
                     const HostFacts& host, LaunchConfig& c);

}  // namespace ddp::launcher
