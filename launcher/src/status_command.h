// `ddprun status [options] URL [URL...]`: the terminal view of a job, from the
// live views of its agents (docs/using.md, "A terminal view").
//
//   parse_status_args   the command line (after "status"), pure
//   run_status_command  fetches, parses and prints once, or redraws in place
//                       every --watch seconds until Ctrl-C or q; blocks until
//                       then. Returns the exit code.
//
// Thread-safety: run_status_command installs signal handlers (SIGINT, SIGTERM,
// SIGHUP, SIGWINCH) while it watches: call it from main's thread, once.
// Errors: parse_status_args says what is wrong in StatusArgs::error; run
// reports failures on stderr and in its exit code.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "status_fetch.h"

namespace ddp::launcher::status {

struct StatusArgs {
  std::vector<StatusUrl> urls;
  std::string token;                               // --token
  std::string token_file;                          // --token_file
  std::optional<std::chrono::milliseconds> watch;  // --watch [SECONDS]
  std::chrono::milliseconds timeout{2000};         // --timeout SECONDS
  bool help = false;
  std::string error;  // a usage error; empty when the arguments are fine
};

// The default of a bare --watch.
inline constexpr std::chrono::milliseconds kDefaultWatch{2000};

// `args` are the arguments after "status".
StatusArgs parse_status_args(const std::vector<std::string>& args);

// The token to send: --token, else the first line of --token_file, else
// `env_token` (DDP_STORE_TOKEN). Throws InvalidArgument when the file cannot be read.
std::string resolve_token(const StatusArgs& args, const std::string& env_token);

std::string status_usage();

// `argv[0]` is "status".
int run_status_command(int argc, char** argv);

}  // namespace ddp::launcher::status
