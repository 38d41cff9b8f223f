// The ddp-rendezvous daemon as a child process of a test or a benchmark, on a
// free loopback port (it prints the port on stdout). Its log (stderr) goes to
// an unlinked temporary file, read back when something fails.
//
// Ownership: the DaemonProcess owns the process (not copyable); the
// destructor stops it. The child dies with the thread that started it
// (PR_SET_PDEATHSIG): start it from one that outlives it. Blocking: the
// constructor waits for the port (10 s at most), stop() for the exit.
// Thread-safety: one owner drives it; pid(), port(), status_mib(), cpu_s()
// and log_tail() may be read from other threads while it runs. Errors: the
// constructor throws std::runtime_error, with the daemon's log, when it does
// not start.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "process_state.h"
#include "sys_error.h"

namespace ddp::test {

class DaemonProcess {
 public:
  // Starts `path --host 127.0.0.1 --port 0 <extra...>` and reads its port.
  explicit DaemonProcess(const std::string& path, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args{path, "--host", "127.0.0.1", "--port", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    log_fd_ = ::open(std::filesystem::temp_directory_path().c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC,
                     0600);
    if (log_fd_ < 0) throw sys_error("a temporary file for the daemon's log");
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) {
      const auto error = sys_error("pipe");
      ::close(log_fd_);
      throw error;
    }
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) {
      const auto error = sys_error("fork");
      for (int fd : {out[0], out[1], log_fd_}) ::close(fd);
      throw error;
    }
    if (pid_ == 0) {
      ::signal(SIGPIPE, SIG_DFL);  // an ignored SIGPIPE would survive the exec
      ::dup2(out[1], 1);
      ::dup2(log_fd_, 2);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive its owner
      if (::getppid() != parent) ::_exit(127);
      ::execv(argv[0], argv.data());
      std::fprintf(stderr, "cannot execute %s: %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    ::close(out[1]);
    out_fd_ = out[0];  // kept open to the end: the daemon must never get SIGPIPE
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd pfd{out_fd_, POLLIN, 0};
      if (::poll(&pfd, 1, 100) <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(out_fd_, buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, static_cast<std::size_t>(n));
    }
    try {
      port_ = static_cast<std::uint16_t>(std::stoi(line));
    } catch (const std::exception&) {
      stop();
      const std::string log = log_tail();
      ::close(log_fd_);
      throw std::runtime_error(path + " did not print its port within 10 s (stdout '" + line +
                               "'); its log: " + log);
    }
  }
  ~DaemonProcess() {
    stop();
    if (log_fd_ >= 0) ::close(log_fd_);
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  pid_t pid() const { return pid_; }
  std::uint16_t port() const { return port_; }

  // A field of /proc/<pid>/status in MiB ("VmRSS", "VmHWM"); nullopt once the
  // process is gone.
  std::optional<double> status_mib(const std::string& field) const {
    const auto kib = proc_status_kib(pid_, field);
    if (!kib) return std::nullopt;
    return *kib / 1024.0;
  }

  // CPU seconds (user + system) the daemon used so far.
  double cpu_s() const { return process_cpu_seconds(pid_); }

  // Whether it still runs; reaps it (see exit_status()) when it ended.
  bool running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return true;
    pid_ = -1;
    status_ = status;
    return false;
  }

  void kill_now() {
    if (pid_ > 0) ::kill(pid_, SIGKILL);
  }

  // SIGTERM, SIGKILL after `grace`, reaped; says how it ended ("" when it was
  // not running).
  std::string stop(std::chrono::milliseconds grace = std::chrono::seconds(5)) {
    std::string ended;
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      const auto deadline = std::chrono::steady_clock::now() + grace;
      pid_t reaped = 0;
      while ((reaped = ::waitpid(pid_, &status, WNOHANG)) == 0 &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (reaped == 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
      }
      pid_ = -1;
      status_ = status;
      ended = WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                  : "exited with status " + std::to_string(WEXITSTATUS(status));
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    out_fd_ = -1;
    return ended;
  }

  // waitpid()'s status once stop() or running() reaped it; -1 before.
  int exit_status() const { return status_; }

  // The last `bytes` of the daemon's log (after stop() too: what it wrote as it exited).
  std::string log_tail(std::size_t bytes = 2000) const {
    if (log_fd_ < 0) return "";
    const off_t size = ::lseek(log_fd_, 0, SEEK_END);
    const off_t from = std::max<off_t>(0, size - static_cast<off_t>(bytes));
    std::string text(static_cast<std::size_t>(size - from), '\0');
    const ssize_t n = ::pread(log_fd_, text.data(), text.size(), from);
    text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    return text;
  }

 private:
  pid_t pid_ = -1;
  std::uint16_t port_ = 0;
  int status_ = -1;
  int out_fd_ = -1;
  int log_fd_ = -1;
};

}  // namespace ddp::test
