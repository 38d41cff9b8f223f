// The flags torchrun gained after 1.13, read into a LaunchConfig:
// --shutdown_timeout (and TORCH_ELASTIC_SHUTDOWN_TIMEOUT), --virtual_local_rank,
// --duplicate_stdout_filters and --duplicate_stderr_filters, --numa_binding,
// --event_log_handler and --logs_specs; and torchrun's OMP_NUM_THREADS
// warning. Each mistake is a UsageError naming the option (or the variable)
// and the value; what ddprun only notes goes to LaunchConfig::warnings.
#pragma once

#include "ddp/launcher/host_facts.h"
#include "ddp/launcher/launch_config.h"
#include "options.h"
#include "resolve.h"

namespace ddp::launcher {

// Needs c.agent.spec.local_world_size, redirects and tee resolved before.
void resolve_torch_flags(const RawOptions& raw, const OptionOrigins& origins, const HostFacts& host,
                         LaunchConfig& c);

// torchrun's comma-separated filter list: "a,b" -> {"a", "b"}, ",," is a comma;
// "" -> none. An empty filter (it would copy every line) is a UsageError
// naming `what`.
std::vector<std::string> parse_filters(const std::string& text, const std::string& what);

}  // namespace ddp::launcher
