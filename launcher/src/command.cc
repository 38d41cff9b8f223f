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
    // An executable file runs directly wherever it is named: as a path (a
    // bare name included: `ddprun train_cpp` names ./train_cpp, as torchrun
    // takes its program as a file) or, failing that, on PATH. With
    // --no_python, PATH first, as exec does.
    const bool bare_name = c.program.find('/') == std::string::npos;
    auto in_current_dir = [&] {
      return bare_name ? host.resolve_program("./" + c.program, path) : std::string();
    };
    std::string resolved = c.no_python ? "" : in_current_dir();
    if (resolved.empty()) resolved = host.resolve_program(c.program, path);
    if (resolved.empty() && c.no_python) resolved = in_current_dir();
    if (resolved.empty()) {
      if (!c.no_python && host.is_regular_file(c.program)) {
        // Neither executable nor .py: a Python script without the suffix, as
        // torchrun runs it. The failure notes say that this was a guess.
        command = {python(), "-u", c.program};
        c.python_guessed = true;
      } else {
        fail("program '" + c.program + "' not found or not executable" +
             (bare_name ? " (searched the current directory and PATH)" : ""));
      }
    } else {
      command = {resolved};
    }
  }
  command.insert(command.end(), c.program_args.begin(), c.program_args.end());
  c.agent.spec.argv = std::move(command);
}

}  // namespace ddp::launcher
