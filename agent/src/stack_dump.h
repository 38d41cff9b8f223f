// The native stacks of every thread of a process, for a hang report: the agent
// calls this on a worker it found hung, before it kills it. Internal to
// ddp::agent.
//
// How: elfutils' `eu-stack -i -m -s -p PID` (function names with inlined
// frames, module, source file:line; tens of milliseconds), and when eu-stack is
// missing or shows no frame, `gdb -nx -batch -p PID -ex "thread apply all
// -ascending bt"` (hundreds of milliseconds to seconds: gdb reads all the
// symbols). Both tools are found by searching the absolute directories of PATH,
// then /usr/bin. Each runs in its own process group, stdin from /dev/null,
// stdout and stderr into one pipe, no other descriptor of the caller, a clean
// signal mask, DEBUGINFOD_URLS removed (never the network) and LC_ALL=C.
//
// The target: both tools attach with ptrace and detach when done, so the
// process is left running. A tool killed (timeout) or dead while attached may
// leave the SIGSTOP its attach sent pending, and it would stop the process
// after the kernel detaches it; /proc does not show a pending stop. So after
// every tool the target is sent SIGCONT (which resumes it and discards pending
// stop signals), unless it was already stopped before the dump began. Attaching needs the right to ptrace `pid`: root or
// CAP_SYS_PTRACE, or the same user where kernel.yama.ptrace_scope allows it (at
// 1 only a descendant of the process that `pid` named with
// prctl(PR_SET_PTRACER), or one of its ancestors, may attach).
//
// Children: the tool is this call's child, and is always reaped here with
// waitpid(tool pid) before returning (killed first, with its whole process
// group, on timeout); no other child is waited for. The caller must not reap
// arbitrary children concurrently on another thread (a waitpid(-1) elsewhere
// could take the tool's status: it is then treated as gone). Its SIGCHLD still
// reaches the caller's signal handling (the agent's signalfd), where a reap
// finds nothing left of it. `pid` should not be recyclable during the call (the
// agent passes its own unreaped child).
//
// Blocking: up to `timeout`, plus killing and reaping the tool (milliseconds).
// Thread-safety: may be called from any thread; calls share no state. It forks,
// and the child makes only async-signal-safe calls before exec. It reads PATH
// and the environment, so no thread may change the environment meanwhile.
// Errors: never throws; StackDump::error says why there are no stacks.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace ddp::agent {

struct StackDump {
  std::string tool;   // "eu-stack" or "gdb": the last tool that ran; empty when none ran
  std::string text;   // the stacks as the tool printed them (bounded, see below)
  std::string error;  // why there are no stacks (tool missing, ptrace refused, timed
                      // out...), empty on success
};

// Native stacks of every thread of `pid` (see above). Success (error empty)
// means the tool printed at least one frame ("#0" at the start of a line).
// `timeout` bounds the whole call, both tools together (eu-stack, then gdb in
// what is left); zero or less still starts eu-stack and kills it at once.
// `text` holds at most `max_bytes` of the tool's output, cut at a line end when
// possible and followed by a "[cut] N bytes more" line when it printed more.
// On error, `text` is empty and `error` quotes what the tool said (up to 1 KiB).
StackDump collect_native_stacks(int pid, std::chrono::milliseconds timeout,
                                std::size_t max_bytes = 256 * 1024);

}  // namespace ddp::agent
