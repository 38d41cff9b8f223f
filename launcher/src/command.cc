#include "command.h"

#include "values.h"

namespace ddp::launcher {

void resolve_command(LaunchConfig& c, const HostFacts& host) {
  auto env_or = [&](const std::string& name, const std::string& fallback) {
    auto value = host.env(name);
    return value && !value->empty() ? *value : fallback;
  };
  const std::string path = env_or("PATH", "/usr/local/bin:/usr/bin:/bin");
  std::vector<std::string> command;
  auto python = [&] {
    std::string exec = env_or("PYTHON_EXEC", "python3");
    std::string resolved = host.resolve_program(exec, path);
    if (resolved.empty()) {
      fail("cannot run the Python program '" + c.program + "': '" + exec +
           "' not found on PATH (set PYTHON_EXEC or use --no_python)");
    }
    c.python = resolved;
    return resolved;
  };
  const bool is_python_file =
      c.program.size() > 3 && c.program.compare(c.program.size() - 3, 3, ".py") == 0;
  if (c.module) {
    command = {python(), "-u", "-m", c.program};
  } else if (!c.no_python && is_python_file) {
    if (!host.is_regular_file(c.program)) fail("program '" + c.program + "' not found");
    command = {python(), "-u", c.program};
  } else {
    std::string resolved = host.resolve_program(c.program, path);
    if (resolved.empty()) {
      if (!c.no_python && host.is_regular_file(c.program)) {
        // Not executable: a Python script without the .py suffix, like torchrun runs it.
        command = {python(), "-u", c.program};
      } else {
        fail("program '" + c.program + "' not found or not executable" +
             (c.program.find('/') == std::string::npos ? " (searched PATH)" : ""));
      }
    } else {
      command = {resolved};
    }
  }
  command.insert(command.end(), c.program_args.begin(), c.program_args.end());
  c.agent.spec.argv = std::move(command);
}

}  // namespace ddp::launcher
