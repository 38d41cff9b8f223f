// parse_command_line on a fake host (HostFacts): the environment, CPUs, GPUs,
// host name and files are the test's, so every option's path is checked here
// without starting ddprun: PET_<NAME> fallbacks, flags over them,
// --nproc_per_node cpu/gpu/auto, --rdzv_conf's keys, SLURM's fill-in,
// host-name defaults and how the program's command is found. (ddprun_test
// checks the same messages end to end, on the real host.)
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/launcher/host_facts.h"
#include "ddp/launcher/launch_config.h"
#include "temp_dir.h"

namespace ddp::launcher {
namespace {

using namespace std::chrono_literals;

// A machine made of maps; every fact parse_command_line asks for comes from here.
struct FakeHost {
  std::map<std::string, std::string> env{{"PATH", "/usr/bin:/bin"}};
  int cpus = 6;
  int gpu_nodes = 0;
  std::string hostname = "node7";
  // Regular files that are not executable.
  std::set<std::string> files;
  // Regular files that may be executed.
  std::set<std::string> executables{"/usr/bin/python3", "/bin/true"};
  // Readable files and their text.
  std::map<std::string, std::string> readable;
  // ddprun's Python module folder ("" when it has none).
  std::string python_module_dir;
  // Where --numa_binding reads sysfs (a fake topology's folder).
  std::string sysfs_root = "/nonexistent-sysfs";

  HostFacts facts() const {
    auto regular = [this](const std::string& path) {
      return files.count(path) > 0 || executables.count(path) > 0 || readable.count(path) > 0;
    };
    return HostFacts{
        .env = [this](const std::string& name) -> std::optional<std::string> {
          auto it = env.find(name);
          if (it == env.end()) return std::nullopt;
          return it->second;
        },
        .online_cpus = [this] { return cpus; },
        .gpu_device_nodes = [this] { return gpu_nodes; },
        .hostname = [this] { return hostname; },
        .is_regular_file = regular,
        .is_readable = [this](const std::string& path) { return readable.count(path) > 0; },
        .resolve_program = [this](const std::string& program,
                                  const std::string& path) -> std::string {
          if (program.find('/') != std::string::npos) {
            return executables.count(program) > 0 ? program : "";
          }
          std::istringstream dirs(path);
          for (std::string dir; std::getline(dirs, dir, ':');) {
            const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
            if (executables.count(candidate) > 0) return candidate;
          }
          return "";
        },
        .first_line =
            [this](const std::string& path) {
              auto it = readable.find(path);
              if (it == readable.end()) return std::string();
              return it->second.substr(0, it->second.find('\n'));
            },
        .python_module_dir = [this] { return python_module_dir; },
        .allowed_cpus = {},
        .sysfs_root = sysfs_root,
    };
  }

  ParseResult parse(std::vector<std::string> args) const {
    args.insert(args.begin(), "ddprun");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    const HostFacts host = facts();
    return parse_command_line(static_cast<int>(argv.size()), argv.data(), host);
  }

  // The config of a command line that must parse.
  LaunchConfig config(const std::vector<std::string>& args) const {
    auto parsed = parse(args);
    EXPECT_TRUE(parsed.config.has_value()) << parsed.output;
    return parsed.config.value_or(LaunchConfig{});
  }

  // The message of a command line that must not parse (exit code 2, one line).
  std::string error(const std::vector<std::string>& args) const {
    auto parsed = parse(args);
    EXPECT_FALSE(parsed.config.has_value());
    EXPECT_EQ(parsed.exit_code, 2);
    const std::string prefix = "ddprun: error: ";
    const std::string suffix = " (see ddprun --help)\n";
    EXPECT_TRUE(parsed.output.starts_with(prefix) && parsed.output.ends_with(suffix))
        << parsed.output;
    if (parsed.output.size() < prefix.size() + suffix.size()) return parsed.output;
    return parsed.output.substr(prefix.size(),
                                parsed.output.size() - prefix.size() - suffix.size());
  }
};

TEST(ParseCommandLine, DefaultsAreThoseOfTheStructsTheConfigFeeds) {
  FakeHost host;
  const LaunchConfig c = host.config({"/bin/true"});
  const RendezvousConfig rendezvous;
  const agent::AgentOptions agent;
  EXPECT_EQ(c.rendezvous.backend, rendezvous.backend);
  EXPECT_EQ(c.rendezvous.host, rendezvous.host);
  EXPECT_EQ(c.rendezvous.port, rendezvous.port);
  EXPECT_EQ(c.master_addr, rendezvous.host);
  EXPECT_EQ(c.master_port, rendezvous.port);
  EXPECT_EQ(c.rendezvous.params.run_id, rendezvous.params.run_id);
  EXPECT_EQ(c.rendezvous.params.min_nodes, rendezvous.params.min_nodes);
  EXPECT_EQ(c.rendezvous.params.max_nodes, rendezvous.params.max_nodes);
  EXPECT_EQ(c.rendezvous.params.join_timeout, rendezvous.params.join_timeout);
  EXPECT_EQ(c.rendezvous.params.last_call_timeout, rendezvous.params.last_call_timeout);
  EXPECT_EQ(c.rendezvous.params.keep_alive_interval, rendezvous.params.keep_alive_interval);
  EXPECT_EQ(c.rendezvous.params.keep_alive_max_attempt, rendezvous.params.keep_alive_max_attempt);
  EXPECT_EQ(c.rendezvous.keep_alive_write_timeout, rendezvous.keep_alive_write_timeout);
  EXPECT_EQ(c.rendezvous.read_timeout, rendezvous.read_timeout);
  EXPECT_EQ(c.rendezvous.connect_timeout, c.rendezvous.params.join_timeout);
  EXPECT_EQ(c.agent.spec.role, agent.spec.role);
  EXPECT_EQ(c.agent.spec.max_restarts, agent.spec.max_restarts);
  EXPECT_EQ(c.agent.spec.local_world_size, agent.spec.local_world_size);
  EXPECT_EQ(c.agent.spec.line_prefix_template, agent.spec.line_prefix_template);
  EXPECT_EQ(c.agent.stop_grace, agent.stop_grace);
  EXPECT_EQ(c.agent.exit_barrier_timeout, agent.exit_barrier_timeout);
  EXPECT_EQ(c.agent.announce_timeout, agent.announce_timeout);
  EXPECT_FALSE(c.agent.set_omp_num_threads);
  // torchrun's documented defaults, as docs/using.md lists them.
  EXPECT_EQ(c.rendezvous.params.join_timeout, 600s);
  EXPECT_EQ(c.rendezvous.params.last_call_timeout, 30s);
  EXPECT_EQ(c.rendezvous.params.keep_alive_interval, 5s);
  EXPECT_EQ(c.rendezvous.params.keep_alive_max_attempt, 3);
  EXPECT_EQ(c.rendezvous.keep_alive_write_timeout, 5s);
  EXPECT_EQ(c.rendezvous.read_timeout, 60s);
  EXPECT_EQ(c.agent.announce_timeout, 5s);
  EXPECT_EQ(c.agent.exit_barrier_timeout, 300s);
  EXPECT_EQ(c.agent.stop_grace, 30s);
  EXPECT_EQ(c.signals, (std::vector<int>{SIGINT, SIGTERM, SIGHUP, SIGQUIT}));
  EXPECT_EQ(c.agent.hostname, "node7");
  EXPECT_TRUE(c.from_slurm.empty());
}

TEST(ParseCommandLine, PetVariablesAreFallbacks) {
  FakeHost host;
  host.env["PET_NNODES"] = "2";
  host.env["PET_NODE_RANK"] = "1";
  host.env["PET_MAX_RESTARTS"] = "3";
  host.env["PET_NO_PYTHON"] = "1";
  host.env["PET_RDZV_CONF"] = "join_timeout=7";
  host.env["PET_MASTER_ADDR"] = "10.0.0.1";
  host.env["PET_REDIRECTS"] = "2";
  const LaunchConfig c = host.config({"/bin/true"});
  EXPECT_EQ(c.rendezvous.params.max_nodes, 2);
  EXPECT_EQ(c.rendezvous.params.node_rank, 1);
  EXPECT_EQ(c.agent.spec.max_restarts, 3);
  EXPECT_TRUE(c.no_python);
  EXPECT_EQ(c.rendezvous.params.join_timeout, 7s);
  EXPECT_EQ(c.rendezvous.connect_timeout, 7s);
  EXPECT_EQ(c.rendezvous.host, "10.0.0.1");
  EXPECT_EQ(c.agent.spec.redirects.all, agent::Std::kErr);
}

TEST(ParseCommandLine, AFlagBeatsItsPetVariableWhichIsThenNotRead) {
  FakeHost host;
  host.env["PET_MAX_RESTARTS"] = "3";
  host.env["PET_ROLE"] = "reader";
  EXPECT_EQ(host.config({"--max_restarts=1", "/bin/true"}).agent.spec.max_restarts, 1);
  EXPECT_EQ(host.config({"--role", "trainer", "/bin/true"}).agent.spec.role, "trainer");
  host.env["PET_MAX_RESTARTS"] = "many";
  host.env["PET_STANDALONE"] = "not a boolean";
  const LaunchConfig c = host.config({"--max-restarts", "2", "--standalone", "/bin/true"});
  EXPECT_EQ(c.agent.spec.max_restarts, 2);
  EXPECT_TRUE(c.standalone);
}

TEST(ParseCommandLine, AnEmptyPetVariableCountsAsUnset) {
  FakeHost host;
  host.env["PET_NNODES"] = "";
  host.env["PET_STANDALONE"] = "";
  const LaunchConfig c = host.config({"/bin/true"});
  EXPECT_EQ(c.rendezvous.params.max_nodes, 1);
  EXPECT_FALSE(c.standalone);
}

TEST(ParseCommandLine, ABadPetValueNamesTheVariable) {
  FakeHost host;
  host.env["PET_NNODES"] = "3:2";
  EXPECT_EQ(host.error({"/bin/true"}),
            "--nnodes (from PET_NNODES): expected 0 < MIN <= MAX, got '3:2'");
  EXPECT_EQ(host.error({"--nnodes=4:1", "/bin/true"}),
            "--nnodes: expected 0 < MIN <= MAX, got '4:1'");
  host.env.erase("PET_NNODES");
  host.env["PET_MAX_RESTARTS"] = "many";
  EXPECT_EQ(host.error({"/bin/true"}),
            "--max_restarts (from PET_MAX_RESTARTS): expected a non-negative integer, got 'many'");
}

TEST(ParseCommandLine, StatusPortAndHostSetTheLiveView) {
  FakeHost host;
  EXPECT_FALSE(host.config({"/bin/true"}).agent.status.port.has_value());  // off by default
  EXPECT_EQ(host.config({"/bin/true"}).agent.status.host, "127.0.0.1");
  auto c = host.config({"--status_port=0", "/bin/true"});
  ASSERT_TRUE(c.agent.status.port.has_value());
  EXPECT_EQ(*c.agent.status.port, 0);
  c = host.config(
      {"--status-port", "9400", "--status_host=0.0.0.0", "--status_allow_no_token", "/bin/true"});
  EXPECT_EQ(c.agent.status.port.value_or(1), 9400);
  EXPECT_EQ(c.agent.status.host, "0.0.0.0");
  host.env["PET_STATUS_PORT"] = "9401";
  EXPECT_EQ(host.config({"/bin/true"}).agent.status.port.value_or(1), 9401);
  host.env.erase("PET_STATUS_PORT");
  EXPECT_EQ(host.error({"--status_port=65536", "/bin/true"}),
            "--status_port: expected a port in 0..65535 (0 picks one), got '65536'");
  EXPECT_EQ(host.error({"--status_port=web", "/bin/true"}),
            "--status_port: expected a port in 0..65535 (0 picks one), got 'web'");
  EXPECT_EQ(host.error({"--status_host", "", "/bin/true"}), "--status_host: empty address");
}

TEST(ParseCommandLine, HealthCheckAndItsTimeout) {
  FakeHost host;
  auto c = host.config({"/bin/true"});
  EXPECT_EQ(c.agent.health_check.command, "");  // off by default
  EXPECT_EQ(c.agent.health_check.timeout, std::chrono::seconds(60));
  c = host.config({"--health_check", "nvidia-smi -L", "--health-check-timeout=2.5", "/bin/true"});
  EXPECT_EQ(c.agent.health_check.command, "nvidia-smi -L");
  EXPECT_EQ(c.agent.health_check.timeout, std::chrono::milliseconds(2500));
  host.env["PET_HEALTH_CHECK"] = "true";
  host.env["PET_HEALTH_CHECK_TIMEOUT"] = "7";
  c = host.config({"/bin/true"});
  EXPECT_EQ(c.agent.health_check.command, "true");
  EXPECT_EQ(c.agent.health_check.timeout, std::chrono::seconds(7));
  host.env.erase("PET_HEALTH_CHECK_TIMEOUT");
  EXPECT_EQ(host.error({"--health_check_timeout=0", "/bin/true"}),
            "--health_check_timeout: expected a positive number of seconds, got '0'");
}

TEST(ParseCommandLine, ALiveViewBeyondLoopbackNeedsATokenOrTheFlagThatAllowsItWithout) {
  FakeHost host;
  const std::string refused =
      "' is beyond loopback and the store has no token (DDP_STORE_TOKEN), so the live view "
      "would show the job's hosts, addresses, pids and incidents to anyone who can reach the "
      "port; set DDP_STORE_TOKEN (clients must then carry it), listen on 127.0.0.1, or pass "
      "--status_allow_no_token to serve it anyway";
  for (const char* address : {"0.0.0.0", "::", "10.1.2.3", "node7"}) {
    SCOPED_TRACE(address);
    EXPECT_EQ(host.error({"--status_port=9400", "--status_host", address, "/bin/true"}),
              "--status_host: '" + std::string(address) + refused);
  }
  host.env["PET_STATUS_HOST"] = "0.0.0.0";
  EXPECT_EQ(host.error({"--status_port=0", "/bin/true"}),
            "--status_host (from PET_STATUS_HOST): '0.0.0.0" + refused);
  // Without a live view, the address serves nothing: no refusal.
  EXPECT_EQ(host.config({"/bin/true"}).agent.status.host, "0.0.0.0");
  host.env.erase("PET_STATUS_HOST");

  // The ways out: the flag (either spelling, or PET_), a token, loopback.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--status_allow_no_token"},
        std::vector<std::string>{"--status-allow-no-token"}}) {
    auto c = host.config({"--status_port=0", "--status_host=0.0.0.0", args[0], "/bin/true"});
    EXPECT_EQ(c.agent.status.host, "0.0.0.0");
    EXPECT_EQ(c.agent.status.port.value_or(1), 0);
  }
  host.env["PET_STATUS_ALLOW_NO_TOKEN"] = "1";
  EXPECT_EQ(
      host.config({"--status_port=0", "--status_host=0.0.0.0", "/bin/true"}).agent.status.host,
      "0.0.0.0");
  host.env.erase("PET_STATUS_ALLOW_NO_TOKEN");
  host.env["DDP_STORE_TOKEN"] = "s3cret";
  EXPECT_EQ(
      host.config({"--status_port=0", "--status_host=0.0.0.0", "/bin/true"}).agent.status.host,
      "0.0.0.0");
  host.env["DDP_STORE_TOKEN"] = "";  // an empty token is none
  EXPECT_EQ(host.error({"--status_port=0", "--status_host=0.0.0.0", "/bin/true"}),
            "--status_host: '0.0.0.0" + refused);
  host.env.erase("DDP_STORE_TOKEN");
  for (const char* loopback : {"127.0.0.1", "127.0.0.2", "::1", "localhost"}) {
    EXPECT_EQ(
        host.config({"--status_port=0", "--status_host", loopback, "/bin/true"}).agent.status.host,
        loopback);
  }
}

TEST(ParseCommandLine, ABadPetFlagFailsEvenTheHelpButNotTheVersion) {
  FakeHost host;
  host.env["PET_STANDALONE"] = "abc";
  EXPECT_EQ(host.error({"/bin/true"}), "Could not convert: --standalone = abc");
  EXPECT_EQ(host.error({"--help"}), "Could not convert: --standalone = abc");
  auto version = host.parse({"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_TRUE(version.output.starts_with("ddprun ")) << version.output;
  host.env["PET_STANDALONE"] = "0";
  EXPECT_FALSE(host.config({"/bin/true"}).standalone);
  host.env["PET_STANDALONE"] = "true";
  EXPECT_TRUE(host.config({"/bin/true"}).standalone);
}

TEST(ParseCommandLine, TheHelpNamesEveryOptionWithItsDefaultAndVariable) {
  FakeHost host;
  auto help = host.parse({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_FALSE(help.config);
  for (const char* text :
       {"usage: ddprun [options] program [args...]\n", "  --nnodes NNODES=1:1 (Env:PET_NNODES)\n",
        "  --nproc_per_node,--nproc-per-node NPROC_PER_NODE=1 (Env:PET_NPROC_PER_NODE)\n",
        "  --standalone (Env:PET_STANDALONE)\n", "  -m,--module (Env:PET_MODULE)\n",
        "  -r,--redirects REDIRECTS=0 (Env:PET_REDIRECTS)\n",
        "  --rdzv_conf,--rdzv-conf RDZV_CONF (Env:PET_RDZV_CONF)\n",
        "join_timeout, timeout, last_call_timeout, close_timeout, heartbeat_timeout, "
        "keep_alive_interval, read_timeout (seconds), keep_alive_max_attempt, is_host, "
        "store_type; for etcd also protocol, cacert, cert, key, username, password_file; "
        "accepted and ignored (with a warning): rank, etcd_prefix.",
        "Rendezvous backend: static (default; fixed nodes, given ranks), c10d (elastic: --nnodes "
        "MIN:MAX) or etcd (elastic, on an etcd v3 cluster: --rdzv_endpoint lists its client "
        "endpoints).",
        "--exit_barrier_timeout,--exit-barrier-timeout EXIT_BARRIER_TIMEOUT=300 "
        "(Env:PET_EXIT_BARRIER_TIMEOUT)\n",
        "  --stop_grace,--stop-grace STOP_GRACE=30 (Env:PET_STOP_GRACE)\n", "examples:\n"}) {
    EXPECT_NE(help.output.find(text), std::string::npos) << text << "\n" << help.output;
  }
}

TEST(ParseCommandLine, NprocPerNodeCountsWhatTheHostHas) {
  FakeHost host;
  host.cpus = 12;
  EXPECT_EQ(host.config({"--nproc_per_node=cpu", "/bin/true"}).agent.spec.local_world_size, 12);
  EXPECT_EQ(host.config({"--nproc_per_node=auto", "/bin/true"}).agent.spec.local_world_size, 12);
  EXPECT_EQ(host.error({"--nproc_per_node=gpu", "/bin/true"}),
            "--nproc_per_node=gpu: no CUDA device found");
  host.gpu_nodes = 2;
  for (const char* value : {"gpu", "auto"}) {
    const LaunchConfig c = host.config({std::string("--nproc_per_node=") + value, "/bin/true"});
    EXPECT_EQ(c.agent.spec.local_world_size, 2) << value;
    EXPECT_EQ(c.rendezvous.params.local_world_size, 2) << value;
    EXPECT_TRUE(c.agent.set_omp_num_threads) << value;
  }
  // CUDA_VISIBLE_DEVICES, when set, is what the CUDA runtime would see.
  host.env["CUDA_VISIBLE_DEVICES"] = "0,3,5";
  EXPECT_EQ(host.config({"--nproc_per_node=gpu", "/bin/true"}).agent.spec.local_world_size, 3);
  host.env["CUDA_VISIBLE_DEVICES"] = "";
  EXPECT_EQ(host.config({"--nproc_per_node=auto", "/bin/true"}).agent.spec.local_world_size, 12);
  host.env["PET_NPROC_PER_NODE"] = "gpu";
  EXPECT_EQ(host.error({"/bin/true"}),
            "--nproc_per_node (from PET_NPROC_PER_NODE)=gpu: no CUDA device found");
  EXPECT_EQ(host.error({"--nproc_per_node=4097", "/bin/true"}),
            "--nproc_per_node: expected a positive integer (at most 4096), cpu, gpu or auto, got "
            "'4097'");
}

TEST(ParseCommandLine, RdzvConfKeysSetTheirFields) {
  FakeHost host;
  const LaunchConfig c = host.config(
      {"--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1", "--nnodes=1:3",
       "--rdzv_conf=join_timeout=1.5,last_call_timeout=2,close_timeout=0.25,heartbeat_timeout=3,"
       "keep_alive_interval=0.5,keep_alive_max_attempt=7,read_timeout=9,is_host=False",
       "/bin/true"});
  EXPECT_EQ(c.rendezvous.params.join_timeout, 1500ms);
  EXPECT_EQ(c.rendezvous.connect_timeout, 1500ms);
  EXPECT_EQ(c.rendezvous.params.last_call_timeout, 2s);
  EXPECT_EQ(c.agent.announce_timeout, 250ms);
  EXPECT_EQ(c.rendezvous.keep_alive_write_timeout, 3s);
  EXPECT_EQ(c.rendezvous.params.keep_alive_interval, 500ms);
  EXPECT_EQ(c.rendezvous.params.keep_alive_max_attempt, 7);
  EXPECT_EQ(c.rendezvous.read_timeout, 9s);
  EXPECT_FALSE(c.rendezvous.is_host);
  EXPECT_FALSE(c.rendezvous.host_auto);
  EXPECT_EQ(c.rdzv_conf.size(), 8u);
  EXPECT_EQ(c.rdzv_conf.at("is_host"), "False");
  const LaunchConfig host_given = host.config(
      {"--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1", "--rdzv_conf=is_host=1", "/bin/true"});
  EXPECT_TRUE(host_given.rendezvous.is_host);
  EXPECT_FALSE(host_given.rendezvous.host_auto);
  // Static: node rank 0 hosts the store, whatever is_host says.
  const LaunchConfig fixed = host.config({"--rdzv_conf=is_host=false", "/bin/true"});
  EXPECT_TRUE(fixed.rendezvous.is_host);
  EXPECT_FALSE(fixed.rendezvous.host_auto);
  // The last of a repeated key wins.
  EXPECT_EQ(host.config({"--rdzv_conf=join_timeout=1,join_timeout=2", "/bin/true"})
                .rendezvous.params.join_timeout,
            2s);
}

TEST(ParseCommandLine, RdzvConfBadKeysAndValuesNameTheKey) {
  FakeHost host;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"join_timeout", "--rdzv_conf: expected key=value[,key=value...], got 'join_timeout'"},
      {"=3", "--rdzv_conf: expected key=value[,key=value...], got '=3'"},
      {"keepalive=3",
       "--rdzv_conf: unknown key 'keepalive' (known: join_timeout, timeout, last_call_timeout, "
       "close_timeout, heartbeat_timeout, keep_alive_interval, keep_alive_max_attempt, "
       "read_timeout, is_host, store_type; for etcd: protocol, cacert, cert, key, username, "
       "password_file; ignored: rank, etcd_prefix)"},
      {"join_timeout=soon",
       "--rdzv_conf join_timeout: expected a non-negative number of seconds, got 'soon'"},
      {"close_timeout=-1",
       "--rdzv_conf close_timeout: expected a non-negative number of seconds, got '-1'"},
      {"keep_alive_interval=0",
       "--rdzv_conf keep_alive_interval: expected a positive number of seconds, got '0'"},
      {"heartbeat_timeout=0",
       "--rdzv_conf heartbeat_timeout: expected a positive number of seconds, got '0'"},
      {"read_timeout=x",
       "--rdzv_conf read_timeout: expected a non-negative number of seconds, "
       "got 'x'"},
      {"keep_alive_max_attempt=0",
       "--rdzv_conf keep_alive_max_attempt: expected a positive integer, got '0'"},
      {"is_host=maybe", "--rdzv_conf is_host: expected true or false, got 'maybe'"},
      {"username=u", "--rdzv_conf username: only for --rdzv_backend=etcd"},
      // join_timeout is read first, then the keys in name order.
      {"close_timeout=x,join_timeout=y",
       "--rdzv_conf join_timeout: expected a non-negative number of seconds, got 'y'"},
      {"read_timeout=0,close_timeout=x",
       "--rdzv_conf close_timeout: expected a non-negative number of seconds, got 'x'"},
  };
  for (const auto& [conf, message] : cases) {
    EXPECT_EQ(host.error({"--rdzv_conf=" + conf, "/bin/true"}), message) << conf;
  }
  host.env["PET_RDZV_CONF"] = "is_host=2";
  EXPECT_EQ(host.error({"/bin/true"}),
            "--rdzv_conf (from PET_RDZV_CONF) is_host: expected true or false, got '2'");
}

TEST(ParseCommandLine, EtcdKeysReadTheirFilesThroughTheHost) {
  FakeHost host;
  host.readable["/etc/ca.pem"] = "-----BEGIN CERTIFICATE-----\n";
  host.readable["/etc/pw"] = "s3cret\r\nsecond line\n";
  host.readable["/etc/empty"] = "\r\n";
  const std::vector<std::string> etcd = {"--rdzv_backend=etcd",
                                         "--rdzv_endpoint=h1,[::1]:2380,h3:1234", "--nnodes=1:4"};
  auto with = [&](const std::string& conf) {
    std::vector<std::string> args = etcd;
    args.push_back("--rdzv_conf=" + conf);
    args.push_back("/bin/true");
    return args;
  };
  const LaunchConfig c =
      host.config(with("protocol=https,cacert=/etc/ca.pem,username=root,password_file=/etc/pw"));
  EXPECT_TRUE(c.rendezvous.etcd.tls);
  EXPECT_EQ(c.rendezvous.etcd.ca_file, "/etc/ca.pem");
  EXPECT_EQ(c.rendezvous.etcd.username, "root");
  EXPECT_EQ(c.rendezvous.etcd.password, "s3cret");
  EXPECT_EQ(c.rendezvous.etcd.endpoints, "h1:2379,[::1]:2380,h3:1234");
  EXPECT_EQ(c.rendezvous.host, "h1");
  EXPECT_EQ(c.rendezvous.port, 2379);
  EXPECT_FALSE(c.rendezvous.is_host);
  EXPECT_FALSE(c.rendezvous.host_auto);
  EXPECT_EQ(host.error(with("cert=/etc/missing.pem")),
            "--rdzv_conf cert: cannot read '/etc/missing.pem'");
  EXPECT_EQ(host.error(with("password_file=/etc/empty")),
            "--rdzv_conf password_file: '/etc/empty' holds no password on its first line");
  EXPECT_EQ(host.error(with("protocol=ftp")),
            "--rdzv_conf protocol: expected http or https, got 'ftp'");
  EXPECT_EQ(host.error(with("username=")), "--rdzv_conf username: must not be empty");
}

TEST(ParseCommandLine, TheStoreAndRanksFollowTheBackend) {
  FakeHost host;
  const LaunchConfig node0 = host.config({"--nnodes=2", "--master_addr=10.0.0.1", "/bin/true"});
  EXPECT_EQ(node0.rendezvous.host, "10.0.0.1");
  EXPECT_EQ(node0.rendezvous.port, 29500);
  EXPECT_TRUE(node0.rendezvous.is_host);
  EXPECT_EQ(node0.rendezvous.params.node_rank, 0);
  EXPECT_EQ(node0.rendezvous.params.job_signature, "nnodes=2:2 program=true");
  const LaunchConfig node1 =
      host.config({"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "/bin/true"});
  EXPECT_FALSE(node1.rendezvous.is_host);
  // c10d: group ranks follow --node_rank only when it is given.
  const std::vector<std::string> c10d = {"--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.2",
                                         "--nnodes=1:4"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), c10d.begin(), c10d.end());
    extra.push_back("/bin/true");
    return extra;
  };
  const LaunchConfig elastic = host.config(with({}));
  EXPECT_EQ(elastic.rendezvous.params.node_rank, -1);
  EXPECT_TRUE(elastic.rendezvous.host_auto);
  EXPECT_EQ(elastic.rendezvous.port, 29400);
  EXPECT_EQ(host.config(with({"--node_rank=3"})).rendezvous.params.node_rank, 3);
  EXPECT_EQ(host.error(with({"--node_rank=4"})),
            "--node_rank: expected an integer in [0, 4) (0 <= node_rank < nnodes), got '4'");
  // --standalone: c10d on a free loopback port; the run id is the one given
  // (StandaloneKeepsAGivenRdzvId has the fresh one made up without it).
  const LaunchConfig standalone = host.config({"--standalone", "--rdzv_id=mine", "/bin/true"});
  EXPECT_EQ(standalone.rendezvous.backend, "c10d");
  EXPECT_EQ(standalone.rendezvous.host, "127.0.0.1");
  EXPECT_EQ(standalone.rendezvous.port, 0);
  EXPECT_TRUE(standalone.rendezvous.host_auto);
  EXPECT_EQ(standalone.rendezvous.params.run_id, "mine");
  EXPECT_EQ(host.error({"--rdzv_backend=c10d", "/bin/true"}),
            "--rdzv_backend=c10d needs --rdzv_endpoint host[:port]");
}

TEST(ParseCommandLine, TheLocalAddressDefaultsToTheHostName) {
  FakeHost host;
  host.hostname = "gpu-box-12";
  // Another node of static, and any node of c10d whose store is elsewhere.
  EXPECT_EQ(host.config({"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "/bin/true"})
                .rendezvous.params.local_addr,
            "gpu-box-12");
  EXPECT_EQ(host.config({"--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1", "/bin/true"})
                .rendezvous.params.local_addr,
            "gpu-box-12");
  // Static node 0 is reached where the store is; a loopback store means loopback.
  EXPECT_EQ(host.config({"--nnodes=2", "--master_addr=10.0.0.1", "/bin/true"})
                .rendezvous.params.local_addr,
            "10.0.0.1");
  EXPECT_EQ(host.config({"--nnodes=2", "--node_rank=1", "/bin/true"}).rendezvous.params.local_addr,
            "127.0.0.1");
  EXPECT_EQ(host.config({"--standalone", "/bin/true"}).rendezvous.params.local_addr, "127.0.0.1");
  EXPECT_EQ(host.config({"--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1", "--local_addr=10.0.0.9",
                         "/bin/true"})
                .rendezvous.params.local_addr,
            "10.0.0.9");
  EXPECT_EQ(host.config({"/bin/true"}).agent.hostname, "gpu-box-12");
}

TEST(ParseCommandLine, SlurmFillsInWhatIsNotGiven) {
  FakeHost host;
  host.env["SLURM_JOB_ID"] = "4242";
  host.env["SLURM_NNODES"] = "2";
  host.env["SLURM_STEP_ID"] = "0";
  host.env["SLURM_NODEID"] = "1";
  host.env["SLURM_STEP_NODELIST"] = "node[07-08]";
  host.env["SLURM_GPUS_ON_NODE"] = "4";
  const LaunchConfig c = host.config({"/bin/true"});
  EXPECT_EQ(c.rendezvous.params.min_nodes, 2);
  EXPECT_EQ(c.rendezvous.params.max_nodes, 2);
  EXPECT_EQ(c.rendezvous.params.node_rank, 1);
  EXPECT_EQ(c.rendezvous.params.run_id, "4242");
  EXPECT_EQ(c.master_addr, "node07");
  EXPECT_EQ(c.master_port, 24242);
  EXPECT_EQ(c.rendezvous.host, "node07");
  EXPECT_EQ(c.rendezvous.port, 24242);
  EXPECT_EQ(c.agent.spec.local_world_size, 4);
  EXPECT_EQ(c.rendezvous.params.local_addr, "node7");
  const std::map<std::string, std::string> from_slurm = {
      {"nnodes", "SLURM_NNODES"},
      {"node_rank", "SLURM_NODEID"},
      {"rdzv_id", "SLURM_JOB_ID"},
      {"master_addr", "the first host of SLURM_STEP_NODELIST"},
      {"master_port", "20000 + SLURM_JOB_ID mod 10000"},
      {"nproc_per_node", "SLURM_GPUS_ON_NODE"}};
  EXPECT_EQ(c.from_slurm, from_slurm);

  // Flags and PET_<NAME> win; what they give is not read from SLURM.
  host.env["PET_NPROC_PER_NODE"] = "2";
  const LaunchConfig given = host.config({"--node_rank=0", "--master_port=29999", "/bin/true"});
  EXPECT_EQ(given.rendezvous.params.node_rank, 0);
  EXPECT_EQ(given.master_port, 29999);
  EXPECT_EQ(given.agent.spec.local_world_size, 2);
  EXPECT_EQ(given.from_slurm.count("node_rank"), 0u);
  EXPECT_EQ(given.from_slurm.count("nproc_per_node"), 0u);
  EXPECT_EQ(given.rendezvous.params.local_addr, "node07");

  // c10d: the endpoint is SLURM's first host and port; SLURM's node ids
  // order the group ranks.
  const LaunchConfig elastic = host.config({"--rdzv_backend=c10d", "/bin/true"});
  EXPECT_EQ(elastic.rendezvous.host, "node07");
  EXPECT_EQ(elastic.rendezvous.port, 24242);
  EXPECT_EQ(elastic.rendezvous.params.node_rank, 1);
  EXPECT_EQ(elastic.from_slurm.at("rdzv_endpoint"),
            "the first host of SLURM_STEP_NODELIST and 20000 + SLURM_JOB_ID mod 10000");

  // --standalone and --rdzv_endpoint leave SLURM out.
  EXPECT_TRUE(host.config({"--standalone", "/bin/true"}).from_slurm.empty());

  // A bad variable that is used names itself and the flag that overrides it.
  host.env["SLURM_NODEID"] = "first";
  EXPECT_EQ(host.error({"/bin/true"}),
            "SLURM_NODEID: 'first' is not a non-negative integer (this node's index); --node_rank "
            "overrides it");
  EXPECT_TRUE(host.config({"--node_rank=1", "/bin/true"}).from_slurm.count("nnodes"));
  host.env["SLURM_NODEID"] = "2";
  EXPECT_EQ(host.error({"/bin/true"}),
            "--node_rank (from SLURM_NODEID): expected an integer in [0, 2) (0 <= node_rank < "
            "nnodes), got '2'");
}

TEST(ParseCommandLine, SlurmOutsideAStepRefusesSeveralNodes) {
  FakeHost host;
  host.env["SLURM_JOB_ID"] = "77";
  host.env["SLURM_NNODES"] = "2";
  host.env["SLURM_JOB_NODELIST"] = "n[1-2]";
  EXPECT_EQ(host.error({"/bin/true"}),
            "this SLURM job has 2 nodes (SLURM_NNODES=2) but ddprun runs outside a job step "
            "(SLURM_STEP_ID is not set, as in the batch script itself): start one ddprun per node "
            "with srun (`srun --ntasks=$SLURM_JOB_NUM_NODES ddprun ...`), or give --nnodes and "
            "--node_rank");
  const LaunchConfig c = host.config({"--node_rank=1", "/bin/true"});
  EXPECT_EQ(c.rendezvous.params.max_nodes, 2);
  EXPECT_EQ(c.master_addr, "n1");
  EXPECT_EQ(c.master_port, 20077);
  EXPECT_EQ(c.agent.spec.local_world_size, 1) << "neither GPUs nor tasks per node";
}

TEST(ParseCommandLine, PythonProgramsRunOnTheFirstPython3OnPathOrPythonExec) {
  FakeHost host;
  host.files = {"/work/train.py", "/work/script"};
  host.executables.insert("/work/tool");
  host.executables.insert("/opt/bin/tool");
  const LaunchConfig script = host.config({"/work/train.py", "--lr", "${local_rank}"});
  EXPECT_EQ(script.agent.spec.argv,
            (std::vector<std::string>{"/usr/bin/python3", "-u", "/work/train.py", "--lr",
                                      "${local_rank}"}));
  EXPECT_EQ(script.python, "/usr/bin/python3");
  EXPECT_EQ(script.program, "/work/train.py");
  EXPECT_EQ(script.agent.spec.name, "/work/train.py");
  EXPECT_EQ(script.program_args, (std::vector<std::string>{"--lr", "${local_rank}"}));
  EXPECT_EQ(host.config({"-m", "pkg.mod", "x"}).agent.spec.argv,
            (std::vector<std::string>{"/usr/bin/python3", "-u", "-m", "pkg.mod", "x"}));
  // A file that is not executable is a Python script, as torchrun runs it.
  EXPECT_EQ(host.config({"/work/script"}).agent.spec.argv,
            (std::vector<std::string>{"/usr/bin/python3", "-u", "/work/script"}));
  // Anything executable runs directly, found on PATH when it has no '/'.
  const LaunchConfig tool = host.config({"/work/tool", "a"});
  EXPECT_EQ(tool.agent.spec.argv, (std::vector<std::string>{"/work/tool", "a"}));
  EXPECT_TRUE(tool.python.empty());
  host.env["PATH"] = "/opt/bin:/usr/bin";
  EXPECT_EQ(host.config({"tool"}).agent.spec.argv, (std::vector<std::string>{"/opt/bin/tool"}));
  // PYTHON_EXEC names the Python.
  host.executables.insert("/opt/py/bin/python");
  host.env["PYTHON_EXEC"] = "/opt/py/bin/python";
  EXPECT_EQ(host.config({"/work/train.py"}).python, "/opt/py/bin/python");
  host.env["PYTHON_EXEC"] = "/nonexistent/python";
  EXPECT_EQ(host.error({"/work/train.py"}),
            "cannot run the Python program '/work/train.py': '/nonexistent/python' not found on "
            "PATH (set PYTHON_EXEC or use --no_python)");
  host.env.erase("PYTHON_EXEC");
  host.env["PATH"] = "/opt/bin";
  EXPECT_EQ(host.error({"-m", "pkg"}),
            "cannot run the Python program 'pkg': 'python3' not found on PATH (set PYTHON_EXEC "
            "or use --no_python)");
  EXPECT_EQ(host.error({"missing.py"}), "program 'missing.py' not found");
  EXPECT_EQ(host.error({"--no_python", "/work/script"}),
            "program '/work/script' not found or not executable");
  EXPECT_EQ(host.error({"--no_python", "nothing"}),
            "program 'nothing' not found or not executable (searched the current directory and "
            "PATH)");
}

TEST(ParseCommandLine, TheAgentsOptionsComeFromTheirFlags) {
  FakeHost host;
  host.env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "<${rank}> ";
  const LaunchConfig c = host.config(
      {"--nproc_per_node=4", "--role=trainer", "--max_restarts=2", "-r", "1", "--tee=0:2,3:3",
       "--local_ranks_filter=0,3", "--signals_to_handle=SIGUSR1, usr2,SIGINT",
       "--exit_barrier_timeout=12.5", "--stop_grace=0", "--log_dir=/tmp/logs", "/bin/true"});
  EXPECT_EQ(c.agent.spec.role, "trainer");
  EXPECT_EQ(c.agent.spec.max_restarts, 2);
  EXPECT_EQ(c.agent.spec.redirects.all, agent::Std::kOut);
  EXPECT_EQ(c.agent.spec.tee.of(0), agent::Std::kErr);
  EXPECT_EQ(c.agent.spec.tee.of(1), agent::Std::kNone);
  EXPECT_EQ(c.agent.spec.tee.of(3), agent::Std::kAll);
  EXPECT_EQ(c.agent.spec.console_ranks, (std::set<int>{0, 3}));
  EXPECT_EQ(c.signals, (std::vector<int>{SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}));
  EXPECT_EQ(c.agent.exit_barrier_timeout, 12500ms);
  EXPECT_EQ(c.agent.stop_grace, 0ms);
  EXPECT_EQ(c.agent.spec.line_prefix_template, "<${rank}> ");
  EXPECT_TRUE(c.agent.set_omp_num_threads);
  EXPECT_TRUE(c.agent.python_module_dir.empty()) << "this host has none";
  EXPECT_EQ(c.log_dir, "/tmp/logs");
  EXPECT_EQ(c.agent.spec.argv, (std::vector<std::string>{"/bin/true"}));
  EXPECT_TRUE(c.agent.run_log_dir.empty()) << "ddprun fills it when it runs";
  EXPECT_TRUE(c.agent.base_env.empty()) << "ddprun fills it when it runs";
  EXPECT_EQ(host.error({"--nproc_per_node=2", "--tee=3:1", "/bin/true"}),
            "-t/--tee: local rank 3 does not exist (--nproc_per_node=2)");
}

TEST(ParseCommandLine, TheHostsPythonModuleDirReachesTheAgent) {
  FakeHost host;
  host.python_module_dir = "/opt/ddp/lib/ddprun/python";
  EXPECT_EQ(host.config({"--nproc_per_node=2", "/bin/true"}).agent.python_module_dir,
            "/opt/ddp/lib/ddprun/python");
}

TEST(ParseCommandLine, TorchrunsRdzvConfKeysKeepTheirMeaning) {
  FakeHost host;
  // torchrun's static and etcd rendezvous call the join timeout `timeout`.
  const LaunchConfig timeout = host.config({"--rdzv_conf=timeout=42", "/bin/true"});
  EXPECT_EQ(timeout.rendezvous.params.join_timeout, 42s);
  EXPECT_EQ(timeout.rendezvous.connect_timeout, 42s);
  EXPECT_TRUE(timeout.warnings.empty());
  EXPECT_EQ(host.config({"--rdzv_backend=etcd", "--rdzv_endpoint=e1", "--rdzv_conf=timeout=7",
                         "/bin/true"})
                .rendezvous.params.join_timeout,
            7s);
  EXPECT_EQ(host.error({"--rdzv_conf=timeout=1,join_timeout=2", "/bin/true"}),
            "--rdzv_conf: timeout (torchrun's static and etcd name) and join_timeout are the "
            "same key: give one");
  // c10d's store_type: tcp is what ddprun's store is; file is refused.
  const std::vector<std::string> c10d = {"--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1"};
  auto with = [&](const std::string& conf) {
    std::vector<std::string> args = c10d;
    args.push_back("--rdzv_conf=" + conf);
    args.push_back("/bin/true");
    return args;
  };
  EXPECT_TRUE(host.config(with("store_type=tcp")).warnings.empty());
  EXPECT_TRUE(host.config(with("store_type= TCP")).warnings.empty()) << "torch strips and lowers";
  EXPECT_EQ(host.error(with("store_type=file")),
            "--rdzv_conf store_type=file: ddprun's rendezvous runs on its TCP store only "
            "(torchrun's FileStore is not supported); leave it out or give tcp");
  EXPECT_EQ(host.error(with("store_type=redis")),
            "--rdzv_conf store_type: expected tcp, got 'redis'");
  // Keys torchrun sets itself or that have no meaning here: a warning each.
  EXPECT_EQ(host.config({"--rdzv_conf=rank=1", "/bin/true"}).warnings,
            (std::vector<std::string>{
                "--rdzv_conf rank is ignored: --node_rank gives the node's rank (torchrun "
                "overrides it with --node_rank too)"}));
  EXPECT_EQ(host.config({"--rdzv_backend=etcd", "--rdzv_endpoint=e1",
                         "--rdzv_conf=etcd_prefix=/torchelastic/p2p", "/bin/true"})
                .warnings,
            (std::vector<std::string>{
                "--rdzv_conf etcd_prefix is ignored: ddprun keeps a job's keys under "
                "rdzv/<run_id>/ in etcd (its v3 layout is not torchrun's)"}));
}

TEST(ParseCommandLine, StandaloneKeepsAGivenRdzvId) {
  FakeHost host;
  EXPECT_EQ(host.config({"--standalone", "--rdzv_id=job9", "/bin/true"}).rendezvous.params.run_id,
            "job9");
  host.env["PET_RDZV_ID"] = "job10";
  EXPECT_EQ(host.config({"--standalone", "/bin/true"}).rendezvous.params.run_id, "job10");
  host.env.erase("PET_RDZV_ID");
  const std::string made_up = host.config({"--standalone", "/bin/true"}).rendezvous.params.run_id;
  EXPECT_NE(made_up, "none");
  EXPECT_NE(made_up, host.config({"--standalone", "/bin/true"}).rendezvous.params.run_id);
}

TEST(ParseCommandLine, AnExecutableFileRunsDirectlyWhereverItIsNamed) {
  FakeHost host;
  host.executables.insert("./train_cpp");
  host.executables.insert("/usr/bin/tool");
  host.files = {"script"};
  // A bare name: the file in the current directory, as torchrun takes its program.
  const LaunchConfig cpp = host.config({"train_cpp", "--out", "x"});
  EXPECT_EQ(cpp.agent.spec.argv, (std::vector<std::string>{"./train_cpp", "--out", "x"}));
  EXPECT_TRUE(cpp.python.empty());
  EXPECT_FALSE(cpp.python_guessed);
  EXPECT_EQ(cpp.agent.spec.name, "train_cpp");
  // Not in the current directory: on PATH.
  EXPECT_EQ(host.config({"tool"}).agent.spec.argv, (std::vector<std::string>{"/usr/bin/tool"}));
  // --no_python: PATH first, as exec does, then the current directory.
  EXPECT_EQ(host.config({"--no_python", "train_cpp"}).agent.spec.argv,
            (std::vector<std::string>{"./train_cpp"}));
  host.executables.insert("/usr/bin/train_cpp");
  EXPECT_EQ(host.config({"--no_python", "train_cpp"}).agent.spec.argv,
            (std::vector<std::string>{"/usr/bin/train_cpp"}));
  EXPECT_EQ(host.config({"train_cpp"}).agent.spec.argv, (std::vector<std::string>{"./train_cpp"}));
  // Neither executable nor *.py: Python, and the config says it was a guess.
  const LaunchConfig script = host.config({"script"});
  EXPECT_EQ(script.agent.spec.argv, (std::vector<std::string>{"/usr/bin/python3", "-u", "script"}));
  EXPECT_TRUE(script.python_guessed);
  host.files.insert("/work/train.py");
  EXPECT_FALSE(host.config({"/work/train.py"}).python_guessed);
}

// ------------------------------------------- torchrun's flags newer than 1.13

bool has_warning(const LaunchConfig& c, const std::string& start) {
  for (const auto& warning : c.warnings) {
    if (warning.starts_with(start)) return true;
  }
  return false;
}

TEST(ParseCommandLine, ShutdownTimeoutIsTorchsNameForTheStopGrace) {
  FakeHost host;
  EXPECT_EQ(host.config({"--shutdown-timeout=2", "/bin/true"}).agent.stop_grace, 2s);
  EXPECT_EQ(
      host.config({"--shutdown_timeout=0.5", "--stop_grace=0.5", "/bin/true"}).agent.stop_grace,
      500ms);
  EXPECT_EQ(host.error({"--shutdown_timeout=2", "--stop_grace=3", "/bin/true"}),
            "--shutdown_timeout=2 and --stop_grace=3 disagree: both are the seconds between "
            "SIGTERM and SIGKILL (give one)");
  EXPECT_EQ(host.error({"--shutdown-timeout=-1", "/bin/true"}),
            "--shutdown_timeout: expected a non-negative number of seconds, got '-1'");
  // torch's variable, when neither flag (nor its PET_ form) is given.
  host.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "7";
  EXPECT_EQ(host.config({"/bin/true"}).agent.stop_grace, 7s);
  EXPECT_EQ(host.config({"--stop_grace=3", "/bin/true"}).agent.stop_grace, 3s);
  host.env["PET_SHUTDOWN_TIMEOUT"] = "4";
  EXPECT_EQ(host.config({"/bin/true"}).agent.stop_grace, 4s);
  host.env["PET_SHUTDOWN_TIMEOUT"] = "";  // "" counts as unset: the variable again
  host.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "soon";
  const auto parsed = host.parse({"/bin/true"});
  EXPECT_EQ(parsed.exit_code, 2);
  EXPECT_NE(parsed.output.find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT: expected a non-negative number "
                               "of seconds, got 'soon'"),
            std::string::npos)
      << parsed.output;
}

TEST(ParseCommandLine, VirtualLocalRankNeedsADeviceForEveryRank) {
  FakeHost host;
  EXPECT_FALSE(host.config({"/bin/true"}).agent.spec.virtual_local_rank);
  EXPECT_TRUE(host.config({"--virtual-local-rank", "--nproc_per_node=4", "/bin/true"})
                  .agent.spec.virtual_local_rank);
  host.env["CUDA_VISIBLE_DEVICES"] = "2,5";
  EXPECT_TRUE(host.config({"--virtual_local_rank", "--nproc_per_node=2", "/bin/true"})
                  .agent.spec.virtual_local_rank);
  EXPECT_EQ(host.error({"--virtual_local_rank", "--nproc_per_node=3", "/bin/true"}),
            "--virtual_local_rank: --nproc_per_node=3 but CUDA_VISIBLE_DEVICES='2,5' names 2 "
            "device(s): local rank 2 would have none");
  host.env["PET_VIRTUAL_LOCAL_RANK"] = "1";
  EXPECT_TRUE(host.config({"--nproc_per_node=2", "/bin/true"}).agent.spec.virtual_local_rank);
}

TEST(ParseCommandLine, DuplicateFiltersAreTorchsCommaList) {
  FakeHost host;
  const LaunchConfig c =
      host.config({"-t", "3", "--duplicate-stdout-filters=loss,,acc,epoch", "/bin/true"});
  EXPECT_EQ(c.agent.spec.duplicate_stdout_filters, (std::vector<std::string>{"loss,acc", "epoch"}));
  EXPECT_TRUE(c.agent.spec.duplicate_stderr_filters.empty());
  EXPECT_FALSE(has_warning(c, "--duplicate_stdout_filters"));
  host.env["PET_DUPLICATE_STDERR_FILTERS"] = "Traceback";
  const LaunchConfig err = host.config({"-t", "0:1", "/bin/true"});
  EXPECT_EQ(err.agent.spec.duplicate_stderr_filters, (std::vector<std::string>{"Traceback"}));
  // torch copies the lines of tee'd streams only: without -t, ddprun says so.
  EXPECT_TRUE(has_warning(err, "--duplicate_stderr_filters copies lines of tee'd streams only"));
  EXPECT_EQ(host.error({"--duplicate_stdout_filters=a,", "/bin/true"}),
            "--duplicate_stdout_filters: an empty filter in 'a,' would copy every line (',,' is "
            "a comma in a filter)");
}

TEST(ParseCommandLine, EventLogHandlerLogsSpecsAndMonitorInterval) {
  FakeHost host;
  const LaunchConfig c = host.config({"/bin/true"});
  EXPECT_EQ(c.event_log_handler, "null");
  EXPECT_DOUBLE_EQ(c.monitor_interval, 0.1);  // torch 2.x's default (1.13's was 5)
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_FALSE(
      has_warning(host.config({"--event_log_handler=dynamic_rendezvous", "/bin/true"}), "--event"));
  EXPECT_TRUE(has_warning(host.config({"--event-log-handler=console", "/bin/true"}),
                          "--event_log_handler=console: ddprun writes no torchelastic event"));
  EXPECT_EQ(host.error({"--event_log_handler=scuba", "/bin/true"}),
            "--event_log_handler: expected null, console or dynamic_rendezvous (torchrun's "
            "registered handlers), got 'scuba'");
  EXPECT_TRUE(host.error({"--logs-specs=mine", "/bin/true"})
                  .starts_with("--logs_specs='mine': torchrun's LogsSpecs plug-ins are Python "
                               "entry points (torchrun.logs_specs) and ddprun loads no Python; "
                               "its log layout is set by --log_dir, -r/--redirects"));
}

TEST(ParseCommandLine, OmpNumThreadsWarningAsTorchrunPrintsIt) {
  FakeHost host;
  EXPECT_TRUE(has_warning(host.config({"--nproc_per_node=2", "/bin/true"}),
                          "setting OMP_NUM_THREADS=1 for each worker"));
  EXPECT_FALSE(has_warning(host.config({"--nproc_per_node=1", "/bin/true"}), "setting OMP"));
  host.env["OMP_NUM_THREADS"] = "4";
  EXPECT_FALSE(has_warning(host.config({"--nproc_per_node=2", "/bin/true"}), "setting OMP"));
}

TEST(ParseCommandLine, NumaBindingPlansFromTheHostsSysfs) {
  test::TempDir sys("ddp-numa");
  for (int node = 0; node < 2; ++node) {
    const auto dir = sys.path() / "devices/system/node" / ("node" + std::to_string(node));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "cpulist") << (node == 0 ? "0-1" : "2-3") << "\n";
  }
  FakeHost host;
  EXPECT_EQ(host.error({"--numa_binding=node", "/bin/true"}),
            "--numa_binding=node: no NUMA node found in /nonexistent-sysfs/devices/system/node "
            "(node<N>/cpulist)");
  host.sysfs_root = sys.str();
  const LaunchConfig c = host.config({"--numa-binding=node", "--nproc_per_node=2", "/bin/true"});
  EXPECT_EQ(c.numa_binding, "node");
  EXPECT_EQ(c.agent.spec.cpu_affinity, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_TRUE(host.config({"/bin/true"}).agent.spec.cpu_affinity.empty());
  EXPECT_EQ(host.error({"--numa_binding=core_complex", "/bin/true"}),
            "--numa_binding: expected node, socket, exclusive or core-complex, got "
            "'core_complex'");
  EXPECT_EQ(host.error({"--numa_binding=exclusive", "--nproc_per_node=6", "/bin/true"}),
            "--numa_binding=exclusive: NUMA node 0 has 2 physical cores for 3 ranks");
}

}  // namespace
}  // namespace ddp::launcher
