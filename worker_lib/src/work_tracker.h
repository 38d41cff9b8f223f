// Device-independent bookkeeping of the NCCL backend (and anything else whose
// operations complete asynchronously on a device): outstanding Works in issue
// order, each with a "has it finished?" query, polled by a watchdog thread that
// turns timeouts and asynchronous backend errors into failed Works.
//
// Separated from CUDA so that CPU tests drive it with fake queries.
// Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "arrival_tracker.h"
#include "joined_thread.h"
#include "work_impl.h"

namespace ddp::detail {

class WorkTracker {
 public:
  using Clock = std::chrono::steady_clock;
  // Returns true once the operation finished; throws to report its failure.
  using Query = std::function<bool()>;

  struct Hooks {
    // An asynchronous backend error (e.g. ncclCommGetAsyncError), or nullopt.
    std::function<std::optional<std::string>()> async_error;
    // Aborts the backend (e.g. ncclCommAbort); called once, from the watchdog.
    std::function<void()> abort;
    // A collective completed (its sequence number), in issue order, from the
    // thread that polled it; optional.
    std::function<void(std::uint64_t)> completed;
  };

  // `arrivals` (optional) names the ranks missing from a timed-out collective.
  WorkTracker(std::string origin, std::chrono::milliseconds timeout,
              std::shared_ptr<ArrivalTracker> arrivals, Hooks hooks);
  ~WorkTracker();  // stops the watchdog if started
  WorkTracker(const WorkTracker&) = delete;
  WorkTracker& operator=(const WorkTracker&) = delete;

  // Registers an issued operation. `collective_seq` is its collective sequence
  // number (nullopt for point-to-point). Throws the group's failure when broken.
  void add(std::shared_ptr<WorkImpl> work, std::optional<std::uint64_t> collective_seq, Query query,
           Clock::time_point issued = Clock::now());

  // One watchdog step at time `now`: completes finished Works (in order; a
  // later one that finished before an earlier one waits for it, keeping
  // completion in issue order), and on a timeout or async error aborts the
  // backend and fails every outstanding Work. Returns the failure message, if any.
  std::optional<std::string> poll(Clock::time_point now = Clock::now());

  // Starts a thread calling poll() every `interval` until destruction.
  void start_watchdog(std::chrono::milliseconds interval);

  // Throws the failure (BackendError) that broke the group, if any.
  void throw_if_broken() const;
  bool broken() const;
  std::size_t outstanding() const;

 private:
  struct Entry {
    std::shared_ptr<WorkImpl> work;
    std::optional<std::uint64_t> seq;
    Query query;
    Clock::time_point issued;
  };
  void fail_all_locked(std::exception_ptr first, std::exception_ptr rest);
  // Marks the group broken by `message`, aborts the backend (with the lock
  // released) and fails every outstanding Work with BackendError. Returns message.
  std::string break_locked(std::unique_lock<std::mutex>& lock, std::string message);

  const std::string origin_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<ArrivalTracker> arrivals_;
  Hooks hooks_;
  mutable std::mutex mutex_;
  std::deque<Entry> entries_;
  std::string broken_;
  bool stop_ = false;
  std::condition_variable stop_cv_;
  JoinedThread watchdog_;  // none until start_watchdog()
};

// The NCCL unique-id handshake: rank 0 calls `generate` and publishes the bytes
// under `key`; the others wait for them (at most `timeout`; TimeoutError naming
// the key and rank 0 otherwise).
std::string exchange_unique_id(Store& store, int rank, const std::function<std::string()>& generate,
                               std::chrono::milliseconds timeout,
                               const std::string& key = "nccl/unique_id");

}  // namespace ddp::detail
