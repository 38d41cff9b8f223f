#include "status_command.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "ddp/common/env.h"
#include "ddp/common/error.h"
#include "status_terminal.h"
#include "status_view.h"

namespace ddp::launcher::status {

namespace {

// Width of a view printed where no terminal says it (a pipe, a file): $COLUMNS, else this.
constexpr int kDefaultWidth = 120;

std::optional<std::chrono::milliseconds> seconds_value(const std::string& text) {
  try {
    return env::parse_seconds(text, "");
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// "--name=value" or "--name value": the value, consuming the next argument
// in the second form; nullopt when `args[i]` is not that option.
std::optional<std::string> option_value(const std::vector<std::string>& args, std::size_t& i,
                                        std::initializer_list<const char*> names,
                                        std::string& error) {
  for (const char* name : names) {
    const std::string n(name);
    if (args[i] == n) {
      if (i + 1 >= args.size()) {
        error = n + " needs a value";
        return std::string();
      }
      return args[++i];
    }
    if (args[i].rfind(n + "=", 0) == 0) return args[i].substr(n.size() + 1);
  }
  return std::nullopt;
}

std::string first_line_of(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument("", "--token_file: cannot read " + path);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

// What every URL answered, parsed; `previous` (same order) gives the node each
// was last seen as.
std::vector<AgentAnswer> ask(const StatusArgs& args, const std::string& token,
                             const std::vector<AgentAnswer>& previous) {
  const std::vector<FetchReply> replies = fetch_statuses(args.urls, token, args.timeout);
  std::vector<AgentAnswer> answers(replies.size());
  for (std::size_t i = 0; i < replies.size(); ++i) {
    AgentAnswer& a = answers[i];
    a.url = args.urls[i].text;
    if (i < previous.size()) {
      a.last_node = previous[i].last_node;
      a.last_host = previous[i].last_host;
    }
    if (!replies[i].body) {
      a.error = replies[i].error;
      continue;
    }
    ParsedDocument parsed = parse_status_document(*replies[i].body);
    if (!parsed.document) {
      a.error = parsed.error;
      continue;
    }
    a.document = std::move(parsed.document);
    if (const auto* agent = std::get_if<AgentStatus>(&*a.document)) {
      if (agent->group_rank) a.last_node = agent->group_rank;
      a.last_host = agent->host;
    }
  }
  return answers;
}

int columns_from_env() {
  const char* columns = std::getenv("COLUMNS");
  const int n = columns ? std::atoi(columns) : 0;
  return n > 0 ? n : kDefaultWidth;
}

int print_once(const StatusArgs& args, const std::string& token) {
  const std::vector<AgentAnswer> answers = ask(args, token, {});
  ViewSize size;
  const TerminalSize terminal = terminal_size(STDOUT_FILENO);
  size.width = terminal.width > 0 ? terminal.width : columns_from_env();
  std::string text;
  for (const auto& line : render_status_view(answers, size)) text += line + "\n";
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  int code = 0;
  for (const auto& a : answers) {
    if (a.document) continue;
    std::fprintf(stderr, "ddprun status: %s: %s\n", a.url.c_str(), a.error.c_str());
    code = 1;
  }
  return code;
}

int watch(const StatusArgs& args, const std::string& token) {
  WatchScreen screen;
  std::vector<AgentAnswer> answers;
  WatchScreen::Wake wake = WatchScreen::Wake::kTime;
  while (wake != WatchScreen::Wake::kQuit) {
    if (wake == WatchScreen::Wake::kTime) answers = ask(args, token, answers);
    if (screen.quit()) break;
    ViewSize size;
    const TerminalSize terminal = terminal_size(STDOUT_FILENO);
    size.width = terminal.width > 0 ? terminal.width : columns_from_env();
    size.height = screen.in_place() ? terminal.height : 0;
    screen.draw(render_status_view(answers, size));
    wake = screen.wait(*args.watch);
  }
  return 0;
}

}  // namespace

std::string status_usage() {
  return "usage: ddprun status [--watch [SECONDS]] [--token TOKEN | --token_file PATH]\n"
         "                     [--timeout SECONDS] URL [URL...]\n"
         "\n"
         "Prints the job as its agents' live views (--status_port) show it: the agents,\n"
         "the nodes with their states and keep-alive ages, the ranks with their step\n"
         "times and straggler scores, the last events and the last incident.\n"
         "\n"
         "  URL                  an agent's live view: http://HOST:PORT/ (the address its\n"
         "                       log names), HOST:PORT, or .../status; one per node\n"
         "  --watch [SECONDS]    redraw in place every SECONDS (default 2) until Ctrl-C or q\n"
         "  --token TOKEN        the store's token, for live views beyond loopback\n"
         "                       (default: $DDP_STORE_TOKEN)\n"
         "  --token_file PATH    the token is the first line of PATH\n"
         "  --timeout SECONDS    how long an agent has to answer (default 2)\n"
         "\n"
         "Exit status: 0 when every URL answered, 1 when one did not (each named on\n"
         "stderr), 2 for a usage error; with --watch, 0 when quit.\n";
}

StatusArgs parse_status_args(const std::vector<std::string>& args) {
  StatusArgs out;
  bool only_urls = false;
  for (std::size_t i = 0; i < args.size() && out.error.empty(); ++i) {
    const std::string& arg = args[i];
    if (!only_urls && arg.rfind("-", 0) == 0) {
      if (arg == "--") {
        only_urls = true;
      } else if (arg == "-h" || arg == "--help") {
        out.help = true;
      } else if (arg == "--watch") {
        out.watch = kDefaultWatch;
        if (i + 1 < args.size()) {
          if (auto s = seconds_value(args[i + 1])) {
            out.watch = *s;
            ++i;
          }
        }
      } else if (arg.rfind("--watch=", 0) == 0) {
        out.watch = seconds_value(arg.substr(8));
        if (!out.watch) out.error = "--watch: expected seconds, got '" + arg.substr(8) + "'";
      } else if (auto v = option_value(args, i, {"--token"}, out.error)) {
        out.token = *v;
      } else if (auto f = option_value(args, i, {"--token_file", "--token-file"}, out.error)) {
        out.token_file = *f;
      } else if (auto t = option_value(args, i, {"--timeout"}, out.error)) {
        const auto s = seconds_value(*t);
        if (s && s->count() > 0) {
          out.timeout = *s;
        } else if (out.error.empty()) {
          out.error = "--timeout: expected seconds (more than 0), got '" + *t + "'";
        }
      } else {
        out.error = "unknown option '" + arg + "'";
      }
      continue;
    }
    try {
      out.urls.push_back(parse_status_url(arg));
    } catch (const std::exception& e) {
      out.error = e.what();
    }
  }
  if (out.watch && out.watch->count() <= 0 && out.error.empty()) {
    out.error = "--watch: the period must be more than 0 seconds";
  }
  if (out.error.empty() && !out.help && out.urls.empty()) {
    out.error = "no URL: name the live view of at least one agent (http://HOST:PORT/)";
  }
  return out;
}

std::string resolve_token(const StatusArgs& args, const std::string& env_token) {
  if (!args.token.empty()) return args.token;
  if (!args.token_file.empty()) return first_line_of(args.token_file);
  return env_token;
}

int run_status_command(int argc, char** argv) {
  const StatusArgs args = parse_status_args(std::vector<std::string>(argv + 1, argv + argc));
  if (args.help) {
    std::fputs(status_usage().c_str(), stdout);
    return 0;
  }
  if (!args.error.empty()) {
    std::fprintf(stderr, "ddprun status: error: %s (ddprun status --help shows the usage)\n",
                 args.error.c_str());
    return 2;
  }
  std::string token;
  try {
    token = resolve_token(args, env::get_or("DDP_STORE_TOKEN", ""));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun status: error: %s\n", e.what());
    return 2;
  }
  return args.watch ? watch(args, token) : print_once(args, token);
}

}  // namespace ddp::launcher::status
