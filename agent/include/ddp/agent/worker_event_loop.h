// The agent's event loop: the one place the agent's thread waits. It starts
// the workers' processes (so that their exits, output and the agent's handled
// signals arrive in one queue) and turns what happens into events, one at a
// time: a worker exited, a handled signal came, wake() was called (another
// thread's news: the round's watch, the rendezvous thread), or the deadline
// passed. The agent's round loop is a loop over next_event(). One small
// interface, so the restart logic is testable with a fake
// (tests/agent/fake_event_loop.h).
//
// Contract: launch() returns once the process exists (never waits for it);
// signal_group() never blocks; next_event() blocks until an event or the
// deadline and is the only call that waits; wake() never blocks. Ownership:
// the loop owns the pipes of the processes it started and reaps them; the
// caller owns nothing it returns but values. Errors: see each call.
//
// The real implementation (make_posix_event_loop) forks and execs each worker in
// its own process group with a parent-death signal (SIGKILL), allowing the
// agent and its children (the stack collector) to ptrace it under Yama's
// ptrace_scope=1 (prctl PR_SET_PTRACER), routes its
// stdout/stderr through pipes to the console (line by line, prefixed, never cut
// into each other) and to log files, and turns child exits (SIGCHLD through a
// signalfd), handled signals and wake() calls into events: nothing polls.
//
// A worker's process group is killed (SIGKILL) when the worker exits, before
// it is reaped, whatever the exit: success, failure or a stop. Its children
// therefore do not outlive it unless they left its process group (setsid,
// setpgid). Killing before reaping is what makes this safe: the unreaped
// zombie keeps its pid, and so the group id, from being reused.
//
// A worker inherits only its stdin, its stdout/stderr pipes (or /dev/null) and
// the descriptors its spec names (inherit_fds, like Popen's pass_fds): every
// other descriptor of the agent is closed at exec, whether or not it was
// opened close-on-exec (like subprocess.Popen's close_fds).
//
// Thread-safety: everything but wake() must be called from one thread (the
// agent's). wake() may be called from any thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ddp/common/time.h"

namespace ddp::agent {

// Where one output stream of a worker goes.
struct StreamRoute {
  // Copy raw bytes to this file (created, or truncated at spawn); empty: no
  // file. The log directory may be shared, so launch() refuses (InvalidArgument
  // naming the path and the reason) a path that is or passes through a
  // symbolic link (every component where the kernel supports openat2, else the
  // last one), and a file that is not a regular file (a FIFO, a device, a
  // directory) or has more than one hard link; nothing is truncated then.
  std::string file;
  // Write each line to the agent's own stream (stdout for stdout, stderr for
  // stderr) behind `prefix`.
  bool console = true;
  // With `console`: each console line that contains any of `duplicate_filters`
  // is also appended, behind `prefix`, to `duplicate_file`, which every stream
  // naming the same path shares (created, or truncated, at the first launch
  // that names it, with the same refusals as `file`; closed when no stream
  // names it any more, and appended to when a later launch names it again).
  // Empty: none.
  std::string duplicate_file;
  std::vector<std::string> duplicate_filters;
};

struct ProcessSpec {
  // argv[0] must be an absolute or relative path (resolve PATH before: see
  // resolve_program()).
  std::vector<std::string> argv;
  // The complete environment, "NAME=value" each.
  std::vector<std::string> env;
  int local_rank = 0;
  // Put in front of every console line, e.g. "[default0]:".
  std::string prefix;
  StreamRoute out;
  StreamRoute err;
  // Descriptors of the agent the worker inherits under the same numbers (its
  // progress page); every other one is closed at exec.
  std::vector<int> inherit_fds;
  // The CPUs the worker is bound to (sched_setaffinity before exec; launch()
  // throws InvalidArgument naming them when the kernel refuses); empty: the
  // agent's own affinity.
  std::vector<int> cpus;
};

struct LoopEvent {
  enum class Kind {
    kExited,   // a launched process exited: pid, status
    kSignal,   // the agent received a handled signal: signo
    kWake,     // wake() was called
    kTimeout,  // the deadline passed
  };
  Kind kind = Kind::kTimeout;
  int pid = 0;
  // Exit code (>= 0), or minus the signal number that killed the process.
  int status = 0;
  int signo = 0;
  // When the loop noticed the event.
  std::chrono::system_clock::time_point when = std::chrono::system_clock::now();
};

class WorkerEventLoop {
 public:
  virtual ~WorkerEventLoop() = default;

  // Starts a process; returns its pid (also its process group id).
  // Throws InvalidArgument when the program cannot be executed or a log file
  // is refused (the message names it and the reason), InternalError when
  // fork/pipe fail.
  virtual int launch(const ProcessSpec& spec) = 0;

  // Sends `signo` to the process group of `pid` (a launched process). A group
  // that is already gone is not an error; a worker whose exit the loop has
  // already seen is not signalled (its group was killed then, and the id may
  // have been reused since).
  virtual void signal_group(int pid, int signo) = 0;

  // Blocks until the next event or until `deadline` (kTimeout). Output of the
  // workers is routed while waiting. An exited process's remaining output is
  // flushed before its kExited event is returned.
  virtual LoopEvent next_event(Clock::time_point deadline) = 0;

  // Makes a blocked (or the next) next_event() return kWake. Any thread.
  virtual void wake() = 0;
};

// The real event loop (epoll over a signalfd, an eventfd and the workers'
// output pipes). `handled_signals` are blocked in the agent and reported
// as kSignal events (SIGCHLD is always handled internally). Construct it in
// the thread that launches and outlives the workers: the parent-death signal
// fires when the launching thread exits. Throws InternalError when the signalfd,
// epoll or eventfd cannot be created.
std::unique_ptr<WorkerEventLoop> make_posix_event_loop(const std::vector<int>& handled_signals);

// Resolves `program` like execvp: a name without '/' is searched in `path`
// (a PATH value). Returns the path to execute, or "" when not found or not
// executable.
std::string resolve_program(const std::string& program, const std::string& path);

}  // namespace ddp::agent
