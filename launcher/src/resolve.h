// From the options' values (RawOptions: given, from PET_<NAME>, from SLURM or
// defaults) to a LaunchConfig: every value validated, cpu/gpu/auto counted,
// the rendezvous' store, ranks and local address decided, the program's
// command found. Each mistake is a UsageError naming the option as `what`
// says.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ddp/launcher/host_facts.h"
#include "ddp/launcher/launch_config.h"
#include "options.h"

namespace ddp::launcher {

// Where the options' values came from.
struct OptionOrigins {
  // How a message names an option: "--nnodes", or "--nnodes (from
  // PET_NNODES)" / "(from SLURM_NNODES)" when the value came from there.
  std::function<std::string(const std::string& name)> what;
  // Whether the option was given, on the command line or as PET_<NAME>.
  std::function<bool(const std::string& name)> given;
  // The options SLURM filled in, each with its source.
  const std::map<std::string, std::string>& from_slurm;
};

// `program` is the program and its arguments (not empty).
LaunchConfig resolve_options(const RawOptions& raw, const std::vector<std::string>& program,
                             const OptionOrigins& origins, const HostFacts& host);

}  // namespace ddp::launcher
