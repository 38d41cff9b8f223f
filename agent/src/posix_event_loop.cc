// The real WorkerEventLoop: fork + exec (not Boost.Process: its 1.74 child
// handling reaps through its own SIGCHLD machinery and cannot hand us a
// signalfd-driven loop; the few steps we need in the child - own process
// group, parent-death signal, clean signal state - are simpler written out).
// One epoll set watches a signalfd (SIGCHLD + handled signals), an eventfd
// (wake) and every worker's output pipes: the agent sleeps until something
// happens, nothing polls.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string_view>

#include "ddp/agent/worker_event_loop.h"
#include "ddp/common/error.h"
#include "safe_file.h"

namespace ddp::agent {
namespace {

constexpr std::size_t kMaxLine = 64 * 1024;  // a longer "line" is cut and flushed

std::string errno_text(int err) { return std::strerror(err); }

// Worker output is best effort: a console gone (EPIPE) or a full disk is ignored.
void write_all(int fd, const char* data, std::size_t size) {
  (void)detail::write_all(fd, data, size);
}

// Opens a worker's log file for writing, safely in a directory others may
// write to: no symbolic link (a planted one would redirect the write and the
// truncation to another file), nothing but a regular file with a single link
// (a FIFO would block, a device is not a log, a planted hard link is somebody
// else's file), and only then truncated. O_NONBLOCK: opening a FIFO for writing would
// otherwise wait for a reader. Returns -1 and sets `problem` when refused.
// `truncate` false keeps what the file holds (a file this loop wrote before).
int open_log_file(const std::string& path, std::string& problem, bool truncate = true) {
  int fd = detail::open_no_symlinks(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY, 0644);
  if (fd < 0) {
    problem = detail::open_error_text(errno);
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    problem = "fstat: " + errno_text(errno);
  } else if (!S_ISREG(st.st_mode)) {
    problem = "it is " + detail::file_type_text(st.st_mode) + ", not a regular file (refused)";
  } else if (st.st_nlink != 1) {
    problem = "it has " + std::to_string(st.st_nlink) + " hard links (refused)";
  } else if (truncate && ::ftruncate(fd, 0) != 0) {
    problem = "truncate: " + errno_text(errno);
  } else {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
  }
  ::close(fd);
  return -1;
}

// A file that the console lines matching some filters are copied to
// (--duplicate_stdout_filters), shared by the streams that name it and closed
// with the last of them.
struct DuplicateFile {
  int fd = -1;
  ~DuplicateFile() {
    if (fd >= 0) ::close(fd);
  }
};

// Where one stream's matching console lines are copied, and which match.
struct Duplicate {
  std::shared_ptr<DuplicateFile> file;
  std::vector<std::string> filters;

  bool matches(std::string_view line) const {
    return std::any_of(filters.begin(), filters.end(), [&](const std::string& filter) {
      return line.find(filter) != std::string_view::npos;
    });
  }
};

// One output stream of one worker: the read end of its pipe, the partial line
// not yet written, and where complete lines go.
struct Stream {
  int fd = -1;
  int file_fd = -1;
  int console_fd = -1;  // 1 or 2, or -1 when not on the console
  std::string prefix;
  std::string partial;
  Duplicate duplicate;  // no file: none

  // `out` (prefixed console lines, each ending in '\n') from `from`: those
  // that match go to the duplicate file too, in one write.
  void copy_matching(const std::string& out, std::size_t from) const {
    if (!duplicate.file) return;
    std::string copied;
    for (std::size_t start = from; start < out.size();) {
      const std::size_t end = out.find('\n', start) + 1;
      const std::string_view line(out.data() + start + prefix.size(),
                                  end - start - prefix.size() - 1);
      if (duplicate.matches(line)) copied.append(out, start, end - start);
      start = end;
    }
    if (!copied.empty()) write_all(duplicate.file->fd, copied.data(), copied.size());
  }

  // Writes every complete line (prefix + line, one write each so that lines of
  // different workers never interleave) and keeps the rest.
  void consume(const char* data, std::size_t size) {
    if (file_fd >= 0) write_all(file_fd, data, size);
    if (console_fd < 0) return;
    partial.append(data, size);
    std::size_t start = 0;
    std::string out;
    for (;;) {
      std::size_t nl = partial.find('\n', start);
      if (nl == std::string::npos) break;
      out.append(prefix).append(partial, start, nl + 1 - start);
      start = nl + 1;
    }
    partial.erase(0, start);
    if (partial.size() >= kMaxLine) {
      out.append(prefix).append(partial).push_back('\n');
      partial.clear();
    }
    if (!out.empty()) write_all(console_fd, out.data(), out.size());
    copy_matching(out, 0);
  }

  void flush_partial() {
    if (console_fd >= 0 && !partial.empty()) {
      std::string out = prefix + partial + "\n";
      write_all(console_fd, out.data(), out.size());
      copy_matching(out, 0);
    }
    partial.clear();
  }

  void close_all() {
    flush_partial();
    if (fd >= 0) ::close(fd);
    if (file_fd >= 0) ::close(file_fd);
    fd = file_fd = -1;
  }
};

struct Child {
  Stream out;
  Stream err;
};

class PosixEventLoop final : public WorkerEventLoop {
 public:
  explicit PosixEventLoop(const std::vector<int>& handled_signals) {
    sigemptyset(&mask_);
    sigaddset(&mask_, SIGCHLD);
    for (int signo : handled_signals) sigaddset(&mask_, signo);
    // Blocked in this thread (and threads it creates later): delivered only
    // through the signalfd.
    if (::pthread_sigmask(SIG_BLOCK, &mask_, &old_mask_) != 0) {
      throw InternalError("launcher", "pthread_sigmask failed");
    }
    ::signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the agent
    signal_fd_ = ::signalfd(-1, &mask_, SFD_CLOEXEC | SFD_NONBLOCK);
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (signal_fd_ < 0 || wake_fd_ < 0 || epoll_fd_ < 0) {
      throw InternalError("launcher", "cannot create signalfd/eventfd/epoll: " + errno_text(errno));
    }
    watch(signal_fd_);
    watch(wake_fd_);
  }

  ~PosixEventLoop() override {
    for (auto& [pid, child] : children_) {
      child.out.close_all();
      child.err.close_all();
    }
    for (int fd : {signal_fd_, wake_fd_, epoll_fd_}) {
      if (fd >= 0) ::close(fd);
    }
    ::pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }

  int launch(const ProcessSpec& spec) override {
    if (spec.argv.empty()) throw InvalidArgument("launcher", "empty command");
    // Everything the child needs is prepared before fork: after fork in a
    // multi-threaded process only async-signal-safe calls are allowed.
    std::vector<char*> argv;
    for (const auto& arg : spec.argv) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (const auto& var : spec.env) envp.push_back(const_cast<char*>(var.c_str()));
    envp.push_back(nullptr);

    Child child;
    int out_pipe[2] = {-1, -1};
    int err_pipe[2] = {-1, -1};
    int exec_pipe[2] = {-1, -1};
    auto cleanup = [&] {
      for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1], exec_pipe[0], exec_pipe[1],
                     child.out.file_fd, child.err.file_fd}) {
        if (fd >= 0) ::close(fd);
      }
    };
    auto open_stream = [&](const StreamRoute& route, int console, Stream& stream, int(&p)[2]) {
      if (!route.file.empty()) {
        std::string problem;
        stream.file_fd = open_log_file(route.file, problem);
        if (stream.file_fd < 0) {
          cleanup();
          throw InvalidArgument("launcher", "cannot open log file " + route.file + ": " + problem);
        }
      }
      if (route.console) stream.console_fd = console;
      stream.prefix = spec.prefix;
      if (route.console && !route.duplicate_file.empty()) {
        stream.duplicate.file = duplicate_file(route.duplicate_file, cleanup);
        stream.duplicate.filters = route.duplicate_filters;
      }
      // A stream that goes nowhere gets /dev/null (p stays -1).
      if (stream.file_fd >= 0 || stream.console_fd >= 0) {
        if (::pipe2(p, O_CLOEXEC) != 0) {
          int err = errno;
          cleanup();
          throw InternalError("launcher", "pipe: " + errno_text(err));
        }
      }
    };
    open_stream(spec.out, STDOUT_FILENO, child.out, out_pipe);
    open_stream(spec.err, STDERR_FILENO, child.err, err_pipe);
    if (::pipe2(exec_pipe, O_CLOEXEC) != 0) {
      int err = errno;
      cleanup();
      throw InternalError("launcher", "pipe: " + errno_text(err));
    }
    // The CPUs to bind to, as a set sized for the highest of them.
    const int top_cpu =
        spec.cpus.empty() ? 0 : *std::max_element(spec.cpus.begin(), spec.cpus.end());
    std::unique_ptr<cpu_set_t, void (*)(cpu_set_t*)> cpus(
        spec.cpus.empty() ? nullptr : CPU_ALLOC(top_cpu + 1), [](cpu_set_t* set) {
          if (set != nullptr) CPU_FREE(set);
        });
    const std::size_t cpus_size = CPU_ALLOC_SIZE(top_cpu + 1);
    if (cpus) {
      CPU_ZERO_S(cpus_size, cpus.get());
      for (int cpu : spec.cpus) CPU_SET_S(cpu, cpus_size, cpus.get());
    }
    const pid_t parent = ::getpid();
    const char* program = argv[0];
    const std::vector<int>& inherit = spec.inherit_fds;
    const sigset_t old_mask = old_mask_;

    pid_t pid = ::fork();
    if (pid < 0) {
      int err = errno;
      cleanup();
      throw InternalError("launcher", "fork: " + errno_text(err));
    }
    if (pid == 0) {
      // Child: async-signal-safe calls only.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      // The agent may have died between fork and prctl: then nobody would
      // send the death signal, so give up now.
      if (::getppid() != parent) ::_exit(1);
      // Under Yama's ptrace_scope=1 a process may trace only its descendants:
      // the agent's stack collector (eu-stack or gdb, a child of the agent,
      // not an ancestor of the worker) could not attach. Allow the agent and
      // its descendants. Kept through exec; EINVAL without Yama, ignored.
      ::prctl(PR_SET_PTRACER, static_cast<unsigned long>(parent), 0, 0, 0);
      auto redirect = [](int fd, int target) {
        if (fd < 0) {
          int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
          if (null_fd >= 0) {
            ::dup2(null_fd, target);
            ::close(null_fd);
          }
        } else {
          ::dup2(fd, target);  // dup2 clears O_CLOEXEC on the target
        }
      };
      redirect(out_pipe[1], STDOUT_FILENO);
      redirect(err_pipe[1], STDERR_FILENO);
      // Whatever else is open - descriptors ddprun inherited, or a socket a
      // library opened without close-on-exec - must not reach the worker
      // (subprocess.Popen's close_fds=True, which torchrun relies on, does the
      // same). Marked close-on-exec rather than closed: exec_pipe[1] reports
      // an exec failure. Kernels before 5.11 lack the flag; then only the
      // descriptors' own close-on-exec flags apply.
      ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
      for (int fd : inherit) ::fcntl(fd, F_SETFD, 0);
      // Clean signal state: the agent blocks its handled signals and ignores
      // SIGPIPE, and both would survive exec (caught handlers do not). Other
      // dispositions ddprun inherited (nohup's SIGHUP) pass on, like Popen.
      ::signal(SIGPIPE, SIG_DFL);
      ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
      // --numa_binding: bound before exec, so every thread the program
      // starts inherits it. A refusal is reported as minus its errno.
      if (cpus && ::sched_setaffinity(0, cpus_size, cpus.get()) != 0) {
        int err = -errno;
        ssize_t ignored = ::write(exec_pipe[1], &err, sizeof(err));
        (void)ignored;
        ::_exit(127);
      }
      ::execve(program, argv.data(), envp.data());
      int err = errno;
      ssize_t ignored = ::write(exec_pipe[1], &err, sizeof(err));
      (void)ignored;
      ::_exit(127);
    }
    // Parent. Set the group here too, so it exists before we might signal it.
    ::setpgid(pid, pid);
    for (int* fd : {&out_pipe[1], &err_pipe[1], &exec_pipe[1]}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
    int exec_errno = 0;
    ssize_t n;
    do {
      n = ::read(exec_pipe[0], &exec_errno, sizeof(exec_errno));
    } while (n < 0 && errno == EINTR);
    ::close(exec_pipe[0]);
    exec_pipe[0] = -1;
    if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
      ::waitpid(pid, nullptr, 0);
      cleanup();
      if (exec_errno < 0) {
        std::string list;
        for (int cpu : spec.cpus) {
          if (!list.empty()) list += ',';
          list += std::to_string(cpu);
        }
        throw InvalidArgument("launcher", std::string("cannot bind ") + program + " to CPUs " +
                                              list + ": " + errno_text(-exec_errno));
      }
      throw InvalidArgument(
          "launcher", std::string("cannot execute ") + program + ": " + errno_text(exec_errno));
    }
    child.out.fd = out_pipe[0];
    child.err.fd = err_pipe[0];
    for (Stream* stream : {&child.out, &child.err}) {
      if (stream->fd >= 0) {
        ::fcntl(stream->fd, F_SETFL, ::fcntl(stream->fd, F_GETFL) | O_NONBLOCK);
        watch(stream->fd);
        fd_owner_[stream->fd] = {pid, stream == &child.out};
      }
    }
    children_.emplace(pid, std::move(child));
    return pid;
  }

  void signal_group(int pid, int signo) override {
    // Both parent and child call setpgid before anyone signals, so the group
    // exists while any member lives; ESRCH means it is gone. Only a child not
    // yet reaped is signalled: its unreaped zombie keeps its pid, and so the
    // group id, from being reused. A reaped worker's group was already killed
    // (reap()), and its id may belong to somebody else by now.
    if (children_.count(pid) == 0) return;
    ::kill(-pid, signo);
  }

  LoopEvent next_event(Clock::time_point deadline) override {
    for (;;) {
      if (!pending_.empty()) {
        LoopEvent event = pending_.front();
        pending_.pop_front();
        return event;
      }
      // A passed deadline still looks once (timeout 0) so that ready events
      // are never reported as a timeout.
      int timeout_ms = -1;
      if (deadline != Clock::time_point::max()) {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - real_runtime().now());
        timeout_ms = static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 1 << 30));
      }
      epoll_event events[16];
      int n = ::epoll_wait(epoll_fd_, events, 16, timeout_ms);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw InternalError("launcher", "epoll_wait: " + errno_text(errno));
      }
      if (n == 0 && timeout_ms >= 0 && real_runtime().now() >= deadline) {
        LoopEvent event;
        event.kind = LoopEvent::Kind::kTimeout;
        return event;
      }
      // Output first, so that lines written before an exit precede its event.
      for (int i = 0; i < n; ++i) {
        int fd = events[i].data.fd;
        if (fd != signal_fd_ && fd != wake_fd_) read_output(fd);
      }
      for (int i = 0; i < n; ++i) {
        int fd = events[i].data.fd;
        if (fd == signal_fd_) read_signals();
        if (fd == wake_fd_) {
          std::uint64_t value;
          while (::read(wake_fd_, &value, sizeof(value)) > 0) {
          }
          LoopEvent event;
          event.kind = LoopEvent::Kind::kWake;
          pending_.push_back(event);
        }
      }
    }
  }

  void wake() override {
    std::uint64_t one = 1;
    ssize_t ignored = ::write(wake_fd_, &one, sizeof(one));
    (void)ignored;
  }

 private:
  // The shared file at `path` for duplicated lines: the one the streams of
  // running workers hold, else opened now with the log files' refusals
  // (truncated only the first time: a later worker of the same attempt appends).
  template <typename Cleanup>
  std::shared_ptr<DuplicateFile> duplicate_file(const std::string& path, Cleanup& cleanup) {
    auto known = duplicate_files_.find(path);
    if (known != duplicate_files_.end()) {
      if (auto open = known->second.lock()) return open;
    }
    auto file = std::make_shared<DuplicateFile>();
    std::string problem;
    file->fd = open_log_file(path, problem, known == duplicate_files_.end());
    if (file->fd < 0) {
      cleanup();
      throw InvalidArgument("launcher", "cannot open log file " + path + ": " + problem);
    }
    ::fcntl(file->fd, F_SETFL, ::fcntl(file->fd, F_GETFL) | O_APPEND);
    duplicate_files_[path] = file;
    return file;
  }

  void watch(int fd) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) {
      throw InternalError("launcher", "epoll_ctl: " + errno_text(errno));
    }
  }

  Stream* stream_of(int fd) {
    auto owner = fd_owner_.find(fd);
    if (owner == fd_owner_.end()) return nullptr;
    auto child = children_.find(owner->second.first);
    if (child == children_.end()) return nullptr;
    return owner->second.second ? &child->second.out : &child->second.err;
  }

  // Reads what is available; `drain` reads until EOF or EAGAIN (a bounded
  // number of times: a grandchild might keep the pipe busy forever).
  void read_output(int fd, bool drain = false) {
    Stream* stream = stream_of(fd);
    if (stream == nullptr) return;
    char buffer[65536];
    for (int round = 0; round < (drain ? 64 : 1); ++round) {
      ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n > 0) {
        stream->consume(buffer, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      // EOF or error: this stream is done.
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
      fd_owner_.erase(fd);
      stream->flush_partial();
      ::close(fd);
      stream->fd = -1;
      return;
    }
  }

  void read_signals() {
    signalfd_siginfo info;
    while (::read(signal_fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
      if (static_cast<int>(info.ssi_signo) == SIGCHLD) {
        reap();
      } else {
        LoopEvent event;
        event.kind = LoopEvent::Kind::kSignal;
        event.signo = static_cast<int>(info.ssi_signo);
        pending_.push_back(event);
      }
    }
  }

  // SIGCHLD coalesces: reap every exited child. A worker's process group is
  // killed before the worker is reaped: until then its zombie holds the pid,
  // so the group id cannot have been reused by an unrelated group, and the
  // worker's own children (which stay in its group unless they leave it) do
  // not outlive it, whether it succeeded, failed or was stopped.
  void reap() {
    for (;;) {
      siginfo_t info{};
      // WNOWAIT: find an exited child but leave it a zombie for now.
      if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
        if (errno == EINTR) continue;
        return;  // ECHILD: no children at all
      }
      const pid_t pid = info.si_pid;
      if (pid == 0) return;  // children exist, none has exited
      auto it = children_.find(pid);
      if (it != children_.end()) ::kill(-pid, SIGKILL);
      int status = 0;
      pid_t reaped;
      do {
        reaped = ::waitpid(pid, &status, 0);  // exited already: does not block
      } while (reaped < 0 && errno == EINTR);
      if (reaped != pid || it == children_.end()) continue;  // not ours
      LoopEvent event;
      event.kind = LoopEvent::Kind::kExited;
      event.pid = pid;
      event.status = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      // Everything the process wrote is in its pipes now: route it before the
      // exit is reported, then forget the process.
      for (Stream* stream : {&it->second.out, &it->second.err}) {
        if (stream->fd >= 0) {
          int fd = stream->fd;
          read_output(fd, true);
          if (stream->fd >= 0) {
            ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
            fd_owner_.erase(fd);
          }
        }
        stream->close_all();
      }
      children_.erase(it);
      pending_.push_back(event);
    }
  }

  sigset_t mask_;
  sigset_t old_mask_;
  int signal_fd_ = -1;
  int wake_fd_ = -1;
  int epoll_fd_ = -1;
  std::map<int, Child> children_;
  // pipe fd -> (pid, is stdout)
  std::map<int, std::pair<int, bool>> fd_owner_;
  // --duplicate_*_filters' files by path (open while a stream holds them; a
  // path stays known, one per attempt, so that reopening it appends).
  std::map<std::string, std::weak_ptr<DuplicateFile>> duplicate_files_;
  std::deque<LoopEvent> pending_;
};

}  // namespace

std::unique_ptr<WorkerEventLoop> make_posix_event_loop(const std::vector<int>& handled_signals) {
  return std::make_unique<PosixEventLoop>(handled_signals);
}

std::string resolve_program(const std::string& program, const std::string& path) {
  auto executable = [](const std::string& file) {
    struct stat st {};
    return ::stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
           ::access(file.c_str(), X_OK) == 0;
  };
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos) return executable(program) ? program : "";
  const std::string_view dirs(path);
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = dirs.find(':', start);
    std::string_view dir = dirs.substr(start, end == std::string_view::npos ? end : end - start);
    if (dir.empty()) dir = ".";
    // Appended, not dir + "/" + program: GCC 12 at -O3 takes that for an
    // overlapping copy (-Wrestrict, a false positive) and fails the build.
    std::string candidate;
    candidate.reserve(dir.size() + 1 + program.size());
    candidate.append(dir).append(1, '/').append(program);
    if (executable(candidate)) return candidate;
    if (end == std::string_view::npos) return "";
    start = end + 1;
  }
}

}  // namespace ddp::agent
