// ddprun's command line: torchrun's options (options.h's table) with both
// spellings and PET_<NAME> fallbacks. CLI11 does the tokenizing; every value
// is read as text, filled in from SLURM where not given (slurm.cc), and
// validated by resolve_options (resolve.cc) so that each mistake gets one line
// naming the option. What the machine says (environment, CPUs, GPUs, host
// name, files) comes through a HostFacts.
#include <algorithm>

#include <CLI/CLI.hpp>

#include "ddp/launcher/launch_config.h"
#include "ddp/launcher/slurm.h"
#include "options.h"
#include "resolve.h"
#include "values.h"

namespace ddp::launcher {
namespace {

// torchrun's (argparse's) layout: usage line first, then the description.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_description(const CLI::App*) const override { return ""; }
  std::string make_usage(const CLI::App*, std::string) const override { return kUsage; }
};

class Parser {
 public:
  explicit Parser(const HostFacts& host) : host_(host), raw_(default_options()) {
    app_.formatter(std::make_shared<HelpFormatter>());
    app_.prefix_command();
    app_.set_version_flag("--version", kVersion);
    app_.footer(kFooter);
    for (const auto& row : option_table()) {
      // The help says what CLI11 would for an option with a type name (the
      // variable's name without PET_), a default and an envname; the variable
      // itself is read through `host` (read_environment).
      const std::string env = option_env_name(row.name);
      std::string text;
      CLI::Option* option = nullptr;
      if (row.text != nullptr) {
        option = app_.add_option(option_names(row), raw_.*row.text, row.help);
        text = env.substr(4) + (row.default_value.empty() ? "" : "=" + row.default_value) + " ";
      } else {
        option = app_.add_flag(option_names(row), raw_.*row.flag, row.help);
      }
      option->option_text(text + "(Env:" + env + ")");
    }
  }

  ParseResult parse(int argc, const char* const* argv) {
    ParseResult result;
    for (int i = 1; i < argc; ++i) args_.emplace_back(argv[i]);
    try {
      bool help = false;
      try {
        app_.parse(argc, argv);
      } catch (const CLI::CallForHelp&) {
        help = true;
      } catch (const CLI::CallForAllHelp&) {
        help = true;
      } catch (const CLI::CallForVersion&) {
        result.output = std::string(kVersion) + "\n";
        return result;
      }
      // As CLI11's own envname: a bad PET_<NAME> flag fails --help too.
      read_environment();
      if (help) {
        result.output = app_.help();
        return result;
      }
      result.config = validate();
    } catch (const CLI::ParseError& e) {
      result.output = "ddprun: error: " + one_line(e) + " (see ddprun --help)\n";
      result.exit_code = 2;
    } catch (const UsageError& e) {
      result.output = "ddprun: error: " + e.message + " (see ddprun --help)\n";
      result.exit_code = 2;
    }
    return result;
  }

 private:
  // PET_<NAME> for every option the command line did not give, read as
  // CLI11's envname reads it: a variable set to "" counts as unset.
  void read_environment() {
    for (const auto& row : option_table()) {
      CLI::Option* option = app_.get_option("--" + row.name);
      if (option->count() > 0) continue;
      auto value = host_.env(option_env_name(row.name));
      if (!value || value->empty()) continue;
      option->add_result(*value);
      option->run_callback();
    }
  }

  static std::string one_line(const CLI::ParseError& e) {
    std::string text = e.what();
    std::replace(text.begin(), text.end(), '\n', ' ');
    if (e.get_name() == "ArgumentMismatch") {
      return "option " + text.substr(0, text.find(':')) + " needs a value";
    }
    return text;
  }

  // "--nproc_per_node", or "--nproc_per_node (from PET_NPROC_PER_NODE)" (or
  // "(from SLURM_...)") when the value came from the environment.
  std::string what(const std::string& name) const {
    std::string dashed = name;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    for (const auto& arg : args_) {
      if (arg == "--") break;
      for (const std::string& spelled : {"--" + name, "--" + dashed}) {
        if (arg == spelled || arg.rfind(spelled + "=", 0) == 0) return "--" + name;
      }
    }
    if (auto it = from_slurm_.find(name); it != from_slurm_.end()) {
      return "--" + name + " (from " + it->second + ")";
    }
    const std::string env = option_env_name(name);
    return host_.env(env) ? "--" + name + " (from " + env + ")" : "--" + name;
  }

  // Whether the option was given, on the command line or as PET_<NAME>.
  bool given(const std::string& name) const { return app_.get_option("--" + name)->count() > 0; }

  LaunchConfig validate() {
    // The program: what CLI11 left over, after an optional "--".
    std::vector<std::string> rest = app_.remaining();
    if (!rest.empty() && rest[0] == "--") rest.erase(rest.begin());
    if (rest.empty())
      fail("missing the program to run (usage: ddprun [options] program [args...])");
    if (rest[0].size() > 1 && rest[0][0] == '-') fail("unrecognized option '" + rest[0] + "'");
    auto given = [&](const std::string& name) { return this->given(name); };
    fill_from_slurm(SlurmEnvironment(host_.env), given, raw_, from_slurm_);
    const OptionOrigins origins{[&](const std::string& name) { return what(name); }, given,
                                from_slurm_};
    return resolve_options(raw_, rest, origins, host_);
  }

  const HostFacts& host_;
  CLI::App app_{"", "ddprun"};
  RawOptions raw_;
  std::vector<std::string> args_;
  // Option name -> where its value came from, for options SLURM filled in.
  std::map<std::string, std::string> from_slurm_;
};

}  // namespace

ParseResult parse_command_line(int argc, const char* const* argv, const HostFacts& host) {
  Parser parser(host);
  return parser.parse(argc, argv);
}

ParseResult parse_command_line(int argc, const char* const* argv) {
  return parse_command_line(argc, argv, real_host_facts());
}

}  // namespace ddp::launcher
