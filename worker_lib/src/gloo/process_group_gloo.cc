#include "gloo/process_group_gloo.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>  // needs gloo/common/memory.h, see src/gloo_compat/
#include <gloo/transport/tcp/unbound_buffer.h>
#include <spdlog/spdlog.h>

#include "ddp/common/env.h"
#include "ddp/common/error.h"
#include "ddp/common/time.h"
#include "ddp/store/prefix_store.h"
#include "ddp/store/store.h"
#include "gloo/exchange_ops.h"
#include "gloo/gloo_store.h"
#include "reduce_functions.h"

namespace ddp {

const char* to_string(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kAuto:
      return "auto";
    case AllreduceAlgorithm::kRing:
      return "ring";
    case AllreduceAlgorithm::kBcube:
      return "bcube";
    case AllreduceAlgorithm::kDirect:
      return "direct";
    case AllreduceAlgorithm::kSharedMemory:
      return "shm";
    case AllreduceAlgorithm::kHierarchical:
      return "hierarchical";
  }
  return "unknown";
}

std::shared_ptr<ProcessGroup> make_gloo_process_group(std::shared_ptr<Store> store, int rank,
                                                      int size, GlooOptions options) {
  return std::make_shared<detail::ProcessGroupGloo>(std::move(store), rank, size,
                                                    std::move(options));
}

AllreduceAlgorithm last_allreduce_algorithm(const ProcessGroup& group) {
  const auto* gloo = dynamic_cast<const detail::ProcessGroupGloo*>(&group);
  if (gloo == nullptr) {
    throw InvalidArgument("last_allreduce_algorithm",
                          fmt::format("a {} group, not a Gloo group", group.backend_name()));
  }
  return gloo->last_allreduce_algorithm();
}

namespace detail {

namespace {

// Slots of our own point-to-point traffic; Gloo's algorithms use prefixes 0x01-0x08.
constexpr std::uint64_t kDirectSlotPrefix = 0xd1ull << 56;
constexpr std::uint64_t kP2pSlotPrefix = 0xd2ull << 56;
constexpr std::uint64_t kAlltoallSlotPrefix = 0xd3ull << 56;
constexpr std::uint64_t kHierarchicalSlotPrefix = 0xd4ull << 56;
// How often the watcher looks for a connection that a peer reset.
constexpr auto kWatchInterval = std::chrono::milliseconds(100);

// The shared-memory segment's options for a group with these options: the
// group-wide one, or a host's own in the hierarchical all-reduce.
ShmAllreduce::Options shm_options_of(const GlooOptions& options, bool enabled,
                                     std::string group_name) {
  ShmAllreduce::Options shm;
  shm.enabled = enabled;
  shm.slot_bytes = options.shm_slot_bytes;
  shm.timeout = options.timeout;
  shm.group_name = std::move(group_name);
  return shm;
}

namespace tcp = gloo::transport::tcp;

// Gloo (2022-05) has no public way to fail a pair and wake what waits on it:
// tcp::Pair::signalException (what Gloo itself calls when a socket fails, or on
// every pair when an application timeout expires) is protected, and
// Context::closeConnections() closes the sockets without waking any waiter.
// These accessors reach the protected members legally, through member pointers
// formed in a derived class (no object of which is ever made).
using BufferRef = gloo::NonOwningPtr<tcp::UnboundBuffer>;  // keeps a buffer from being destroyed

// Under ThreadSanitizer, hides this thread's memory accesses (not its
// synchronization) while alive. Used for the last touches of Gloo buffers that
// another thread may destroy as soon as it wakes: releasing their locks and our
// references to them. Gloo orders those before the destruction (a buffer's
// destructor spins until no reference is left), but the spin is in
// uninstrumented libgloo, so ThreadSanitizer cannot see it and would report them.
#if defined(__SANITIZE_THREAD__)
#define DDP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DDP_TSAN 1
#endif
#endif
#ifdef DDP_TSAN
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
struct TsanIgnoreAccesses {
  TsanIgnoreAccesses() { __tsan_ignore_thread_begin(); }
  ~TsanIgnoreAccesses() { __tsan_ignore_thread_end(); }
  TsanIgnoreAccesses(const TsanIgnoreAccesses&) = delete;
  TsanIgnoreAccesses& operator=(const TsanIgnoreAccesses&) = delete;
};
#else
struct TsanIgnoreAccesses {};
#endif

struct BufferAccess : tcp::UnboundBuffer {
  // Sets `error` on every buffer (one set already keeps its own) and wakes its
  // waiters, holding the locks of all of them until every one is set and
  // notified: a waiter wakes only once its buffer's lock is released, after all
  // of that. The caller keeps a BufferRef to each. `buffers` is sorted and
  // without duplicates; one caller at a time.
  static void signal_all(const std::vector<tcp::UnboundBuffer*>& buffers,
                         const std::exception_ptr& error) {
    std::vector<std::unique_lock<std::mutex>> locks;
    locks.reserve(buffers.size());
    for (auto* buffer : buffers) locks.emplace_back(buffer->*(&BufferAccess::m_));
    for (auto* buffer : buffers) {
      auto& failed = buffer->*(&BufferAccess::ex_);
      if (failed == nullptr) failed = error;
      (buffer->*(&BufferAccess::recvCv_)).notify_all();
      (buffer->*(&BufferAccess::sendCv_)).notify_all();
    }
    // From the first release on, a woken owner may destroy any of them (once the
    // caller's BufferRefs are gone): see TsanIgnoreAccesses.
    [[maybe_unused]] TsanIgnoreAccesses ignore;
    locks.clear();
  }
};

struct PairAccess : tcp::Pair {
  static std::mutex& mutex(tcp::Pair& pair) { return pair.*(&PairAccess::m_); }

  // The pair's failure, or nullptr while it works. With the pair's lock held.
  static const std::exception_ptr& failure(tcp::Pair& pair) { return pair.*(&PairAccess::ex_); }

  // Appends the buffers with an operation pending on the pair: posted sends and
  // receives, and (which Gloo's signalException misses) a receive whose payload
  // is being read and sends still queued for writing. With the pair's lock held.
  static void pending(tcp::Pair& pair, std::vector<BufferRef>& out) {
    for (auto* ops :
         {&(pair.*(&PairAccess::localPendingSend_)), &(pair.*(&PairAccess::localPendingRecv_))}) {
      for (const auto& [slot, queue] : *ops) {
        for (const auto& op : queue) out.emplace_back(std::get<0>(op));
      }
    }
    out.emplace_back((pair.*(&PairAccess::rx_)).ubuf);
    for (const auto& op : pair.*(&PairAccess::tx_)) out.emplace_back(op.ubuf);
  }

  // Marks the pair failed with `error` (every later operation on it throws it)
  // and closes its socket, with a TCP reset when `reset`; waits for a tick of
  // Gloo's event loop. Unlike signalException, wakes no buffer. With the pair's
  // lock held (the event loop skips a locked pair, so it never sees the pair
  // failed but not yet closed).
  static void fail_and_close(tcp::Pair& pair, const std::exception_ptr& error, bool reset) {
    const int fd = pair.*(&PairAccess::fd_);
    if (reset && fd >= 0) {
      linger hard{};
      hard.l_onoff = 1;
      hard.l_linger = 0;
      ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
    }
    pair.*(&PairAccess::ex_) = error;
    (pair.*(&PairAccess::cv_)).notify_all();
    auto change_state = &PairAccess::changeState;
    (pair.*change_state)(CLOSED);
  }
};

// The context's TCP pairs (Gloo's tcp::Pair), all but its own rank's slot.
std::vector<tcp::Pair*> tcp_pairs(gloo::Context& context) {
  std::vector<tcp::Pair*> out;
  for (int peer = 0; peer < context.size; ++peer) {
    auto& pair = context.getPair(peer);
    if (peer != context.rank && pair) out.push_back(&static_cast<tcp::Pair&>(*pair));
  }
  return out;
}

// Gloo's templated options only use sizeof(T): pick an unsigned type of the element size.
template <typename F>
void with_element_type(DType dtype, F&& f) {
  switch (element_size(dtype)) {
    case 1:
      return f(std::uint8_t{});
    case 2:
      return f(std::uint16_t{});
    case 4:
      return f(std::uint32_t{});
    default:
      return f(std::uint64_t{});
  }
}

bool debug_detail_from_env() {
  auto value = env::get("DDP_DEBUG");
  if (!value) return false;
  std::string v = *value;
  for (auto& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return v == "DETAIL";
}

// InvalidArgument (origin ProcessGroupGloo::`what`) unless `buffer` is a valid CPU buffer.
void check_cpu(const Buffer& buffer, const char* what) {
  if (buffer.device.is_cuda()) {
    throw InvalidArgument(
        fmt::format("ProcessGroupGloo::{}", what),
        fmt::format("buffer is on {}; the Gloo backend takes CPU buffers", buffer.device.str()));
  }
  if (buffer.data == nullptr && buffer.count > 0) {
    throw InvalidArgument(fmt::format("ProcessGroupGloo::{}", what), "buffer data is null");
  }
  (void)element_size(buffer.dtype);  // throws for an unknown dtype
}

// Whether `error` says the group's round ended (GroupChanged).
bool is_group_changed(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const GroupChanged&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

ProcessGroupGloo::ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size,
                                   GlooOptions options)
    : ProcessGroupBase("ProcessGroupGloo", std::move(store), rank, size, std::move(options)) {
  const char* origin = "ProcessGroupGloo";
  if (!ShmAllreduce::valid_slot_bytes(options_.shm_slot_bytes)) {
    throw InvalidArgument(origin,
                          fmt::format("shm_slot_bytes {} must be a multiple of 64, at least 4096",
                                      options_.shm_slot_bytes));
  }
  if (options_.max_segment_bytes < 1024) {
    throw InvalidArgument(
        origin, fmt::format("max_segment_bytes {} must be >= 1024", options_.max_segment_bytes));
  }
  debug_detail_ = options_.debug_detail.value_or(debug_detail_from_env());
  // Settings are checked before any connection: a rank that refuses its own
  // must not leave its peers with a half-connected mesh.
  const bool want_shm = options_.shared_memory ? *options_.shared_memory
                                               : !env::get_bool("DDP_SHM_DISABLE").value_or(false);
  if (options_.allreduce_algorithm == AllreduceAlgorithm::kSharedMemory && !want_shm) {
    throw InvalidArgument(origin, options_.shared_memory
                                      ? "allreduce_algorithm shm needs shared_memory on"
                                      : "allreduce_algorithm shm, but DDP_SHM_DISABLE is set");
  }
  const bool want_hierarchical = options_.hierarchical
                                     ? *options_.hierarchical
                                     : env::get_bool("DDP_HIERARCHICAL_ALLREDUCE").value_or(true);
  if (options_.allreduce_algorithm == AllreduceAlgorithm::kHierarchical &&
      !(want_hierarchical && want_shm)) {
    throw InvalidArgument(origin,
                          "allreduce_algorithm hierarchical needs shared_memory and hierarchical "
                          "on (DDP_SHM_DISABLE, DDP_HIERARCHICAL_ALLREDUCE)");
  }
  if (options_.hierarchical_chunk_bytes < 4096) {
    throw InvalidArgument(origin, fmt::format("hierarchical_chunk_bytes {} must be >= 4096",
                                              options_.hierarchical_chunk_bytes));
  }
  std::string host_id = options_.host_id;
  if (host_id.empty()) host_id = env::get("DDP_HOST_ID").value_or("");
  if (host_id.empty()) host_id = this_host_id();
  check_host_id(host_id);

  try {
    gloo::transport::tcp::attr attr;
    if (!options_.iface.empty()) {
      attr.iface = options_.iface;
    } else {
      attr.hostname = options_.hostname;
    }
    device_ = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(options_.timeout);
    GlooStore gloo_store(store_, options_.timeout);
    context->connectFullMesh(gloo_store, device_);
    context_ = std::move(context);
  } catch (const ddp::Error&) {
    throw;
  } catch (const gloo::IoException& e) {
    throw NetworkError(origin,
                       fmt::format("group '{}' rank {}/{}: connecting the full mesh failed: {}",
                                   options_.name, rank, size, e.what()));
  } catch (const std::exception& e) {
    throw BackendError(origin, fmt::format("group '{}' rank {}/{}: setting up Gloo failed: {}",
                                           options_.name, rank, size, e.what()));
  }
  // Every rank takes part in the shared-memory setup, even with it off, so that
  // ranks configured differently fall back together instead of waiting.
  std::string why_no_shm = "a group of one rank";
  std::string why_not_hierarchical = "a group of one rank";
  if (size > 1) {
    plan_ = plan_hosts(*store_, rank, size, host_id, want_hierarchical, want_shm, options_.timeout);
    why_not_hierarchical = setup_hierarchy(want_shm);
    hierarchical_ = why_not_hierarchical.empty();
  }
  if (size > 1 && plan_.hosts > 1) {
    why_no_shm = fmt::format("the ranks are on {} hosts", plan_.hosts);
  } else if (size > 1) {
    shm_ = ShmAllreduce::create(*store_, rank, size,
                                shm_options_of(options_, want_shm, options_.name), &why_no_shm);
  }
  if (options_.allreduce_algorithm == AllreduceAlgorithm::kSharedMemory) {
    if (!shm_ && size > 1) {
      throw BackendError(origin,
                         fmt::format("group '{}' rank {}/{}: allreduce_algorithm shm, but the "
                                     "ranks cannot share memory ({})",
                                     options_.name, rank, size, why_no_shm));
    }
  }
  if (options_.allreduce_algorithm == AllreduceAlgorithm::kHierarchical && !hierarchical_) {
    throw BackendError(origin, fmt::format("group '{}' rank {}/{}: allreduce_algorithm "
                                           "hierarchical, but it does not apply ({})",
                                           options_.name, rank, size, why_not_hierarchical));
  }
  start_tracking();
  worker_ = JoinedThread([this] { worker_loop(); });
  p2p_worker_ = JoinedThread([this] { p2p_loop(); });
  if (size > 1) watcher_ = JoinedThread([this] { watch_loop(); });
  spdlog::debug(
      "ProcessGroupGloo '{}': rank {}/{} connected ({}, shared memory {}, debug_detail={})",
      options_.name, rank, size, device_->str(), shm_ ? shm_->segment_name() : "off",
      debug_detail_);
}

ProcessGroupGloo::~ProcessGroupGloo() {
  std::deque<Task> dropped;
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    dropped.swap(queue_);
    queued_.store(0);
  }
  cv_.notify_all();
  for (auto& task : dropped) {
    task.work->fail(std::make_exception_ptr(ShutdownError(
        "ProcessGroupGloo", fmt::format("{} #{} cancelled: the group was destroyed",
                                        task.work->op(), task.work->sequence_number()))));
  }
  worker_.join();
  // The watcher stays until the collective in flight is over (it fails it when a
  // peer reset its connection), and goes before the pending sends/receives are
  // dropped (it may be waking their buffers).
  {
    std::lock_guard lock(watch_mutex_);
    watch_stop_ = true;
  }
  watch_cv_.notify_all();
  watcher_.join();  // none for a group of one rank
  std::deque<PendingP2p> unfinished;
  {
    std::lock_guard lock(p2p_mutex_);
    p2p_stop_ = true;
    unfinished.swap(p2p_queue_);
    wake_p2p_wait();  // it then fails its Work with ShutdownError
  }
  p2p_cv_.notify_all();
  p2p_worker_.join();
  for (auto& pending : unfinished) {
    pending.buffer.reset();  // before the Work completes, as in p2p_loop
    pending.work->fail(std::make_exception_ptr(ShutdownError(
        "ProcessGroupGloo", fmt::format("{} #{} cancelled: the group was destroyed",
                                        pending.work->op(), pending.work->sequence_number()))));
  }
  arrivals_.reset();
  context_.reset();
  device_.reset();
}

void ProcessGroupGloo::wake_p2p_wait() {
  if (p2p_current_ == nullptr) return;
  if (p2p_current_is_send_) {
    p2p_current_->abortWaitSend();
  } else {
    p2p_current_->abortWaitRecv();
  }
}

// ---- abort ------------------------------------------------------------------

void ProcessGroupGloo::abort(const std::string& reason) {
  std::lock_guard abort_lock(abort_mutex_);
  std::deque<Task> dropped;
  {
    std::lock_guard lock(mutex_);
    if (!abort_->set(reason)) return;
    dropped.swap(queue_);
    queued_.store(0, std::memory_order_release);
  }
  // Asked for (the round ended, or the program aborted the group): info.
  spdlog::info("ProcessGroupGloo '{}': rank {}/{} aborted: {}", options_.name, rank(), size(),
               reason);
  // Wake the collective in flight wherever it waits: in the shared-memory
  // all-reduce, or on a connection (which also fails the peers' operations that
  // wait on this rank, and their watchers then fail their whole group).
  if (shm_) shm_->abort();
  if (local_shm_) local_shm_->abort();
  if (size() > 1) {
    fail_connections(
        fmt::format("group '{}' rank {}: the group was aborted: {}", options_.name, rank(), reason),
        /*reset=*/true);
  }
  // Posted sends/receives fail now (their buffers go first, so no transfer
  // writes into them afterwards); the one being waited on was woken above (or
  // is now) and p2p_loop fails it.
  std::deque<PendingP2p> unfinished;
  {
    std::lock_guard lock(p2p_mutex_);
    unfinished.swap(p2p_queue_);
    wake_p2p_wait();
  }
  for (auto& task : dropped) {
    task.work->fail(abort_->error(task.work->op(), task.work->sequence_number()));
  }
  for (auto& pending : unfinished) {
    pending.buffer.reset();
    pending.work->fail(abort_->error(pending.work->op(), pending.work->sequence_number()));
  }
}

void ProcessGroupGloo::complete_unless_aborted(const std::shared_ptr<WorkImpl>& work) {
  {
    // Under the lock that abort() sets abort_ under: a Work either completed
    // before the abort began or fails, never completes once abort() returned.
    std::lock_guard lock(mutex_);
    if (!abort_->is_set()) {
      work->complete();
      return;
    }
  }
  work->fail(abort_->error(work->op(), work->sequence_number()));
}

void ProcessGroupGloo::fail_connections(const std::string& message, bool reset) {
  std::lock_guard fail_lock(fail_mutex_);  // abort() and the watcher: one at a time
  auto error = std::make_exception_ptr(gloo::IoException(message));
  // Every pair locked at once: no operation can be posted meanwhile, and Gloo's
  // event loop leaves them alone (it skips a locked pair).
  const auto all = tcp_pairs(*context_);
  std::vector<std::unique_lock<std::mutex>> locks;
  std::vector<tcp::Pair*> failing;  // those still working; the others Gloo failed itself
  std::vector<BufferRef> refs;
  locks.reserve(all.size());
  for (auto* pair : all) {
    locks.emplace_back(PairAccess::mutex(*pair));
    if (PairAccess::failure(*pair) != nullptr) {
      locks.back().unlock();
      continue;
    }
    PairAccess::pending(*pair, refs);
    failing.push_back(pair);
  }
  if (failing.empty()) return;
  // Wake every operation pending on them, all at once.
  std::vector<tcp::UnboundBuffer*> buffers;
  for (const auto& ref : refs) {
    if (ref) buffers.push_back(ref.operator->());
  }
  std::sort(buffers.begin(), buffers.end());
  buffers.erase(std::unique(buffers.begin(), buffers.end()), buffers.end());
  BufferAccess::signal_all(buffers, error);
  {
    [[maybe_unused]] TsanIgnoreAccesses ignore;
    refs.clear();
  }
  // Then close them, one tick of Gloo's event loop each (up to 10 ms), each
  // released once closed. The pairs keep `error` until the context goes, so the
  // exception object outlives every thread that reads it.
  for (std::size_t i = 0, f = 0; i < all.size() && f < failing.size(); ++i) {
    if (all[i] != failing[f]) continue;
    PairAccess::fail_and_close(*all[i], error, reset);
    locks[i].unlock();
    ++f;
  }
}

void ProcessGroupGloo::watch_loop() {
  std::vector<char> inspected(static_cast<std::size_t>(size()), 0);
  std::unique_lock lock(watch_mutex_);
  while (!watch_cv_.wait_for(lock, kWatchInterval, [&] { return watch_stop_; })) {
    lock.unlock();
    const bool done = check_connections(inspected);
    lock.lock();
    if (done) {  // nothing more to watch
      watch_cv_.wait(lock, [&] { return watch_stop_; });
      return;
    }
  }
}

bool ProcessGroupGloo::check_connections(std::vector<char>& inspected) {
  if (abort_->is_set()) return true;  // every connection is closed already
  // A peer that aborts its group (or dies with unread data) resets its
  // connections; one that destroys its group in order closes them gracefully, and
  // its connection fails only the operations that use it, as Gloo does by itself.
  static const std::string kReset = std::strerror(ECONNRESET);
  for (int peer = 0; peer < size(); ++peer) {
    auto& seen = inspected[static_cast<std::size_t>(peer)];
    if (peer == rank() || seen) continue;
    auto& pair = context_->getPair(peer);
    if (!pair) continue;
    std::exception_ptr error;
    {
      auto& tcp_pair = static_cast<tcp::Pair&>(*pair);
      std::lock_guard lock(PairAccess::mutex(tcp_pair));
      error = PairAccess::failure(tcp_pair);
    }
    if (error == nullptr) continue;
    seen = 1;
    const std::string what = what_of(error);
    if (what.find(kReset) == std::string::npos) continue;
    auto message = fmt::format(
        "group '{}' rank {}: the connection to rank {} was reset (it aborted the group or its "
        "process died): {}",
        options_.name, rank(), peer, what);
    spdlog::warn("ProcessGroupGloo {}; failing the group", message);
    // With a reset too, so that the ranks that wait on this one fail as well.
    fail_connections(message, /*reset=*/true);
    return true;
  }
  return false;
}

WorkPtr ProcessGroupGloo::enqueue_collective(CollectiveDescriptor desc,
                                             std::function<void(std::uint32_t)> run) {
  std::shared_ptr<WorkImpl> work;
  {
    std::lock_guard lock(mutex_);
    if (stop_) throw ShutdownError("ProcessGroupGloo", "the group is being destroyed");
    if (abort_->is_set()) return failed_work(next_seq_++, to_string(desc.op));
    desc.seq = next_seq_++;
    work = std::make_shared<WorkImpl>(desc.seq, to_string(desc.op),
                                      options_.timeout + std::chrono::seconds(10));
    progress_.issued(desc.seq, progress_kind(desc.op), desc.count * element_size(desc.dtype));
    queue_.push_back(Task{
        work, desc,
        [run = std::move(run)](std::uint32_t tag, const std::shared_ptr<WorkImpl>&) { run(tag); }});
    queued_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_one();
  return work;
}

WorkPtr ProcessGroupGloo::enqueue_p2p(const char* op, Buffer buffer, bool is_send, int peer,
                                      int tag) {
  std::shared_ptr<WorkImpl> work;
  {
    std::lock_guard lock(mutex_);
    if (stop_) throw ShutdownError("ProcessGroupGloo", "the group is being destroyed");
    if (abort_->is_set()) return failed_work(next_p2p_seq_++, op);
    const auto wait_bound = options_.timeout + std::chrono::seconds(10);
    if (peer < 0) {
      work = std::make_shared<RecvAnyWork>(next_p2p_seq_++, op, wait_bound);
    } else {
      work = std::make_shared<WorkImpl>(next_p2p_seq_++, op, wait_bound);
    }
    // Posted on the worker thread, in issue order with the collectives; completed by p2p_loop.
    auto post = [this, buffer, is_send, peer, tag](std::uint32_t,
                                                   const std::shared_ptr<WorkImpl>& posted) {
      auto ub = context_->createUnboundBuffer(buffer.data, buffer.nbytes());
      const std::uint64_t slot = kP2pSlotPrefix | static_cast<std::uint32_t>(tag);
      if (is_send) {
        ub->send(peer, slot);
      } else if (peer >= 0) {
        ub->recv(peer, slot);
      } else {
        std::vector<int> sources;
        for (int r = 0; r < size(); ++r) {
          if (r != rank()) sources.push_back(r);
        }
        ub->recv(sources, slot);
      }
      {
        std::lock_guard p2p_lock(p2p_mutex_);
        p2p_queue_.push_back(PendingP2p{posted, std::move(ub), is_send, peer, tag});
      }
      p2p_cv_.notify_one();
    };
    queue_.push_back(Task{work, std::nullopt, std::move(post)});
    queued_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_one();
  return work;
}

void ProcessGroupGloo::worker_loop() {
  while (true) {
    Task task;
    {
      std::unique_lock lock(mutex_);
      if (queue_.empty() && !stop_) {
        // A training loop issues the next collective right after the previous
        // one: look for it briefly before sleeping (saves a wake-up per op).
        lock.unlock();
        const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
        while (std::chrono::steady_clock::now() < spin_until) {
          std::this_thread::yield();
          if (queued_.load(std::memory_order_acquire) > 0) break;
        }
        lock.lock();
      }
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_release);
    }
    run_task(task);
  }
}

void ProcessGroupGloo::run_task(Task& task) {
  const auto seq = task.work->sequence_number();
  const std::string origin = fmt::format("ProcessGroupGloo::{}", task.work->op());
  if (abort_->is_set()) {  // normally failed by abort() already; this one raced with it
    task.work->fail(abort_->error(task.work->op(), seq));
    return;
  }
  if (broken_) {
    task.work->fail(std::make_exception_ptr(BackendError(
        origin, fmt::format("group '{}': {} #{} not run: the group failed earlier ({})",
                            options_.name, task.work->op(), seq, broken_what_))));
    return;
  }
  if (!task.collective) {  // send/recv: posted here in issue order, completed by p2p_loop
    try {
      task.run(0, task.work);
    } catch (const ddp::Error&) {
      task.work->fail(abort_->is_set() ? abort_->error(task.work->op(), seq)
                                       : std::current_exception());
    } catch (const std::exception& e) {
      task.work->fail(abort_->is_set() ? abort_->error(task.work->op(), seq)
                                       : std::make_exception_ptr(BackendError(origin, e.what())));
    }
    return;
  }
  const auto& desc = *task.collective;
  arrivals_->entered(seq);
  // Tags: 2*seq for the DETAIL check, 2*seq+1 for the collective (unique while in flight).
  try {
    if (debug_detail_) check_consistency(desc);
    task.run(static_cast<std::uint32_t>(2 * seq + 1), task.work);
    progress_.completed(seq);
    complete_unless_aborted(task.work);
  } catch (const InvalidArgument&) {
    // A DETAIL mismatch, or all-to-all counts that disagree: every rank saw the
    // same descriptors (counts) and skipped the collective, so the group stays
    // consistent and usable.
    progress_.completed(seq);
    task.work->fail(std::current_exception());
  } catch (const std::exception& e) {
    if (abort_->is_set()) {
      // Woken by abort(): no diagnosis (the ranks that did not arrive do not
      // matter), and the group is over anyway.
      task.work->fail(abort_->error(task.work->op(), seq));
      return;
    }
    // Our own errors other than timeouts and broken connections (which get the
    // collective's diagnosis) pass through as they are: the exception object
    // itself, so that callers can catch the specific subclass (a copy through
    // the ddp::Error base would slice it into a plain ddp::Error).
    auto* own = dynamic_cast<const ddp::Error*>(&e);
    auto error =
        own != nullptr && own->kind() != ErrorKind::kTimeout && own->kind() != ErrorKind::kNetwork
            ? std::current_exception()
            : translate(e, desc);
    if (options_.on_failure) error = options_.on_failure(error);
    broken_what_ = what_of(error);
    broken_ = error;
    if (is_group_changed(error)) {
      // The round ended (in-place recovery): expected, and said by abort().
      spdlog::debug("{}", broken_what_);
    } else {
      spdlog::error("{}", broken_what_);
    }
    task.work->fail(error);
  }
}

void ProcessGroupGloo::check_consistency(const CollectiveDescriptor& desc) {
  const auto n = static_cast<std::size_t>(size());
  auto mine = desc.encode();
  constexpr std::size_t kSize = CollectiveDescriptor::kEncodedSize;
  std::vector<std::uint8_t> all(n * kSize);
  if (shm_) {
    // On one host, an all-gather through the shared-memory segment: a sum of
    // bytes in which each rank fills only its own slot (zeros elsewhere) leaves
    // every descriptor as it is, at a few microseconds where Gloo's TCP
    // all-gather takes hundreds.
    std::memcpy(all.data() + static_cast<std::size_t>(rank()) * kSize, mine.data(), kSize);
    shm_->allreduce(all.data(), all.size(), DType::kUInt8,
                    reduce_function(DType::kUInt8, ReduceOp::kSum), 1, Deadline(options_.timeout));
  } else {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(mine.data(), mine.size());
    opts.setOutput(all.data(), all.size());
    opts.setTag(static_cast<std::uint32_t>(2 * desc.seq));
    opts.setTimeout(options_.timeout);
    gloo::allgather(opts);
  }
  std::vector<CollectiveDescriptor> per_rank;
  for (std::size_t r = 0; r < n; ++r) {
    per_rank.push_back(CollectiveDescriptor::decode(all.data() + r * kSize));
  }
  auto mismatch = find_mismatch(per_rank);
  if (!mismatch.empty()) {
    throw InvalidArgument(fmt::format("ProcessGroupGloo::{}", to_string(desc.op)),
                          fmt::format("group '{}' collective #{} (checked across the ranks): {}",
                                      options_.name, desc.seq, mismatch));
  }
}

std::exception_ptr ProcessGroupGloo::translate(const std::exception& error,
                                               const CollectiveDescriptor& desc) {
  const std::string origin = fmt::format("ProcessGroupGloo::{}", to_string(desc.op));
  std::string what = error.what();
  const bool timed_out = what.find("imed out") != std::string::npos ||
                         dynamic_cast<const TimeoutError*>(&error) != nullptr;
  // Give the other ranks' progress publisher a moment, then ask who never entered.
  auto settle =
      std::min<std::chrono::milliseconds>(std::chrono::milliseconds(500), options_.timeout / 2);
  auto missing = arrivals_->missing(desc.seq, settle);
  auto message = fmt::format(
      "group '{}' rank {}/{}: {} (collective seq {}) {}; ranks that did not arrive: [{}]; backend: "
      "{}",
      options_.name, rank(), size(), desc.describe(), desc.seq,
      timed_out ? fmt::format("timed out after {} ms", options_.timeout.count())
                : std::string("failed"),
      fmt::join(missing, ", "), what);
  if (timed_out) return std::make_exception_ptr(TimeoutError(origin, message));
  if (dynamic_cast<const gloo::IoException*>(&error) || dynamic_cast<const NetworkError*>(&error)) {
    return std::make_exception_ptr(NetworkError(origin, message));
  }
  return std::make_exception_ptr(BackendError(origin, message));
}

// ---- collectives -------------------------------------------------------------

WorkPtr ProcessGroupGloo::allreduce(Buffer buffer, ReduceOp op) {
  check_cpu(buffer, "allreduce");
  auto fn = reduce_function(buffer.dtype, op);  // validates op
  CollectiveDescriptor desc{CollectiveOp::kAllreduce, buffer.dtype, op, -1, 0, buffer.count};
  return enqueue_collective(desc, [this, buffer, op, fn](std::uint32_t tag) {
    allreduce_in_place(buffer.data, buffer.count, buffer.dtype, op, fn, tag);
  });
}

void ProcessGroupGloo::allreduce_in_place(void* data, std::size_t count, DType dtype, ReduceOp op,
                                          ReduceFn fn, std::uint32_t tag) {
  if (size() == 1) return;
  const std::size_t nbytes = count * element_size(dtype);
  auto algorithm = options_.allreduce_algorithm;
  if (algorithm == AllreduceAlgorithm::kAuto) {
    // Direct while what each rank sends (bytes x (size - 1)) is small enough.
    const bool direct = nbytes * static_cast<std::size_t>(size() - 1) <= options_.direct_max_bytes;
    algorithm = shm_            ? AllreduceAlgorithm::kSharedMemory
                : hierarchical_ ? AllreduceAlgorithm::kHierarchical
                : direct        ? AllreduceAlgorithm::kDirect
                                : AllreduceAlgorithm::kRing;
  }
  last_algorithm_.store(algorithm, std::memory_order_release);
  if (count == 0) return;
  if (algorithm == AllreduceAlgorithm::kSharedMemory) {
    // The average is taken inside, on each rank's share of the buffer.
    shm_->allreduce(data, count, dtype, fn, op == ReduceOp::kAvg ? size() : 1,
                    Deadline(options_.timeout));
    return;
  }
  if (algorithm == AllreduceAlgorithm::kHierarchical) {
    try {
      allreduce_hierarchical(data, count, dtype, fn, tag);
    } catch (...) {
      // The group is broken now; this host's ranks waiting on this one in shared
      // memory fail at once instead of after the timeout.
      if (local_shm_) local_shm_->abort();
      throw;
    }
  } else if (algorithm == AllreduceAlgorithm::kDirect) {
    allreduce_direct(data, count, dtype, op, tag);
  } else {
    gloo::AllreduceOptions opts(context_);
    with_element_type(dtype, [&](auto t) {
      using T = decltype(t);
      opts.setOutput<T>(context_->createUnboundBuffer(data, nbytes));
    });
    opts.setAlgorithm(algorithm == AllreduceAlgorithm::kBcube
                          ? gloo::AllreduceOptions::Algorithm::BCUBE
                          : gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(fn);
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    opts.setMaxSegmentSize(options_.max_segment_bytes);
    gloo::allreduce(opts);
  }
  if (op == ReduceOp::kAvg) divide_by(data, count, dtype, size());
}

std::string ProcessGroupGloo::setup_hierarchy(bool want_shm) {
  std::string why_not;
  if (plan_.hosts == 1) return "every rank is on one host";
  if (!plan_.hierarchical) {
    return fmt::format(
        "{} hosts; off on some rank, shared memory off on some rank, or one rank "
        "per host",
        plan_.hosts);
  }
  // Every host's ranks make their segment (a host of one rank needs none), then
  // every rank learns whether every host has one.
  bool ok = true;
  if (plan_.local_size > 1) {
    auto local_store =
        std::make_shared<PrefixStore>(fmt::format("hier/local/{}/", plan_.host), store_);
    // Its errors name local ranks: "group 'default, host 1' rank 0".
    const auto shm_options =
        shm_options_of(options_, want_shm, fmt::format("{}, host {}", options_.name, plan_.host));
    local_shm_ = ShmAllreduce::create(*local_store, plan_.local_rank, plan_.local_size, shm_options,
                                      &why_not);
    ok = local_shm_ != nullptr;
  }
  if (plan_.leader()) store_->set(fmt::format("hier/ok/{}", plan_.host), ok ? "1" : "0");
  std::vector<std::string> keys;
  for (int h = 0; h < plan_.hosts; ++h) keys.push_back(fmt::format("hier/ok/{}", h));
  const auto answers = store_->multi_get(keys, options_.timeout);
  for (int h = 0; h < plan_.hosts; ++h) {
    if (answers[static_cast<std::size_t>(h)] != "1") {
      local_shm_.reset();
      if (why_not.empty()) why_not = fmt::format("host {} has no shared-memory segment", h);
      return why_not;
    }
  }
  spdlog::debug(
      "ProcessGroupGloo '{}': rank {} hierarchical all-reduce, host {} of {}, local rank "
      "{} of {}",
      options_.name, rank(), plan_.host, plan_.hosts, plan_.local_rank, plan_.local_size);
  return "";
}

void ProcessGroupGloo::allreduce_hierarchical(void* data, std::size_t count, DType dtype,
                                              ReduceFn fn, std::uint32_t tag) {
  const std::size_t esize = element_size(dtype);
  const std::size_t per_chunk = std::max<std::size_t>(1, options_.hierarchical_chunk_bytes / esize);
  const std::size_t chunks = (count + per_chunk - 1) / per_chunk;
  auto* bytes = static_cast<std::uint8_t*>(data);
  auto chunk = [&](std::size_t i) {
    const std::size_t first = i * per_chunk;
    return std::make_pair(bytes + first * esize, std::min(per_chunk, count - first));
  };
  const Deadline deadline(options_.timeout);
  auto reduce_locally = [&](std::size_t i) {
    if (!local_shm_) return;
    auto [at, n] = chunk(i);
    local_shm_->allreduce(at, n, dtype, fn, 1, deadline);
  };
  auto share_locally = [&](std::size_t i) {
    if (!local_shm_) return;
    auto [at, n] = chunk(i);
    local_shm_->broadcast({{at, n * esize}}, 0, deadline);
  };
  auto between_hosts = [&](std::size_t i) {
    auto [at, n] = chunk(i);
    ring_allreduce(*context_, plan_.leaders, at, n, esize, fn, kHierarchicalSlotPrefix | tag,
                   options_.timeout, ring_scratch_);
  };
  if (!plan_.leader()) {
    // The leader shares chunk i - 1 after reducing chunk i locally (below).
    for (std::size_t i = 0; i < chunks; ++i) {
      reduce_locally(i);
      if (i > 0) share_locally(i - 1);
    }
    share_locally(chunks - 1);
    return;
  }
  if (chunks == 1) {
    reduce_locally(0);
    between_hosts(0);
    share_locally(0);
    return;
  }
  // The leader's network thread all-reduces the chunks between hosts in order,
  // one after the other, while this thread reduces the next one within the host
  // and shares the one before.
  std::mutex mutex;
  std::condition_variable cv;
  std::size_t submitted = 0, done = 0;
  bool quit = false;
  std::exception_ptr failed;
  JoinedThread network([&] {
    for (;;) {
      std::unique_lock lock(mutex);
      cv.wait(lock, [&] { return quit || submitted > done; });
      if (submitted == done) return;  // quit with nothing pending
      const std::size_t i = done;
      lock.unlock();
      try {
        between_hosts(i);
      } catch (...) {
        lock.lock();
        failed = std::current_exception();
        cv.notify_all();
        return;
      }
      lock.lock();
      ++done;
      cv.notify_all();
    }
  });
  auto submit = [&](std::size_t i) {
    std::lock_guard lock(mutex);
    submitted = i + 1;
    cv.notify_all();
  };
  auto wait_for = [&](std::size_t i) {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return failed != nullptr || done > i; });
    if (done <= i) std::rethrow_exception(failed);
  };
  auto stop = [&](bool wake) {
    bool running;
    {
      std::lock_guard lock(mutex);
      quit = true;
      running = failed == nullptr && done < submitted;
      cv.notify_all();
    }
    // A failure here leaves the group broken anyway: wake the network thread
    // off its connections rather than wait out the timeout.
    if (wake && running) {
      fail_connections(fmt::format("group '{}' rank {}: the hierarchical all-reduce failed on "
                                   "this host",
                                   options_.name, rank()),
                       /*reset=*/true);
    }
    network.join();
  };
  try {
    for (std::size_t i = 0; i < chunks; ++i) {
      reduce_locally(i);
      submit(i);  // queued behind chunk i - 1: the link never waits for the sharing
      if (i > 0) {
        wait_for(i - 1);
        share_locally(i - 1);
      }
    }
    wait_for(chunks - 1);
    share_locally(chunks - 1);
  } catch (...) {
    stop(true);
    throw;
  }
  stop(false);
}

void ProcessGroupGloo::allreduce_direct(void* data, std::size_t count, DType dtype, ReduceOp op,
                                        std::uint32_t tag) {
  // One round trip: every rank sends its whole buffer to every other rank and
  // reduces all contributions in rank order, so every rank computes bit-identical
  // results (the same order of floating-point operations).
  const auto n = static_cast<std::size_t>(size());
  const auto nbytes = count * element_size(dtype);
  const auto me = static_cast<std::size_t>(rank());
  // Reused across calls (only this worker thread touches it): a fresh buffer per
  // call would be zero-filled and, above malloc's mmap threshold, mapped and
  // unmapped every time (page faults plus TLB shootdowns on every op).
  if (direct_scratch_.size() < n * nbytes) direct_scratch_.resize(n * nbytes);
  std::uint8_t* gathered = direct_scratch_.data();
  std::memcpy(gathered + me * nbytes, data, nbytes);
  const std::uint64_t slot = kDirectSlotPrefix | tag;
  auto send_buf = context_->createUnboundBuffer(data, nbytes);
  auto recv_buf = context_->createUnboundBuffer(gathered, n * nbytes);
  for (std::size_t peer = 0; peer < n; ++peer) {
    if (peer == me) continue;
    recv_buf->recv(static_cast<int>(peer), slot, peer * nbytes, nbytes);
  }
  for (std::size_t i = 1; i < n; ++i) {
    auto peer = (me + i) % n;  // stagger so not every rank hits rank 0 first
    send_buf->send(static_cast<int>(peer), slot);
  }
  for (std::size_t i = 1; i < n; ++i) recv_buf->waitRecv(options_.timeout);
  for (std::size_t i = 1; i < n; ++i) send_buf->waitSend(options_.timeout);
  auto fn = reduce_function(dtype, op);
  fn(data, gathered, gathered + nbytes, count);
  for (std::size_t r = 2; r < n; ++r) fn(data, data, gathered + r * nbytes, count);
}

WorkPtr ProcessGroupGloo::broadcast(Buffer buffer, int root) {
  check_cpu(buffer, "broadcast");
  check_root("ProcessGroupGloo::broadcast", root, size());
  CollectiveDescriptor desc{
      CollectiveOp::kBroadcast, buffer.dtype, ReduceOp::kSum, root, 0, buffer.count};
  return enqueue_collective(desc, [this, buffer, root](std::uint32_t tag) {
    if (buffer.count == 0 || size() == 1) return;
    broadcast_now({buffer}, root, tag);
  });
}

WorkPtr ProcessGroupGloo::broadcast_many(std::vector<Buffer> buffers, int root) {
  std::size_t nbytes = 0;
  for (const Buffer& b : buffers) {
    check_cpu(b, "broadcast_many");
    nbytes += b.nbytes();
  }
  check_root("ProcessGroupGloo::broadcast_many", root, size());
  // Checked (DDP_DEBUG=DETAIL) as one broadcast of the stream's bytes.
  CollectiveDescriptor desc{
      CollectiveOp::kBroadcast, DType::kUInt8, ReduceOp::kSum, root, 0, nbytes};
  return enqueue_collective(desc, [this, buffers = std::move(buffers), root](std::uint32_t tag) {
    if (size() > 1) broadcast_now(buffers, root, tag);
  });
}

void ProcessGroupGloo::broadcast_now(const std::vector<Buffer>& buffers, int root,
                                     std::uint32_t tag) {
  if (shm_) {
    std::vector<ShmAllreduce::Part> parts;
    parts.reserve(buffers.size());
    for (const Buffer& b : buffers) parts.push_back({b.data, b.nbytes()});
    shm_->broadcast(parts, root, Deadline(options_.timeout));
    return;
  }
  for (const Buffer& b : buffers) {
    if (b.count == 0) continue;
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<std::uint8_t*>(b.data), b.nbytes());
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::broadcast(opts);
  }
}

WorkPtr ProcessGroupGloo::allgather(Buffer output, Buffer input) {
  check_cpu(output, "allgather");
  check_cpu(input, "allgather");
  check_chunks("ProcessGroupGloo::allgather", output, input, "output", "input", size());
  CollectiveDescriptor desc{
      CollectiveOp::kAllgather, input.dtype, ReduceOp::kSum, -1, 0, input.count};
  return enqueue_collective(desc, [this, output, input](std::uint32_t tag) {
    if (input.count == 0) return;
    if (size() == 1) {
      if (output.data != input.data) std::memmove(output.data, input.data, input.nbytes());
      return;
    }
    gloo::AllgatherOptions opts(context_);
    opts.setInput(static_cast<std::uint8_t*>(input.data), input.nbytes());
    opts.setOutput(static_cast<std::uint8_t*>(output.data), output.nbytes());
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::allgather(opts);
  });
}

WorkPtr ProcessGroupGloo::reduce_scatter(Buffer output, Buffer input, ReduceOp op) {
  check_cpu(output, "reduce_scatter");
  check_cpu(input, "reduce_scatter");
  auto fn = reduce_function(input.dtype, op);
  check_chunks("ProcessGroupGloo::reduce_scatter", input, output, "input", "output", size());
  CollectiveDescriptor desc{CollectiveOp::kReduceScatter, input.dtype, op, -1, 0, input.count};
  return enqueue_collective(desc, [this, output, input, op, fn](std::uint32_t tag) {
    if (output.count == 0) return;
    // Gloo has no standalone reduce-scatter in its new-style API: allreduce a
    // scratch copy (the input stays untouched) and keep this rank's chunk.
    std::vector<std::uint8_t> scratch(input.nbytes());
    std::memcpy(scratch.data(), input.data, input.nbytes());
    allreduce_in_place(scratch.data(), input.count, input.dtype, op, fn, tag);
    std::memcpy(output.data, scratch.data() + static_cast<std::size_t>(rank()) * output.nbytes(),
                output.nbytes());
  });
}

WorkPtr ProcessGroupGloo::reduce(Buffer buffer, int root, ReduceOp op) {
  check_cpu(buffer, "reduce");
  auto fn = reduce_function(buffer.dtype, op);
  check_root("ProcessGroupGloo::reduce", root, size());
  CollectiveDescriptor desc{CollectiveOp::kReduce, buffer.dtype, op, root, 0, buffer.count};
  return enqueue_collective(desc, [this, buffer, root, op, fn](std::uint32_t tag) {
    if (buffer.count == 0) return;
    if (size() > 1) {
      gloo::ReduceOptions opts(context_);
      with_element_type(buffer.dtype, [&](auto t) {
        using T = decltype(t);
        opts.setOutput<T>(context_->createUnboundBuffer(buffer.data, buffer.nbytes()));
      });
      opts.setRoot(root);
      opts.setReduceFunction(fn);
      opts.setTag(tag);
      opts.setTimeout(options_.timeout);
      opts.setMaxSegmentSize(options_.max_segment_bytes);
      gloo::reduce(opts);
    }
    if (op == ReduceOp::kAvg && rank() == root) {
      divide_by(buffer.data, buffer.count, buffer.dtype, size());
    }
  });
}

WorkPtr ProcessGroupGloo::barrier() {
  CollectiveDescriptor desc{CollectiveOp::kBarrier, DType::kUInt8, ReduceOp::kSum, -1, 0, 0};
  return enqueue_collective(desc, [this](std::uint32_t tag) {
    if (size() == 1) return;
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::barrier(opts);
  });
}

WorkPtr ProcessGroupGloo::gather(Buffer output, Buffer input, int root) {
  const char* origin = "ProcessGroupGloo::gather";
  check_root(origin, root, size());
  check_cpu(input, "gather");
  if (rank() == root) {
    check_cpu(output, "gather");
    check_chunks(origin, output, input, "output", "input", size());
  }
  CollectiveDescriptor desc{
      CollectiveOp::kGather, input.dtype, ReduceOp::kSum, root, 0, input.count};
  return enqueue_collective(desc, [this, output, input, root](std::uint32_t tag) {
    if (input.count == 0) return;
    if (size() == 1) {
      if (output.data != input.data) std::memmove(output.data, input.data, input.nbytes());
      return;
    }
    gather_into_root(context_, output, input, root, tag, options_.timeout);
  });
}

WorkPtr ProcessGroupGloo::scatter(Buffer output, Buffer input, int root) {
  const char* origin = "ProcessGroupGloo::scatter";
  check_root(origin, root, size());
  check_cpu(output, "scatter");
  if (rank() == root) {
    check_cpu(input, "scatter");
    check_chunks(origin, input, output, "input", "output", size());
  }
  CollectiveDescriptor desc{
      CollectiveOp::kScatter, output.dtype, ReduceOp::kSum, root, 0, output.count};
  return enqueue_collective(desc, [this, output, input, root](std::uint32_t tag) {
    if (output.count == 0) return;
    if (size() == 1) {
      if (output.data != input.data) std::memmove(output.data, input.data, output.nbytes());
      return;
    }
    scatter_from_root(context_, output, input, root, tag, options_.timeout);
  });
}

WorkPtr ProcessGroupGloo::alltoall(Buffer output, Buffer input,
                                   std::vector<std::size_t> output_counts,
                                   std::vector<std::size_t> input_counts) {
  const char* origin = "ProcessGroupGloo::alltoall";
  check_cpu(output, "alltoall");
  check_cpu(input, "alltoall");
  auto split = split_alltoall(origin, output, input, output_counts, input_counts, rank(), size());
  AlltoallCounts counts{input.dtype, std::move(split.input), std::move(split.output)};
  CollectiveDescriptor desc{
      CollectiveOp::kAlltoall, input.dtype, ReduceOp::kSum, -1, 0, input.count};
  return enqueue_collective(desc, [this, output, input, counts, origin](std::uint32_t tag) {
    if (size() > 1) {
      check_alltoall_counts(context_, counts, tag, options_.timeout, origin,
                            fmt::format("group '{}' rank {}/{}", options_.name, rank(), size()));
    }
    alltoall_exchange(context_, output, input, counts, kAlltoallSlotPrefix | tag, options_.timeout);
  });
}

// ---- point to point ---------------------------------------------------------

WorkPtr ProcessGroupGloo::send(Buffer buffer, int dst, int tag) {
  check_cpu(buffer, "send");
  if (dst < 0 || dst >= size() || dst == rank()) {
    throw InvalidArgument(
        "ProcessGroupGloo::send",
        fmt::format("destination {} must be another rank in [0, {})", dst, size()));
  }
  if (tag < 0) throw InvalidArgument("ProcessGroupGloo::send", fmt::format("tag {} < 0", tag));
  return enqueue_p2p("send", buffer, /*is_send=*/true, dst, tag);
}

WorkPtr ProcessGroupGloo::recv(Buffer buffer, int src, int tag) {
  check_cpu(buffer, "recv");
  if (src < 0 || src >= size() || src == rank()) {
    throw InvalidArgument("ProcessGroupGloo::recv",
                          fmt::format("source {} must be another rank in [0, {})", src, size()));
  }
  if (tag < 0) throw InvalidArgument("ProcessGroupGloo::recv", fmt::format("tag {} < 0", tag));
  return enqueue_p2p("recv", buffer, /*is_send=*/false, src, tag);
}

WorkPtr ProcessGroupGloo::recv_any(Buffer buffer, int tag) {
  check_cpu(buffer, "recv_any");
  if (size() == 1) {
    throw InvalidArgument("ProcessGroupGloo::recv_any",
                          "a group of one rank has no other rank to receive from");
  }
  if (tag < 0) {
    throw InvalidArgument("ProcessGroupGloo::recv_any", fmt::format("tag {} < 0", tag));
  }
  return enqueue_p2p("recv_any", buffer, /*is_send=*/false, /*peer=*/-1, tag);
}

void ProcessGroupGloo::p2p_loop() {
  while (true) {
    PendingP2p pending;
    {
      std::unique_lock lock(p2p_mutex_);
      p2p_cv_.wait(lock, [&] { return p2p_stop_ || !p2p_queue_.empty(); });
      if (p2p_queue_.empty()) return;
      pending = std::move(p2p_queue_.front());
      p2p_queue_.pop_front();
      p2p_current_ = pending.buffer.get();
      p2p_current_is_send_ = pending.is_send;
    }
    const std::string& op = pending.work->op();
    bool failed = false;
    int source = -1;        // the rank a receive got its message from
    bool shutdown = false;  // the wait was cut short (destruction or abort)
    std::string what;
    try {
      if (!(pending.is_send ? pending.buffer->waitSend(options_.timeout)
                            : pending.buffer->waitRecv(&source, options_.timeout))) {
        failed = shutdown = true;
      }
    } catch (const std::exception& e) {
      failed = true;
      what = e.what();
    }
    {
      std::lock_guard lock(p2p_mutex_);
      p2p_current_ = nullptr;
    }
    // The buffer goes before the Work completes: once the caller sees the Work
    // done, no transfer writes into its memory any more (a cut-short wait leaves
    // the transfer pending on a connection that may still be open).
    pending.buffer.reset();
    if (!failed) {
      // peer -1: a recv_any, whose Work is a RecvAnyWork (enqueue_p2p).
      if (pending.peer < 0) static_cast<RecvAnyWork&>(*pending.work).set_source_rank(source);
      complete_unless_aborted(pending.work);
      continue;
    }
    const auto seq = pending.work->sequence_number();
    auto message = fmt::format("group '{}' rank {}: {} #{} {} (tag {}) failed: {}", options_.name,
                               rank(), op, seq,
                               pending.is_send    ? fmt::format("to rank {}", pending.peer)
                               : pending.peer < 0 ? std::string("from any rank")
                                                  : fmt::format("from rank {}", pending.peer),
                               pending.tag, shutdown ? "aborted" : what);
    auto origin = fmt::format("ProcessGroupGloo::{}", op);
    if (abort_->is_set()) {
      pending.work->fail(abort_->error(op, seq));
    } else if (shutdown) {
      pending.work->fail(std::make_exception_ptr(ShutdownError(origin, message)));
    } else if (what.find("imed out") != std::string::npos) {
      pending.work->fail(std::make_exception_ptr(TimeoutError(origin, message)));
    } else {
      pending.work->fail(std::make_exception_ptr(NetworkError(origin, message)));
    }
  }
}

}  // namespace detail
}  // namespace ddp
