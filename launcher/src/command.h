// The command every worker runs: the program executed directly, or a Python
// program (a .py file, -m module, or a file that is not executable) run as
// `<python> -u program`, <python> being $PYTHON_EXEC or the first python3 on
// PATH.
#pragma once

#include "ddp/launcher/host_facts.h"
#include "ddp/launcher/launch_config.h"

namespace ddp::launcher {

// Sets c.agent.spec.argv from c.program, c.program_args, c.no_python and
// c.module, and c.python for a Python program. Throws UsageError when the
// program or the Python cannot be found.
void resolve_command(LaunchConfig& c, const HostFacts& host);

}  // namespace ddp::launcher
