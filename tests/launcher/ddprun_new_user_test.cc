// What a new user trips on (issue 29), end to end on the ddprun binary: the
// documented commands run as written (README.md, docs/using.md, --help), logs
// that a rerun must not overwrite, output and reports that must outlive the
// run, --standalone with --rdzv_id, executables named without a path, the
// Python guess, torchrun's --rdzv_conf keys, the file timer's reaping line and
// DDP_STORE_PREFIX as documented.
#include <sys/stat.h>

#include <fstream>
#include <regex>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "net_util.h"
#include "process_util.h"
#include "temp_dir.h"

namespace ddp::test {
namespace {

std::string ddprun() { return bin_dir() + "/ddprun"; }
std::string worker() { return bin_dir() + "/ddprun_test_worker"; }
fs::path source_dir() { return DDP_SOURCE_DIR; }

std::vector<std::string> cmd(std::initializer_list<std::string> ddprun_args,
                             std::initializer_list<std::string> program) {
  std::vector<std::string> argv{ddprun()};
  argv.insert(argv.end(), ddprun_args);
  argv.insert(argv.end(), program);
  return argv;
}

// Single-quotes `text` for sh.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char ch : text) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

void write_executable(const fs::path& path, const std::string& text, bool executable = true) {
  std::ofstream(path) << text;
  fs::permissions(
      path, executable ? fs::perms::owner_all : fs::perms::owner_read | fs::perms::owner_write);
}

// The value of the first "<prefix><value>" line of `text` (to the end of the line).
std::string line_after(const std::string& text, const std::string& prefix) {
  const auto at = text.find(prefix);
  if (at == std::string::npos) return "";
  const auto start = at + prefix.size();
  return text.substr(start, text.find('\n', start) - start);
}

// Every entry of `dir` whose name starts with `prefix`.
std::vector<fs::path> entries(const fs::path& dir, const std::string& prefix = "") {
  std::vector<fs::path> found;
  if (!fs::exists(dir)) return found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) found.push_back(entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

class NewUserTest : public ::testing::Test {
 protected:
  // The test's $TMPDIR, so that ddprun's temporary folders are the test's.
  std::map<std::string, std::string> env_with_tmp() {
    fs::create_directories(tmp());
    auto env = base_env();
    env["TMPDIR"] = tmp().string();
    return env;
  }
  fs::path tmp() const { return dir_.path() / "tmp"; }
  TempDir dir_;
};

// ------------------------------------------------- the documented ${local_rank}

// The documented commands that substitute ${local_rank} in a program argument
// (lines starting "ddprun " with "--no_python" and "${local_rank}").
std::vector<std::string> local_rank_commands(const std::string& text) {
  std::vector<std::string> found;
  for (std::string line : lines_of(text)) {
    line.erase(0, line.find_first_not_of(' '));
    if (line.rfind("ddprun ", 0) == 0 && line.find("--no_python") != std::string::npos &&
        line.find("${local_rank}") != std::string::npos) {
      found.push_back(line);
    }
  }
  return found;
}

// Runs a documented command as written, through bash, in a folder where its
// program (the word after --no_python) is a script that creates the file its
// second argument names; each worker must have created its own file.
void expect_each_worker_gets_its_file(const std::string& command, const fs::path& dir) {
  SCOPED_TRACE(command);
  std::istringstream words(command.substr(command.find("--no_python") + 11));
  std::string program, flag, file;
  words >> program >> flag >> file;
  ASSERT_TRUE(program.rfind("./", 0) == 0) << "a program in the current folder: " << program;
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_executable(dir / program.substr(2), "#!/bin/sh\n: > \"$2\"\n");
  auto env = base_env();
  env["TMPDIR"] = dir.parent_path().string();  // never /tmp, whatever happens
  env["PATH"] = bin_dir() + ":" + env["PATH"];
  auto result = run({"/bin/bash", "-c", "cd " + quoted(dir.string()) + " && " + command}, env,
                    dir.parent_path());
  ASSERT_EQ(result.code, 0) << result.err;
  // The file name as the worker sees it: the shell's quotes gone.
  std::string name = file;
  name.erase(std::remove(name.begin(), name.end(), '\''), name.end());
  const auto at = name.find("${local_rank}");
  ASSERT_NE(at, std::string::npos) << file;
  for (const std::string rank : {"0", "1"}) {
    std::string expected = name;
    expected.replace(at, 13, rank);
    EXPECT_TRUE(fs::exists(dir / expected))
        << expected << " missing; the folder holds: " << ::testing::PrintToString(entries(dir));
  }
}

TEST_F(NewUserTest, TheDocumentedLocalRankCommandsGiveEveryWorkerItsOwnFile) {
  const auto help = run({ddprun(), "--help"}, env_with_tmp(), dir_.path());
  ASSERT_EQ(help.code, 0);
  const std::map<std::string, std::string> sources = {
      {"README.md", read_text(source_dir() / "README.md")},
      {"docs/using.md", read_text(source_dir() / "docs/using.md")},
      {"ddprun --help", help.out}};
  for (const auto& [name, text] : sources) {
    SCOPED_TRACE(name);
    const auto commands = local_rank_commands(text);
    ASSERT_FALSE(commands.empty()) << name << " shows no such command any more";
    for (const auto& command : commands) {
      expect_each_worker_gets_its_file(command, dir_.path() / "work");
    }
  }
}

// ------------------------------------------------------------------- log folders

TEST_F(NewUserTest, ARerunWithTheSameIdAndLogDirKeepsTheFirstRunsLogs) {
  const fs::path logs = dir_.path() / "logs";
  std::vector<std::string> announced;
  for (const std::string run_name : {"first", "second"}) {
    auto env = env_with_tmp();
    env["WHICH_RUN"] = run_name;
    auto result =
        run(cmd({"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + std::to_string(free_port()),
                 "--rdzv_id=job", "--log_dir", logs.string(), "-r", "3", "--no_python"},
                {"/bin/sh", "-c", "echo run $WHICH_RUN; exit 0"}),
            env, dir_.path());
    ASSERT_EQ(result.code, 0) << result.err;
    announced.push_back(line_after(result.err, "ddprun: logs of this run in "));
  }
  const auto runs = entries(logs, "job_");
  ASSERT_EQ(runs.size(), 2u) << "one folder per run: " << ::testing::PrintToString(entries(logs));
  EXPECT_EQ(std::set<std::string>(announced.begin(), announced.end()),
            (std::set<std::string>{runs[0].string(), runs[1].string()}))
      << "each run names its folder at start";
  std::set<std::string> outputs;
  for (const auto& dir : runs) outputs.insert(read_text(dir / "attempt_0" / "0" / "stdout.log"));
  EXPECT_EQ(outputs, (std::set<std::string>{"run first\n", "run second\n"}));
}

TEST_F(NewUserTest, RedirectedOutputWithoutLogDirIsKeptWhereTheStartSaid) {
  auto result = run(cmd({"--standalone", "--nproc_per_node=2", "-r", "3", "--no_python"},
                        {"/bin/sh", "-c", "echo hello from $LOCAL_RANK"}),
                    env_with_tmp(), dir_.path());
  ASSERT_EQ(result.code, 0) << result.err;
  const std::string run_dir = line_after(result.err, "ddprun: logs of this run in ");
  ASSERT_FALSE(run_dir.empty()) << "the start names where the output goes: " << result.err;
  const fs::path dir = run_dir.substr(0, run_dir.find(' '));
  EXPECT_EQ(read_text(dir / "attempt_0" / "0" / "stdout.log"), "hello from 0\n") << result.err;
  EXPECT_EQ(read_text(dir / "attempt_0" / "1" / "stdout.log"), "hello from 1\n") << result.err;
  EXPECT_EQ(dir.parent_path().parent_path(), tmp());
}

TEST_F(NewUserTest, AnErrorFileNamedByTheFailureReportOutlivesTheRunAndTheNextRun) {
  auto env = env_with_tmp();
  auto result = run(cmd({"--standalone", "--nproc_per_node=1", "--no_python"},
                        {worker(), "error_file", "3", "boom"}),
                    env, dir_.path());
  ASSERT_EQ(result.code, 3) << result.err;
  const std::string error_file = line_after(result.err, "  error_file: ");
  ASSERT_TRUE(error_file.ends_with("/attempt_0/0/error.json")) << result.err;
  EXPECT_TRUE(fs::exists(error_file)) << "the report named a file that is gone\n" << result.err;
  EXPECT_NE(result.err.find("ddprun: kept "), std::string::npos) << result.err;
  // The next ddprun's sweep of dead ddpruns' folders leaves a kept one.
  auto next = run(cmd({"--standalone", "--no_python"}, {"/bin/true"}), env, dir_.path());
  ASSERT_EQ(next.code, 0) << next.err;
  EXPECT_TRUE(fs::exists(error_file));
  // A run that named nothing leaves nothing behind.
  EXPECT_EQ(entries(tmp()).size(), 1u) << ::testing::PrintToString(entries(tmp()));
}

TEST_F(NewUserTest, AHangIncidentWithoutLogDirIsKeptWhereItWasNamedAndPrivate) {
  auto result = run(cmd({"--standalone", "--nproc_per_node=2", "--hang_timeout=1", "--on_hang=fail",
                         "--no_python"},
                        {"/bin/sh", "-c", "if [ \"$LOCAL_RANK\" = 1 ]; then exec sleep 60; fi"}),
                    env_with_tmp(), dir_.path(), std::chrono::seconds(60));
  ASSERT_NE(result.code, 0) << result.err;
  const std::string incident = line_after(result.err, "ddprun: incident written to ");
  ASSERT_FALSE(incident.empty()) << result.err;
  EXPECT_TRUE(fs::exists(incident)) << "a path printed during the run is gone\n" << result.err;
  EXPECT_TRUE(entries(tmp(), "ddprun-hang-").empty())
      << "no copy outside the private folder: " << ::testing::PrintToString(entries(tmp()));
  // The private folder it is in, in $TMPDIR, is its owner's alone.
  const fs::path relative = fs::path(incident).lexically_relative(tmp());
  ASSERT_FALSE(relative.empty() || relative.begin()->string() == "..") << incident;
  const fs::path folder = tmp() / *relative.begin();
  struct stat st {};
  ASSERT_EQ(::stat(folder.c_str(), &st), 0) << folder;
  EXPECT_EQ(st.st_mode & 077, 0u) << folder << " can be read by others";
}

// --------------------------------------------------------------------- --standalone

TEST_F(NewUserTest, StandaloneKeepsAGivenRdzvIdForTheRunAndItsLogs) {
  const fs::path logs = dir_.path() / "logs";
  auto result =
      run(cmd({"--standalone", "--rdzv_id=myjob", "--log_dir", logs.string(), "--no_python"},
              {worker(), "env", dir_.str()}),
          env_with_tmp(), dir_.path());
  ASSERT_EQ(result.code, 0) << result.err;
  const auto data = nlohmann::json::parse(read_text(dir_.path() / "env_0_0.json"));
  EXPECT_EQ(data["env"]["TORCHELASTIC_RUN_ID"], "myjob");
  EXPECT_EQ(entries(logs, "myjob_").size(), 1u) << ::testing::PrintToString(entries(logs));
}

// ------------------------------------------------------------- finding the program

TEST_F(NewUserTest, AnExecutableNamedWithoutAPathRunsDirectly) {
  const fs::path work = dir_.path() / "work";
  fs::create_directories(work);
  write_executable(work / "train_cpp", "#!/bin/sh\necho shell ran rank $RANK\n");
  auto env = env_with_tmp();
  ASSERT_EQ(env["PATH"].find(work.string()), std::string::npos);
  auto result = run({"/bin/sh", "-c",
                     "cd " + quoted(work.string()) + " && exec " + quoted(ddprun()) +
                         " --standalone --nproc_per_node=2 train_cpp"},
                    env, dir_.path());
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.out.find("[default0]:shell ran rank 0"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("[default1]:shell ran rank 1"), std::string::npos) << result.out;
}

TEST_F(NewUserTest, ThePythonGuessForAFileThatIsNotExecutableSaysWhatItGuessed) {
  const fs::path work = dir_.path() / "work";
  fs::create_directories(work);
  write_executable(work / "train_job", "#!/bin/sh\necho not python\nexit 3\n",
                   /*executable=*/false);
  auto result = run(
      {"/bin/sh", "-c",
       "cd " + quoted(work.string()) + " && exec " + quoted(ddprun()) + " --standalone train_job"},
      env_with_tmp(), dir_.path());
  ASSERT_NE(result.code, 0) << result.err;
  EXPECT_NE(result.err.find("ddprun: note: the workers ran train_job as a Python script ("),
            std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("it is not executable and its name does not end in .py\n"
                            "ddprun: note: if train_job is not Python, make it executable "
                            "(chmod +x train_job) to run it directly\n"),
            std::string::npos)
      << result.err;
  EXPECT_EQ(result.err.find("no module named 'torch'"), std::string::npos)
      << "a guess is named, not what that Python lacks: " << result.err;
  // The report named no file (Python wrote no error file): nothing is kept.
  EXPECT_EQ(result.err.find("ddprun: kept "), std::string::npos) << result.err;
  EXPECT_TRUE(entries(tmp()).empty()) << ::testing::PrintToString(entries(tmp()));
}

// --------------------------------------------------------------- torchrun's keys

TEST_F(NewUserTest, TorchrunsRdzvConfKeysAreAccepted) {
  // Static: torchrun's `timeout` (the join timeout) and the `rank` torchrun
  // sets itself (ignored, with a warning).
  auto result = run(cmd({"--nnodes=1", "--master_port=" + std::to_string(free_port()),
                         "--rdzv_conf=timeout=30,rank=0", "--no_python"},
                        {"/bin/true"}),
                    env_with_tmp(), dir_.path());
  EXPECT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.err.find("ddprun: warning: --rdzv_conf rank is ignored: --node_rank gives"),
            std::string::npos)
      << result.err;
  // c10d: store_type=tcp, torchrun's default.
  result =
      run(cmd({"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + std::to_string(free_port()),
               "--rdzv_conf=store_type=tcp", "--no_python"},
              {"/bin/true"}),
          env_with_tmp(), dir_.path());
  EXPECT_EQ(result.code, 0) << result.err;
}

// ------------------------------------------------------------------ the file timer

TEST_F(NewUserTest, TheFileTimersReapingLineIsPrintedAtTheDefaultLevel) {
  auto env = env_with_tmp();
  env["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1";
  env["TORCHELASTIC_TIMER_FILE"] = (dir_.path() / "timer").string();
  // torch's FileTimerClient request, already expired, for the worker itself.
  const std::string request =
      "echo '{\"version\": 1, \"pid\": '$$', \"scope_id\": \"step\", \"expiration_time\": 1, "
      "\"signal\": 9}' > \"$TORCHELASTIC_TIMER_FILE\"; echo $$ > " +
      quoted((dir_.path() / "pid").string()) + "; exec sleep 30";
  auto result =
      run(cmd({"--standalone", "--no_python"}, {"/bin/sh", "-c", request}), env, dir_.path());
  EXPECT_EQ(result.code, 128 + SIGKILL) << result.err;
  const std::string pid = lines_of(read_text(dir_.path() / "pid")).at(0);
  EXPECT_NE(result.err.find("Reaping worker_pid=[" + pid + "]. Expired timers: [step]\n"),
            std::string::npos)
      << result.err;
}

// ------------------------------------------------------------ DDP_STORE_PREFIX

// docs/using.md's formats of DDP_STORE_PREFIX (each `...` in the parenthesis
// that follows its name), as regular expressions: `<run_id>` is the run id,
// any other `<name>` one path component.
std::map<std::string, std::regex> documented_store_prefixes(const std::string& run_id) {
  const std::string doc = read_text(source_dir() / "docs/using.md");
  const auto name = doc.find("`DDP_STORE_PREFIX`\n(");
  EXPECT_NE(name, std::string::npos) << "docs/using.md no longer describes DDP_STORE_PREFIX";
  if (name == std::string::npos) return {};
  const auto open = doc.find('(', name);
  const std::string text = doc.substr(open, doc.find(')', open) - open);
  std::map<std::string, std::regex> formats;
  for (auto at = text.find('`'); at != std::string::npos;
       at = text.find('`', text.find('`', at + 1) + 1)) {
    const std::string format = text.substr(at + 1, text.find('`', at + 1) - at - 1);
    if (format.find('/') == std::string::npos) continue;  // `--standalone`
    std::string pattern;
    for (std::size_t i = 0; i < format.size();) {
      if (format[i] == '<') {
        const auto end = format.find('>', i);
        pattern += format.substr(i + 1, end - i - 1) == "run_id" ? run_id : "[^/_]+";
        i = end + 1;
      } else {
        if (std::string("\\^$.|?*+()[]{}").find(format[i]) != std::string::npos) pattern += '\\';
        pattern += format[i++];
      }
    }
    formats.emplace(format, std::regex(pattern));
  }
  return formats;
}

TEST_F(NewUserTest, DdpStorePrefixIsAsDocumented) {
  const auto formats = documented_store_prefixes("job7");
  ASSERT_FALSE(formats.empty());
  const std::vector<std::vector<std::string>> backends = {
      {"--nnodes=1", "--master_port=" + std::to_string(free_port())},
      {"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + std::to_string(free_port()),
       "--nnodes=1:2", "--rdzv_conf=last_call_timeout=0"},
      {"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + std::to_string(free_port())},
      {"--standalone"}};
  std::set<std::string> seen;
  int run_number = 0;
  for (const auto& args : backends) {
    SCOPED_TRACE(::testing::PrintToString(args));
    const fs::path out = dir_.path() / ("run" + std::to_string(run_number++));
    fs::create_directories(out);
    std::vector<std::string> argv{ddprun()};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--rdzv_id=job7", "--no_python", worker(), "env", out.string()});
    auto result = run(argv, env_with_tmp(), dir_.path());
    ASSERT_EQ(result.code, 0) << result.err;
    const auto data = nlohmann::json::parse(read_text(out / "env_0_0.json"));
    const std::string prefix = data["env"]["DDP_STORE_PREFIX"];
    bool documented = false;
    for (const auto& [format, pattern] : formats) {
      if (std::regex_match(prefix, pattern)) {
        documented = true;
        seen.insert(format);
      }
    }
    EXPECT_TRUE(documented) << "DDP_STORE_PREFIX=" << prefix
                            << " is none of docs/using.md's formats";
  }
  EXPECT_EQ(seen.size(), formats.size()) << "a documented format no run had";
}

}  // namespace
}  // namespace ddp::test
