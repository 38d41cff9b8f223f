// Background work that may block for long (a store call to a frozen or
// unreachable host) without ever holding up its owner.
//
// The one idiom: the work runs on a thread of its own and owns everything it
// touches (captures by value or shared_ptr, never a reference to its owner).
// The owner waits for it at most until a deadline of its choosing; when the
// work is late the owner abandons it, and the thread finishes on its own (or
// dies with the process) without touching the owner again. This is the only
// place in the project that detaches a thread (scripts/lint keeps detach() and
// raw std::thread out of agent/src, rendezvous/src and worker_lib/src).
//
// BackgroundCall runs one call; BackgroundWorker runs a periodic tick and
// posted tasks, in order, on one thread.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <thread>

#include "ddp/common/time.h"

namespace ddp {

// One call on a thread of its own.
// Thread-safety: the object is used by one owner thread; the call runs on its own.
class BackgroundCall {
 public:
  // Starts `call` at once, on a thread `runtime` starts (it must outlive the
  // call). `call` must own all it touches (see above). An exception escaping
  // it is kept for error().
  explicit BackgroundCall(std::function<void()> call, const Runtime& runtime = real_runtime());
  // Joins a call that returned; abandons one still running. Never blocks.
  ~BackgroundCall();
  BackgroundCall(const BackgroundCall&) = delete;
  BackgroundCall& operator=(const BackgroundCall&) = delete;

  // Block until the call returned or `deadline` passed (real time), or for at
  // most `wait`; true when it returned.
  bool wait_until(Clock::time_point deadline);
  bool wait_for(Duration wait);
  // Blocks until the call returned, however long that takes.
  void wait();
  // Whether the call returned; never blocks.
  bool finished() const;
  // What escaped the call once it returned; null when nothing did or it has not returned.
  std::exception_ptr error() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

// A thread that runs `tick` now and then every `period` (counted from the end
// of the previous tick), and tasks posted to it, each before the next tick.
// An exception escaping `tick` ends the worker (no more ticks or tasks); tasks
// are best effort: what escapes one is dropped and the worker goes on.
// Thread-safety: post, set_period and stop may be called from any thread.
class BackgroundWorker {
 public:
  using Task = std::function<void()>;

  // Starts the thread (through `runtime`, which must outlive it). `tick` and
  // every task must own all they touch; they run on the worker's thread only,
  // one at a time. The period is real time.
  BackgroundWorker(Duration period, Task tick, const Runtime& runtime = real_runtime());
  // stop(0): never blocks for a tick in progress.
  ~BackgroundWorker();
  BackgroundWorker(const BackgroundWorker&) = delete;
  BackgroundWorker& operator=(const BackgroundWorker&) = delete;

  void post(Task task);
  // Takes effect after the next tick.
  void set_period(Duration period);
  // Stops ticking, runs the tasks already posted and then `last` (if given;
  // no tick runs after it), and ends the thread. Waits at most `wait` (real
  // time) for that; a worker still busy then is abandoned. True when it ended
  // in time. Later calls return the first one's answer at once.
  bool stop(Duration wait, Task last = {});

 private:
  struct State;
  static void run(State& state);

  std::shared_ptr<State> state_;
  std::thread thread_;
  bool ended_in_time_ = false;
};

}  // namespace ddp
