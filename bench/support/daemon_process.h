// The ddp-rendezvous daemon as a child process of a benchmark, on a free
// loopback port (it prints the port on stdout). Its log goes to an unlinked
// temporary file, read back when something fails. The child dies with the
// benchmark (PR_SET_PDEATHSIG). Not thread-safe; one owner.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace ddp::bench {

// "what: strerror(errno)".
inline std::runtime_error sys_error(const std::string& what) {
  return std::runtime_error(what + ": " + std::strerror(errno));
}

// The CPU seconds (user + system) process `pid` used so far (0 when it is gone).
inline double process_cpu_seconds(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = text.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream fields(text.substr(paren + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

class DaemonProcess {
 public:
  using Clock = std::chrono::steady_clock;

  // Starts `path --host 127.0.0.1 --port 0` and reads its port (10 s at most).
  // Throws std::runtime_error with the daemon's log when it does not start.
  explicit DaemonProcess(const std::string& path) {
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
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the benchmark
      if (::getppid() != parent) ::_exit(127);
      ::execl(path.c_str(), path.c_str(), "--host", "127.0.0.1", "--port", "0", nullptr);
      std::fprintf(stderr, "cannot execute %s: %s\n", path.c_str(), std::strerror(errno));
      ::_exit(127);
    }
    ::close(out[1]);
    out_fd_ = out[0];  // kept open to the end: the daemon must never get SIGPIPE
    std::string line;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (line.find('\n') == std::string::npos && Clock::now() < deadline) {
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
      const std::string log = log_tail();
      stop();
      throw std::runtime_error(fmt::format(
          "{} did not print its port within 10 s (stdout '{}'); its log: {}", path, line, log));
    }
  }
  ~DaemonProcess() { stop(); }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  pid_t pid() const { return pid_; }
  std::uint16_t port() const { return port_; }

  // A field of /proc/<pid>/status in MiB ("VmRSS", "VmHWM"); nullopt once the
  // process is gone.
  std::optional<double> status_mib(const std::string& field) const {
    std::ifstream status(fmt::format("/proc/{}/status", pid_));
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind(field + ":", 0) == 0) {
        return std::stod(line.substr(field.size() + 1)) / 1024.0;  // the kernel writes kB
      }
    }
    return std::nullopt;
  }

  // CPU seconds (user + system) the daemon used so far.
  double cpu_s() const { return process_cpu_seconds(pid_); }

  void kill_now() {
    if (pid_ > 0) ::kill(pid_, SIGKILL);
  }

  // SIGTERM, SIGKILL after 5 s, reaped; says how it ended ("" when it was not running).
  std::string stop() {
    std::string ended;
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      pid_t reaped = 0;
      while ((reaped = ::waitpid(pid_, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (reaped == 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
      }
      pid_ = -1;
      ended = WIFSIGNALED(status) ? fmt::format("killed by signal {}", WTERMSIG(status))
                                  : fmt::format("exited with status {}", WEXITSTATUS(status));
    }
    for (int* fd : {&out_fd_, &log_fd_}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
    return ended;
  }

  // The last 2,000 bytes of the daemon's log.
  std::string log_tail() const {
    if (log_fd_ < 0) return "";
    const off_t size = ::lseek(log_fd_, 0, SEEK_END);
    const off_t from = std::max<off_t>(0, size - 2000);
    std::string text(static_cast<std::size_t>(size - from), '\0');
    const ssize_t n = ::pread(log_fd_, text.data(), text.size(), from);
    text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    return text;
  }

 private:
  pid_t pid_ = -1;
  std::uint16_t port_ = 0;
  int out_fd_ = -1;
  int log_fd_ = -1;
};

}  // namespace ddp::bench
