// --rdzv_backend=etcd with real ddprun agents on this host against real etcd
// members on loopback (tests/support/etcd_cluster.h): the node that serves the
// workers' store dies together with an etcd member, a frozen node's lease
// expires and it rejoins on SIGCONT, and bad endpoints fail clearly. Workers
// are ddprun_test_worker's "elastic" mode (<dir>/ws<WORLD_SIZE>_r<RANK>_<pid>,
// <dir>/store_r<RANK>_<pid> with the workers' store, until <dir>/finish
// exists). Generous timeouts: a loaded 2-core machine.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ddp/store_etcd/etcd_store.h"
#include "etcd_cluster.h"
#include "net_util.h"
#include "process_util.h"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;

std::string ddprun() { return bin_dir() + "/ddprun"; }
std::string worker() { return bin_dir() + "/ddprun_test_worker"; }

// The parent pid of `pid` (from /proc), or -1.
pid_t parent_of(pid_t pid) {
  const auto stat = proc_stat(pid);
  return stat ? stat->ppid : -1;
}

struct WorkerRecord {
  int world = 0;
  int rank = 0;
  pid_t pid = -1;
  std::string store;  // "<addr>:<port> <prefix>"
};

class EtcdJobTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const auto& agent : agents_) {
      ::kill(agent.pid, SIGCONT);
      kill_if_alive(agent.pid);
    }
  }

  static constexpr const char* kConf =
      "keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=1,join_timeout=60";

  Child& start_agent(const std::string& endpoints, const std::string& nnodes,
                     std::vector<std::string> extra = {}) {
    std::vector<std::string> argv{ddprun(),
                                  "--nnodes=" + nnodes,
                                  "--nproc_per_node=1",
                                  "--rdzv_backend=etcd",
                                  "--rdzv_endpoint=" + endpoints,
                                  "--rdzv_id=etcdjob",
                                  "--no_python",
                                  std::string("--rdzv_conf=") + kConf};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), {worker(), "elastic", dir_.str()});
    agents_.push_back(
        spawn(argv, base_env(), dir_.path(), "agent" + std::to_string(agents_.size())));
    return agents_.back();
  }

  std::vector<WorkerRecord> workers() const {
    std::vector<WorkerRecord> list;
    for (const auto& entry : fs::directory_iterator(dir_.path())) {
      const std::string name = entry.path().filename().string();
      if (entry.path().extension() == ".tmp") continue;  // being written
      WorkerRecord w;
      if (std::sscanf(name.c_str(), "ws%d_r%d_%d", &w.world, &w.rank, &w.pid) != 3) continue;
      w.store = read_text(dir_.path() /
                          ("store_r" + std::to_string(w.rank) + "_" + std::to_string(w.pid)));
      list.push_back(w);
    }
    return list;
  }

  // Workers with WORLD_SIZE `world` that are not in `before` (pids).
  int workers_with_world(int world, const std::set<pid_t>& before = {}) const {
    int n = 0;
    for (const auto& w : workers()) n += w.world == world && before.count(w.pid) == 0;
    return n;
  }

  bool wait_workers(int world, int count, const std::set<pid_t>& before = {},
                    std::chrono::milliseconds timeout = 60s) {
    return eventually([&] { return workers_with_world(world, before) >= count; }, timeout);
  }

  std::set<pid_t> worker_pids() const {
    std::set<pid_t> pids;
    for (const auto& w : workers()) pids.insert(w.pid);
    return pids;
  }

  void finish() { std::ofstream(dir_.path() / "finish") << "done\n"; }

  std::string all_stderr() const { return stderr_of(agents_); }

  TempDir dir_;
  std::deque<Child> agents_;
};

TEST_F(EtcdJobTest, LosingTheNodeThatServesTheWorkersStoreAndAnEtcdMemberMovesTheStore) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(3);
  Child& node0 = start_agent(etcd.endpoints(), "2:3", {"--node_rank=0"});
  Child& node1 = start_agent(etcd.endpoints(), "2:3", {"--node_rank=1"});
  Child& node2 = start_agent(etcd.endpoints(), "2:3", {"--node_rank=2"});
  ASSERT_TRUE(wait_workers(3, 3)) << all_stderr();
  std::string first_store;
  for (const auto& w : workers()) {
    if (w.world != 3) continue;
    if (first_store.empty()) first_store = w.store;
    EXPECT_EQ(w.store, first_store) << "one store and prefix for the round";
  }
  const auto before = worker_pids();
  // Node 0 is group rank 0 (--node_rank): its agent serves the workers' store.
  // It dies with the etcd member the agents may be talking to.
  ::kill(node0.pid, SIGKILL);
  EXPECT_EQ(wait_child(node0.pid), 128 + SIGKILL);
  etcd.kill(0);
  ASSERT_TRUE(wait_workers(2, 2, before)) << "the survivors did not re-form\n" << all_stderr();
  const std::string first_addr = first_store.substr(0, first_store.find(' '));
  for (const auto& w : workers()) {
    if (before.count(w.pid) != 0) continue;
    EXPECT_NE(w.store.substr(0, w.store.find(' ')), first_addr)
        << "the workers' store did not move to the new group rank 0";
    EXPECT_NE(w.store.substr(w.store.find(' ')), first_store.substr(first_store.find(' ')))
        << "a new round, a new prefix";
  }
  finish();
  EXPECT_EQ(wait_child(node1.pid, 60s), 0) << all_stderr();
  EXPECT_EQ(wait_child(node2.pid, 60s), 0) << all_stderr();
  const std::string log = read_text(node1.err) + read_text(node2.err);
  EXPECT_NE(log.find("node 0 (member "), std::string::npos) << log;
  EXPECT_NE(log.find("was lost"), std::string::npos) << log;
  // The last agent to leave deleted the job's keys.
  EtcdStoreOptions options;
  options.endpoints = {etcd.client_endpoints()[1]};
  options.prefix = "ddp/rdzv/etcdjob/";
  options.connect_timeout = 10s;
  EXPECT_EQ(EtcdStore(options).num_keys(), 0);
}

TEST_F(EtcdJobTest, AFrozenNodeIsLostWhenItsLeaseExpiresAndRejoinsAsANewMemberOnSigcont) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdCluster etcd;
  start_agent(etcd.endpoints(), "2:3");
  start_agent(etcd.endpoints(), "2:3");
  Child& frozen = start_agent(etcd.endpoints(), "2:3");
  ASSERT_TRUE(wait_workers(3, 3)) << all_stderr();
  pid_t stale = -1;  // the frozen agent's worker
  for (const auto& w : workers()) {
    if (parent_of(w.pid) == frozen.pid) stale = w.pid;
  }
  ASSERT_GT(stale, 0) << "no worker of the third agent found";
  const auto before = worker_pids();
  ::kill(frozen.pid, SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_workers(2, 2, before, 30s)) << "the others did not re-form\n" << all_stderr();
  // A lease of 1 s (etcd makes it its minimum, about 2 s) and etcd's expiry checks.
  EXPECT_LT(std::chrono::steady_clock::now() - stopped, 15s);
  ::kill(frozen.pid, SIGCONT);
  ASSERT_TRUE(wait_workers(3, 3, before))
      << "the woken node did not rejoin (3 workers of a new round)\n"
      << all_stderr();
  EXPECT_TRUE(eventually([&] { return process_dead(stale); }, 10s))
      << "the frozen node's stale worker still runs";
  const std::string err = read_text(frozen.err);
  EXPECT_NE(err.find("was lost"), std::string::npos) << err;
  finish();
  for (const auto& agent : agents_) EXPECT_EQ(wait_child(agent.pid, 60s), 0) << all_stderr();
}

TEST_F(EtcdJobTest, UnreachableOrWrongEndpointsFailWithinTheTimeoutNamingThem) {
  DDP_SKIP_WITHOUT_ETCD();
  auto attempt = [&](const std::string& endpoints) {
    const auto start = std::chrono::steady_clock::now();
    auto result =
        run({ddprun(), "--nnodes=1:2", "--rdzv_backend=etcd", "--rdzv_endpoint=" + endpoints,
             "--rdzv_conf=read_timeout=2", "--no_python", worker(), "env", dir_.str()},
            base_env(), dir_.path(), 60s);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 20s) << endpoints;
    EXPECT_EQ(result.code, 1) << result.err;
    EXPECT_NE(result.err.find(endpoints), std::string::npos) << "the error names the endpoint\n"
                                                             << result.err;
    return result.err;
  };
  // Nothing listens there.
  const std::string nobody = "127.0.0.1:" + std::to_string(free_port());
  EXPECT_NE(attempt(nobody).find("no etcd endpoint answered"), std::string::npos);
  // An etcd that was stopped.
  {
    EtcdCluster etcd;
    const std::string endpoint = etcd.endpoints();
    etcd.stop(0);
    EXPECT_NE(attempt(endpoint).find("no etcd endpoint answered"), std::string::npos);
  }
  // An etcd that does not serve the v3 gateway.
  {
    EtcdCluster::Options options;
    options.grpc_gateway = false;
    EtcdCluster etcd(options);
    EXPECT_NE(attempt(etcd.endpoints()).find("is not an etcd v3 HTTP gateway"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(dir_.path() / "env_0_0.json")) << "a worker started";
}

// ---------------------------------------------------------------------------
// What a job leaves in etcd, and user authentication, seen with etcdctl.

bool have_etcdctl() { return std::system("command -v etcdctl >/dev/null 2>&1") == 0; }

struct Shell {
  int code = -1;
  std::string out;  // stdout and stderr
};

// etcdctl (API v3) against every member of `etcd`, with `args`.
Shell etcdctl(const EtcdCluster& etcd, const std::string& args) {
  const std::string command =
      "ETCDCTL_API=3 etcdctl --endpoints=" + etcd.urls() + " " + args + " 2>&1";
  Shell shell;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return shell;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;)
    shell.out.append(buffer, n);
  const int status = ::pclose(pipe);
  shell.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return shell;
}

struct Lease {
  std::string id;
  long granted = -1;    // TTL(..s)
  long remaining = -1;  // remaining(..s)
  std::string text;     // etcdctl's line
};

// Every key in etcd and every lease (with its TTL), and etcdctl's text.
struct EtcdContents {
  std::vector<std::string> keys;
  std::vector<Lease> leases;
  std::string text;
};

EtcdContents etcd_contents(const EtcdCluster& etcd, const std::string& auth = "") {
  EtcdContents contents;
  const Shell keys = etcdctl(etcd, auth + " get '' --prefix --keys-only");
  EXPECT_EQ(keys.code, 0) << keys.out;
  for (const auto& line : lines_of(keys.out)) {
    if (!line.empty()) contents.keys.push_back(line);
  }
  const Shell list = etcdctl(etcd, auth + " lease list");
  EXPECT_EQ(list.code, 0) << list.out;
  contents.text = "keys:\n";
  for (const auto& key : contents.keys) contents.text += key + "\n";
  contents.text += "leases:\n" + list.out;
  for (const auto& line : lines_of(list.out)) {
    if (line.empty() || line.rfind("found ", 0) == 0) continue;
    Lease lease;
    lease.id = line;
    const Shell ttl = etcdctl(etcd, auth + " lease timetolive " + line + " --keys");
    lease.text = ttl.out;
    std::sscanf(ttl.out.c_str(), "lease %*s granted with TTL(%lds), remaining(%lds)",
                &lease.granted, &lease.remaining);
    contents.text += ttl.out;
    contents.leases.push_back(lease);
  }
  return contents;
}

// A 2-node job that succeeds leaves no key and no lease in etcd. (Before:
// each node left its client marker __ddp_clients/<id> behind, on a lease of
// 2 x read_timeout + 60 s = 180 s.)
TEST_F(EtcdJobTest, AJobThatSucceededLeavesNoKeyAndNoLeaseInEtcd) {
  DDP_SKIP_WITHOUT_ETCD();
  if (!have_etcdctl()) GTEST_SKIP() << "etcdctl is not installed";
  EtcdCluster etcd;
  finish();  // the workers announce themselves and exit at once
  Child& a = start_agent(etcd.endpoints(), "2");
  Child& b = start_agent(etcd.endpoints(), "2");
  EXPECT_EQ(wait_child(a.pid, 90s), 0) << all_stderr();
  EXPECT_EQ(wait_child(b.pid, 90s), 0) << all_stderr();
  EXPECT_EQ(workers_with_world(2), 2) << all_stderr();
  const EtcdContents left = etcd_contents(etcd);
  EXPECT_TRUE(left.keys.empty()) << left.text;
  EXPECT_TRUE(left.leases.empty()) << left.text;
}

// Both nodes of a running job are SIGKILLed (their workers die with them);
// the same job (run id, program) run again forms once the dead nodes' leases
// expire, finishes, and leaves nothing of the job in etcd: only the killed
// clients' markers, on leases that expire by themselves. (Before: the rerun
// waited as spares behind the dead round forever.)
TEST_F(EtcdJobTest, ARerunOfAJobWhoseNodesWereAllKilledFormsAndLeavesOnlyExpiringLeases) {
  DDP_SKIP_WITHOUT_ETCD();
  if (!have_etcdctl()) GTEST_SKIP() << "etcdctl is not installed";
  EtcdCluster etcd;
  Child& a = start_agent(etcd.endpoints(), "2");
  Child& b = start_agent(etcd.endpoints(), "2");
  ASSERT_TRUE(wait_workers(2, 2)) << all_stderr();
  const auto first = worker_pids();
  ::kill(a.pid, SIGKILL);
  ::kill(b.pid, SIGKILL);
  EXPECT_EQ(wait_child(a.pid), 128 + SIGKILL);
  EXPECT_EQ(wait_child(b.pid), 128 + SIGKILL);
  for (pid_t pid : first) {
    EXPECT_TRUE(eventually([&] { return process_dead(pid); }, 30s))
        << "worker " << pid << " outlived its agent";
  }
  const EtcdContents crashed = etcd_contents(etcd);
  std::printf("[ crashed  ] %zu keys, %zu leases:\n%s", crashed.keys.size(), crashed.leases.size(),
              crashed.text.c_str());
  EXPECT_NE(crashed.text.find("ddp/rdzv/etcdjob/"), std::string::npos)
      << "the crashed job left none of its keys: the rerun tests nothing\n"
      << crashed.text;

  finish();  // the rerun's workers exit at once
  const auto rerun = std::chrono::steady_clock::now();
  Child& c = start_agent(etcd.endpoints(), "2");
  Child& d = start_agent(etcd.endpoints(), "2");
  const auto deadline = rerun + 120s;
  auto left_ms = [&] {
    return std::max(1000ms, std::chrono::duration_cast<std::chrono::milliseconds>(
                                deadline - std::chrono::steady_clock::now()));
  };
  EXPECT_EQ(wait_child(c.pid, left_ms()), 0) << all_stderr();
  EXPECT_EQ(wait_child(d.pid, left_ms()), 0) << all_stderr();
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - rerun).count();
  std::printf("[ timing   ] the rerun finished %.1f s after it started\n", took);
  EXPECT_LT(took, 90.0);
  EXPECT_EQ(workers_with_world(2, first), 2) << "the rerun's round did not form\n" << all_stderr();

  const EtcdContents left = etcd_contents(etcd);
  std::printf("[ left     ] %zu keys, %zu leases:\n%s", left.keys.size(), left.leases.size(),
              left.text.c_str());
  for (const auto& key : left.keys) {
    EXPECT_EQ(key.rfind("__ddp_clients/", 0), 0u) << "a key that is no killed client's marker\n"
                                                  << left.text;
  }
  for (const auto& lease : left.leases) {
    // A killed client's marker lease: granted 2 x read_timeout + 60 s, counting down.
    EXPECT_GT(lease.granted, 0) << lease.text;
    EXPECT_LE(lease.granted, 200) << lease.text;
    EXPECT_GE(lease.remaining, 0) << lease.text;
    EXPECT_LE(lease.remaining, lease.granted) << lease.text;
    EXPECT_NE(lease.text.find("__ddp_clients/"), std::string::npos) << lease.text;
  }
  // Every key that is left is on one of those leases.
  std::string attached;
  for (const auto& lease : left.leases) attached += lease.text;
  for (const auto& key : left.keys)
    EXPECT_NE(attached.find(key), std::string::npos) << key << "\n" << left.text;
}

// etcd with user authentication; the password file ends its line with
// "\r\n" (written on Windows): the "\r" is not part of the password (before:
// AuthError). Over plain http, ddprun warns that the password crosses the
// network in clear text.
TEST_F(EtcdJobTest, APasswordFileWithACrlfLineEndingAuthenticatesAndPlainHttpIsWarnedAbout) {
  DDP_SKIP_WITHOUT_ETCD();
  if (!have_etcdctl()) GTEST_SKIP() << "etcdctl is not installed";
  EtcdCluster etcd;
  ASSERT_EQ(etcdctl(etcd, "user add root:s3cret").code, 0);
  ASSERT_EQ(etcdctl(etcd, "auth enable").code, 0);
  const fs::path password = dir_.path() / "password";
  auto attempt = [&](const std::string& content) {
    std::ofstream(password, std::ios::binary | std::ios::trunc) << content;
    return run({ddprun(), "--nnodes=1:2", "--nproc_per_node=1", "--rdzv_backend=etcd",
                "--rdzv_endpoint=" + etcd.endpoints(), "--rdzv_id=auth",
                "--rdzv_conf=username=root,password_file=" + password.string() +
                    ",last_call_timeout=1,read_timeout=10",
                "--no_python", worker(), "env", dir_.str()},
               base_env(), dir_.path(), 90s);
  };
  const RunResult ok = attempt("s3cret\r\n");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.err.find("etcd user 'root' authenticates over plain http: its password crosses the "
                        "network to "),
            std::string::npos)
      << ok.err;
  EXPECT_NE(ok.err.find("in clear text"), std::string::npos) << ok.err;
  const fs::path env = dir_.path() / "env_0_0.json";
  ASSERT_TRUE(fs::exists(env)) << "no worker ran\n" << ok.err;
  EXPECT_NE(read_text(env).find("\"WORLD_SIZE\": \"1\""), std::string::npos) << read_text(env);
  const EtcdContents left = etcd_contents(etcd, "--user=root:s3cret");
  EXPECT_TRUE(left.keys.empty()) << left.text;
  EXPECT_TRUE(left.leases.empty()) << left.text;
  // The file is what authenticates: another password in it is refused.
  fs::remove(env);
  const RunResult refused = attempt("wrong\r\n");
  EXPECT_EQ(refused.code, 1) << refused.err;
  EXPECT_FALSE(fs::exists(env)) << "a worker ran with a wrong password";
}

// An empty password file (or one whose first line is only "\r") is a
// one-line usage error naming the flag, before any etcd is contacted.
TEST_F(EtcdJobTest, AnEmptyPasswordFileIsAOneLineErrorNamingTheFlag) {
  const fs::path password = dir_.path() / "password";
  const std::string nobody = "127.0.0.1:" + std::to_string(free_port());
  for (const std::string content : {"", "\r\n", "\n"}) {
    std::ofstream(password, std::ios::binary | std::ios::trunc) << content;
    const auto start = std::chrono::steady_clock::now();
    const RunResult result =
        run({ddprun(), "--nnodes=1:2", "--rdzv_backend=etcd", "--rdzv_endpoint=" + nobody,
             "--rdzv_conf=username=root,password_file=" + password.string() + ",read_timeout=2",
             "--no_python", worker(), "env", dir_.str()},
            base_env(), dir_.path(), 60s);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
    EXPECT_EQ(result.code, 2) << result.err;
    EXPECT_EQ(lines_of(result.err).size(), 1u) << result.err;
    EXPECT_NE(
        result.err.find("--rdzv_conf password_file: '" + password.string() + "' holds no password"),
        std::string::npos)
        << result.err;
  }
  EXPECT_FALSE(fs::exists(dir_.path() / "env_0_0.json")) << "a worker started";
}

}  // namespace
}  // namespace ddp::test
