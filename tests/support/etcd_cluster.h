// EtcdCluster: real etcd members (/usr/bin/etcd, or Options::binary) on free
// loopback ports, for tests and benchmarks. Header-only.
//
//   DDP_SKIP_WITHOUT_ETCD();                 // in a TEST: skips when etcd is missing
//   ddp::test::EtcdCluster cluster;          // 1 member; EtcdCluster(3) for three
//   EtcdStoreOptions options;
//   options.endpoints = cluster.client_endpoints();
//   // (or parse_etcd_endpoints(cluster.endpoints()))
//   ...
//   cluster.kill(0);      // SIGKILL member 0 (and reap it)
//   cluster.freeze(0);    // SIGSTOP member 0; cluster.thaw(0) sends SIGCONT
//   cluster.stop(0);      // SIGTERM, then SIGKILL after 5 s
//   cluster.restart(0);   // start it again on its ports and data; waits until it serves
//   cluster.granted_ttls();   // the TTLs etcd granted to its live leases
//
// The constructor returns once every member serves clients (it waits up to
// Options::start_timeout, 20 s by default) and throws std::runtime_error with
// the tail of the member's log when one does not. A member serves once its
// client port listens and its log says so or, without TLS, its /health says
// true (a quiet --log-level hides the line). Each member gets a fresh data
// directory and log file under one temporary directory; the destructor
// SIGKILLs and reaps every member and removes that directory, so nothing is
// left behind. Members also get SIGKILL when the thread that started them
// exits (PR_SET_PDEATHSIG), so a crashed test leaves no etcd running: create
// and restart members from a thread that outlives them (the test's own). A
// process of the cluster's own removes the directory once the owner's process
// and every member are gone, however they ended (a SIGKILLed benchmark too).
// Not thread-safe: one thread drives a cluster.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ddp/store_etcd/etcd_store.h"
#include "http_client.h"
#include "net_util.h"
#include "sys_error.h"
#include "temp_dir.h"

// Skips the current test when /usr/bin/etcd is missing.
#define DDP_SKIP_WITHOUT_ETCD()                                                      \
  do {                                                                               \
    if (!::ddp::test::EtcdCluster::available()) {                                    \
      GTEST_SKIP() << "etcd is not installed (" << ::ddp::test::EtcdCluster::kBinary \
                   << " missing): skipping the etcd test";                           \
    }                                                                                \
  } while (false)

namespace ddp::test {

class EtcdCluster {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";

  struct Options {
    int members = 1;
    // The etcd program.
    std::string binary = kBinary;
    // false: --enable-grpc-gateway=false (no /v3/ HTTP API).
    bool grpc_gateway = true;
    // Both set: clients speak https (--cert-file/--key-file).
    std::string cert_file;
    std::string key_file;
    // More etcd flags for every member.
    std::vector<std::string> extra_args;
    std::chrono::seconds start_timeout{20};
  };

  static bool available() { return ::access(kBinary, X_OK) == 0; }

  explicit EtcdCluster(int members = 1) : EtcdCluster(make_options(members)) {}

  explicit EtcdCluster(Options options) : options_(std::move(options)), dir_("ddp-etcd") {
    if (options_.members < 1) throw std::invalid_argument("EtcdCluster: members must be >= 1");
    start_janitor();
    // A port picked by binding port 0 may be taken before etcd binds it: try
    // again with new ports.
    for (int round = 0;; ++round) {
      try {
        start_all(round);
        return;
      } catch (const std::runtime_error& e) {
        const bool collision =
            std::string(e.what()).find("address already in use") != std::string::npos;
        kill_all();
        if (!collision || round == 2) {
          end_janitor();
          throw;
        }
      }
    }
  }

  ~EtcdCluster() {
    kill_all();
    end_janitor();
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  bool tls() const { return !options_.cert_file.empty(); }
  // "127.0.0.1:p1,127.0.0.1:p2,..."
  std::string endpoints() const {
    std::string text;
    for (const auto& m : members_) {
      if (!text.empty()) text += ',';
      text += "127.0.0.1:" + std::to_string(m.client_port);
    }
    return text;
  }
  std::vector<EtcdEndpoint> client_endpoints() const {
    std::vector<EtcdEndpoint> list;
    for (const auto& m : members_) list.push_back({"127.0.0.1", m.client_port});
    return list;
  }
  // "http://127.0.0.1:p1,..." (https with TLS), for etcdctl --endpoints.
  std::string urls() const {
    std::string text;
    for (int i = 0; i < size(); ++i) text += (i ? "," : "") + url(i);
    return text;
  }
  std::string url(int i) const {
    return std::string(tls() ? "https" : "http") +
           "://127.0.0.1:" + std::to_string(members_[i].client_port);
  }
  std::uint16_t client_port(int i) const { return members_[i].client_port; }
  bool running(int i) const { return members_[i].pid > 0; }
  // Member i's process id (-1 when it does not run).
  pid_t pid(int i) const { return members_[i].pid; }
  const std::filesystem::path& dir() const { return dir_.path(); }

  // SIGKILL member i and reap it.
  void kill(int i) { signal_and_reap(members_[i], SIGKILL, std::chrono::seconds(0)); }
  // SIGSTOP member i (a hung member: its sockets stay open and say nothing);
  // thaw() sends SIGCONT. The destructor's SIGKILL ends a frozen member too.
  void freeze(int i) { ::kill(members_[i].pid, SIGSTOP); }
  void thaw(int i) { ::kill(members_[i].pid, SIGCONT); }
  // SIGTERM member i, SIGKILL after 5 s; reaps it.
  void stop(int i) { signal_and_reap(members_[i], SIGTERM, std::chrono::seconds(5)); }
  // Starts a stopped member again (same ports, same data) and waits until it serves.
  void restart(int i) {
    if (running(i)) kill(i);
    launch(i, "existing");
    wait_ready({i});
  }

  // The TTLs etcd granted to its live leases (lease/leases, then
  // lease/timetolive of each, over the first running member's /v3/ API: the
  // gRPC gateway on, no TLS). Empty when etcd does not answer.
  std::vector<std::int64_t> granted_ttls() const {
    std::vector<std::int64_t> ttls;
    int i = 0;
    while (i < size() && !running(i)) ++i;
    if (i == size()) return ttls;
    const std::uint16_t port = members_[i].client_port;
    const auto leases =
        http_request(port, "POST", "/v3/lease/leases", "{}", std::chrono::seconds(2));
    if (!leases) return ttls;
    for (const auto& id : json_values(*leases, "ID")) {
      const auto ttl = http_request(port, "POST", "/v3/lease/timetolive", "{\"ID\":\"" + id + "\"}",
                                    std::chrono::seconds(2));
      if (!ttl) continue;
      for (const auto& granted : json_values(*ttl, "grantedTTL")) {
        ttls.push_back(std::stoll(granted));
      }
    }
    return ttls;
  }

  // The last `bytes` of member i's log.
  std::string log_tail(int i, std::size_t bytes = 3000) const {
    std::ifstream in(members_[i].log);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    return text.size() > bytes ? text.substr(text.size() - bytes) : text;
  }

 private:
  struct Member {
    std::string name;
    std::uint16_t client_port = 0;
    std::uint16_t peer_port = 0;
    std::string data_dir;
    std::string log;
    pid_t pid = -1;
    std::size_t log_offset = 0;  // where this run's log starts
  };

  static Options make_options(int members) {
    Options options;
    options.members = members;
    return options;
  }

  void start_all(int round) {
    members_.clear();
    members_.resize(options_.members);
    for (int i = 0; i < size(); ++i) {
      Member& m = members_[i];
      m.name = "n" + std::to_string(i);
      m.client_port = free_port();
      m.peer_port = free_port();
      m.data_dir = (dir_.path() / ("r" + std::to_string(round) + "-" + m.name + ".etcd")).string();
      m.log = (dir_.path() / ("r" + std::to_string(round) + "-" + m.name + ".log")).string();
    }
    std::mt19937_64 rng(std::random_device{}());
    token_ = "ddp-test-" + std::to_string(rng());
    std::vector<int> all;
    for (int i = 0; i < size(); ++i) {
      launch(i, "new");
      all.push_back(i);
    }
    wait_ready(all);
  }

  std::vector<std::string> arguments(int i, const std::string& state) const {
    const Member& m = members_[i];
    const std::string scheme = tls() ? "https" : "http";
    const std::string client = scheme + "://127.0.0.1:" + std::to_string(m.client_port);
    const std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
    std::string initial;
    for (const auto& other : members_) {
      if (!initial.empty()) initial += ',';
      initial += other.name + "=http://127.0.0.1:" + std::to_string(other.peer_port);
    }
    std::vector<std::string> args = {
        options_.binary, "--name", m.name, "--data-dir", m.data_dir, "--listen-client-urls", client,
        "--advertise-client-urls", client, "--listen-peer-urls", peer,
        "--initial-advertise-peer-urls", peer, "--initial-cluster", initial,
        "--initial-cluster-state", state, "--initial-cluster-token", token_,
        // Room for the conformance suite's 8 MiB value (base64 in JSON).
        "--max-request-bytes", "33554432",
        std::string("--enable-grpc-gateway=") + (options_.grpc_gateway ? "true" : "false")};
    if (tls()) {
      args.insert(args.end(), {"--cert-file", options_.cert_file, "--key-file", options_.key_file});
    }
    args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
    return args;
  }

  void launch(int i, const std::string& state) {
    Member& m = members_[i];
    std::vector<std::string> args = arguments(i, state);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::error_code ec;
    m.log_offset = std::filesystem::exists(m.log, ec) ? std::filesystem::file_size(m.log, ec) : 0;
    int log = ::open(m.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log < 0) throw std::runtime_error("EtcdCluster: cannot open " + m.log);
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) {
      ::close(log);
      throw std::runtime_error("EtcdCluster: fork failed");
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) _exit(127);
      ::dup2(log, STDOUT_FILENO);
      ::dup2(log, STDERR_FILENO);
      int null = ::open("/dev/null", O_RDONLY);
      if (null >= 0) ::dup2(null, STDIN_FILENO);
      // The member holds the janitor's pipe open: the directory stays while it runs.
      ::fcntl(janitor_fd_, F_SETFD, 0);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGPIPE, SIG_DFL);  // an ignored SIGPIPE would survive the exec
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    ::close(log);
    m.pid = pid;
  }

  std::string this_run_log(int i) const {
    std::ifstream in(members_[i].log);
    in.seekg(static_cast<std::streamoff>(members_[i].log_offset));
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }

  // Waits until every member in `which` serves clients (see the top of the file).
  void wait_ready(const std::vector<int>& which) {
    const auto deadline = std::chrono::steady_clock::now() + options_.start_timeout;
    std::vector<bool> ready(members_.size(), false);
    for (;;) {
      bool all = true;
      for (int i : which) {
        if (ready[i]) continue;
        Member& m = members_[i];
        int status = 0;
        if (m.pid > 0 && ::waitpid(m.pid, &status, WNOHANG) == m.pid) {
          m.pid = -1;
          fail(i, "exited during start-up");
        }
        ready[i] = port_listens(m.client_port) &&
                   (this_run_log(i).find("ready to serve client requests") != std::string::npos ||
                    (!tls() && healthy(m.client_port)));
        all = all && ready[i];
      }
      if (all) return;
      if (std::chrono::steady_clock::now() >= deadline) {
        for (int i : which) {
          if (!ready[i]) {
            fail(i, "did not serve clients within " +
                        std::to_string(options_.start_timeout.count()) + " s");
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // Whether etcd on `port` says it is healthy (it answers once it serves).
  static bool healthy(std::uint16_t port) {
    const auto reply = http_request(port, "GET", "/health", "", std::chrono::seconds(1));
    return reply && reply->find("\"health\":\"true\"") != std::string::npos;
  }

  // The janitor: a process of its own that removes dir_ once the pipe whose
  // write end only this process and the members hold reaches its end (they
  // are all gone, however they ended). It leaves this process's group and
  // ignores the terminal's signals, so that a Ctrl-C that ends both does not
  // end it first; it closes every other descriptor it got in the fork.
  void start_janitor() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw sys_error("EtcdCluster: pipe");
    const std::string dir = dir_.str();
    const char* argv[] = {"/bin/rm", "-rf", "--", dir.c_str(), nullptr};
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      for (int sig : {SIGINT, SIGHUP, SIGTERM, SIGQUIT}) ::signal(sig, SIG_IGN);
      ::dup2(fds[0], STDIN_FILENO);
      if (null >= 0) {
        ::dup2(null, STDOUT_FILENO);
        ::dup2(null, STDERR_FILENO);
      }
      ::close_range(3, ~0U, 0);
      char c;
      while (::read(STDIN_FILENO, &c, 1) < 0 && errno == EINTR) {
      }
      ::execv(argv[0], const_cast<char* const*>(argv));
      _exit(127);
    }
    const int fork_errno = errno;
    ::close(fds[0]);
    if (null >= 0) ::close(null);
    if (pid < 0) {
      ::close(fds[1]);
      errno = fork_errno;
      throw sys_error("EtcdCluster: fork");
    }
    janitor_ = pid;
    janitor_fd_ = fds[1];
  }

  // Once the members are gone and dir_ about to remove the directory itself.
  void end_janitor() {
    ::close(janitor_fd_);
    ::kill(janitor_, SIGKILL);
    ::waitpid(janitor_, nullptr, 0);
  }

  [[noreturn]] void fail(int i, const std::string& what) {
    throw std::runtime_error("EtcdCluster: member " + members_[i].name + " (client port " +
                             std::to_string(members_[i].client_port) + ") " + what +
                             "; its log ends:\n" + log_tail(i));
  }

  static void signal_and_reap(Member& m, int signal, std::chrono::seconds grace) {
    if (m.pid <= 0) return;
    ::kill(m.pid, signal);
    const auto deadline = std::chrono::steady_clock::now() + grace;
    while (signal != SIGKILL && std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(m.pid, nullptr, WNOHANG) == m.pid) {
        m.pid = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(m.pid, SIGKILL);
    ::waitpid(m.pid, nullptr, 0);
    m.pid = -1;
  }

  void kill_all() {
    for (auto& m : members_) {
      if (m.pid > 0) ::kill(m.pid, SIGKILL);
    }
    for (auto& m : members_) {
      if (m.pid > 0) ::waitpid(m.pid, nullptr, 0);
      m.pid = -1;
    }
  }

  Options options_;
  TempDir dir_;
  std::vector<Member> members_;
  std::string token_;
  pid_t janitor_ = -1;
  int janitor_fd_ = -1;  // the write end of its pipe
};

}  // namespace ddp::test
