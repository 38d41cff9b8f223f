#include "shm/shm_allreduce.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <optional>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ddp/common/error.h"
#include "ddp/common/time.h"
#include "ddp/store/store.h"

namespace ddp::detail {

namespace {

constexpr std::uint64_t kMagic = 0x31'6d'68'73'2d'70'64'64ull;  // "ddp-shm1" little-endian
constexpr std::uint32_t kVersion = 2;                           // 2: the abort word (Control)
constexpr std::size_t kPage = 4096;
constexpr const char* kNamePrefix = "ddp-shm-";
constexpr auto kSpin = std::chrono::microseconds(20);
constexpr auto kSleepSlice = std::chrono::milliseconds(50);
// A segment whose creator is gone is removed by the next rank 0 on this host
// once it is this old (a creator killed between create and unlink).
constexpr auto kStaleAge = std::chrono::seconds(60);

// Page 0 of the segment; written by rank 0 before it publishes the name.
struct Header {
  std::uint64_t magic;
  std::uint64_t nonce;
  std::uint32_t version;
  std::uint32_t world;
  std::uint64_t slot_bytes;
};

// Page 0, on a cache line after the header: which rank aborted the group
// (rank + 1; 0 while none did). Set once, read by every rank's slow path.
struct alignas(64) Control {
  std::atomic<std::uint32_t> aborted_by;
};
constexpr std::size_t kControlOffset = 64;
static_assert(sizeof(Header) <= kControlOffset);

// One per rank: who maps the segment (to tell a dead peer from a slow one).
struct alignas(64) RankRecord {
  std::atomic<std::int64_t> pid;
  std::atomic<std::uint64_t> start_time;  // field 22 of /proc/<pid>/stat
};

// One per rank, on cache lines of their own: the rank's barrier count (a futex
// word, written only by its rank) and how many peers sleep on it.
struct Flag {
  alignas(64) std::atomic<std::uint32_t> phase;
  alignas(64) std::atomic<std::uint32_t> sleepers;
};

static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(std::atomic<std::int64_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));

constexpr std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }
std::size_t records_offset() { return kPage; }
std::size_t flags_offset(int world) {
  return records_offset() + round_up(static_cast<std::size_t>(world) * sizeof(RankRecord), 64);
}
std::size_t data_offset(int world) {
  return round_up(flags_offset(world) + static_cast<std::size_t>(world) * sizeof(Flag), kPage);
}
std::size_t segment_bytes(int world, std::size_t slot_bytes) {
  return data_offset(world) + 2 * static_cast<std::size_t>(world) * slot_bytes;
}

Header* header_of(void* base) { return static_cast<Header*>(base); }
Control* control_of(void* base) {
  return reinterpret_cast<Control*>(static_cast<std::uint8_t*>(base) + kControlOffset);
}
RankRecord* records_of(void* base) {
  return reinterpret_cast<RankRecord*>(static_cast<std::uint8_t*>(base) + records_offset());
}
Flag* flags_of(void* base, int world) {
  return reinterpret_cast<Flag*>(static_cast<std::uint8_t*>(base) + flags_offset(world));
}

std::string errno_text(const char* call) {
  return fmt::format("{}: {}", call, std::strerror(errno));
}

// What /proc/<pid>/stat says about a process.
struct ProcessStat {
  enum class Kind { kRunning, kGone, kUnknown } kind = ProcessStat::Kind::kUnknown;
  std::uint64_t start_time = 0;  // clock ticks since boot (field 22)
};

// kGone: no such process, or a zombie; kUnknown: /proc could not be read for
// another reason (out of file descriptors, say), which must not count as death.
ProcessStat stat_of(std::int64_t pid) {
  ProcessStat out;
  const int fd = ::open(fmt::format("/proc/{}/stat", pid).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ESRCH) out.kind = ProcessStat::Kind::kGone;
    return out;
  }
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) {
    if (n < 0 && errno == ESRCH) out.kind = ProcessStat::Kind::kGone;
    return out;
  }
  const std::string line(buf, static_cast<std::size_t>(n));
  const auto close = line.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return out;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  std::string state;
  for (int i = 3; i <= 22; ++i) {  // fields 3.. follow the name: 3 is the state, 22 the start time
    if (!(fields >> field)) return out;
    if (i == 3) state = field;
  }
  try {
    out.start_time = std::stoull(field);
  } catch (const std::exception&) {
    return out;
  }
  out.kind = state == "Z" || state == "X" ? ProcessStat::Kind::kGone : ProcessStat::Kind::kRunning;
  return out;
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Futex calls on a word shared between processes (so not FUTEX_PRIVATE).
void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected,
                std::chrono::nanoseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr,
            0);
}
void futex_wake_all(std::atomic<std::uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
}

// Removes segments of this library whose creator process is gone (it was killed
// between creating and unlinking the name).
void remove_stale_segments() {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  const auto now = std::chrono::system_clock::now();
  while (dirent* entry = ::readdir(dir)) {
    const std::string file = entry->d_name;
    if (file.rfind(kNamePrefix, 0) != 0) continue;
    std::int64_t pid = 0;
    try {
      pid = std::stoll(file.substr(std::strlen(kNamePrefix)));
    } catch (const std::exception&) {
      continue;
    }
    if (pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    struct stat st {};
    if (::stat(("/dev/shm/" + file).c_str(), &st) != 0 || st.st_uid != ::geteuid()) continue;
    const auto modified = std::chrono::system_clock::from_time_t(st.st_mtime);
    if (now - modified < kStaleAge) continue;
    if (::shm_unlink(("/" + file).c_str()) == 0) {
      spdlog::info("shared memory: removed /dev/shm/{} (its creator, pid {}, is gone)", file, pid);
    }
  }
  ::closedir(dir);
}

// Makes every page of the segment writable in this process's page tables now,
// at setup, instead of at its first touch inside an all-reduce. On this
// project's 2-core VM a page's first touch costs a write fault in the guest
// (a write to a shared mapping maps one page at a time) and then a shadow-page
// fault in the hypervisor, even once the guest's entry exists: a fresh group's
// first 4 MiB all-reduce at 3 ranks took 34 ms against 1.5 ms for the next
// ones, every phase of its first two chunks (one per slot set) 60x slower.
// MADV_POPULATE_WRITE (Linux 5.14; best effort) fills the guest's entries in
// one call; one atomic no-op write a page (OR 0: a peer's concurrent write to
// the same byte is never lost) then takes the hypervisor's faults: about 18 ms
// for the 6 MiB of 3 ranks, paid while the group forms. First op: 4 ms.
void prefault(void* base, std::size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  (void)::madvise(base, bytes, MADV_POPULATE_WRITE);
#endif
  auto* bytes_at = static_cast<unsigned char*>(base);
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  for (std::size_t at = 0; at < bytes; at += page) {
    __atomic_fetch_or(bytes_at + at, 0, __ATOMIC_RELAXED);
  }
}

}  // namespace

ShmAllreduce::ShmAllreduce(int rank, int size, const Options& options)
    : rank_(rank), size_(size), slot_bytes_(options.slot_bytes), group_name_(options.group_name) {}

ShmAllreduce::~ShmAllreduce() {
  if (!unlinked_) ::shm_unlink(name_.c_str());
  if (base_ != nullptr) ::munmap(base_, mapped_bytes_);
}

std::unique_ptr<ShmAllreduce> ShmAllreduce::create(Store& store, int rank, int size,
                                                   const Options& options, std::string* why_not) {
  const char* origin = "ShmAllreduce";
  if (size < 2 || rank < 0 || rank >= size) {
    throw InvalidArgument(origin, fmt::format("rank {} of {}: needs at least 2 ranks", rank, size));
  }
  if (!valid_slot_bytes(options.slot_bytes)) {
    throw InvalidArgument(
        origin,
        fmt::format("slot_bytes {} must be a multiple of 64, at least 4096", options.slot_bytes));
  }
  std::unique_ptr<ShmAllreduce> self(new ShmAllreduce(rank, size, options));
  std::string failure;
  if (!options.enabled) {
    failure = "shared memory is off on this rank (DDP_SHM_DISABLE or GlooOptions::shared_memory)";
    if (rank == 0) store.set("shm/segment", "");
  } else if (rank == 0) {
    try {
      failure = self->create_segment();
    } catch (const std::exception& e) {  // std::random_device, allocation
      failure = e.what();
    }
    store.set("shm/segment",
              failure.empty() ? fmt::format("{} {:016x}", self->name_, self->nonce_) : "");
  } else {
    failure = self->attach(store.get("shm/segment", options.timeout));
  }
  if (failure.empty()) {
    auto& record = records_of(self->base_)[rank];
    record.pid.store(::getpid());
    record.start_time.store(stat_of(::getpid()).start_time);
  }
  store.set(fmt::format("shm/ok/{}", rank), failure.empty() ? "1" : "0 " + failure);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(fmt::format("shm/ok/{}", r));
  const auto answers = store.multi_get(keys, options.timeout);
  if (rank == 0 && !self->unlinked_) {
    ::shm_unlink(self->name_.c_str());  // every rank has mapped it or given up
    self->unlinked_ = true;
  }
  std::string reasons;
  for (int r = 0; r < size; ++r) {
    const auto& answer = answers[static_cast<std::size_t>(r)];
    if (answer == "1") continue;
    const std::string reason =
        fmt::format("rank {}: {}", r, answer.size() > 2 ? answer.substr(2) : answer);
    reasons += (reasons.empty() ? "" : "; ") + reason;
    if (rank == 0 || r == rank) {
      spdlog::info("group '{}': no shared-memory all-reduce, all-reduce uses TCP ({})",
                   options.group_name, reason);
    }
  }
  if (!reasons.empty()) {
    if (why_not != nullptr) *why_not = reasons;
    return nullptr;
  }
  // Watch only peers whose process this rank can see as the one that mapped the
  // segment (not, say, a process of another PID namespace with the same pid).
  self->checkable_.assign(static_cast<std::size_t>(size), false);
  for (int r = 0; r < size; ++r) {
    const auto& record = records_of(self->base_)[r];
    const std::int64_t pid = record.pid.load();
    const std::uint64_t started = record.start_time.load();
    const auto now = stat_of(pid);
    self->checkable_[static_cast<std::size_t>(r)] =
        r != rank && pid != ::getpid() && started != 0 && now.kind == ProcessStat::Kind::kRunning &&
        now.start_time == started;
  }
  spdlog::debug("group '{}' rank {}: shared-memory all-reduce through {} ({} KiB slots)",
                options.group_name, rank, self->name_, options.slot_bytes / 1024);
  return self;
}

std::string ShmAllreduce::create_segment() {
  remove_stale_segments();
  std::random_device random;
  nonce_ = (static_cast<std::uint64_t>(random()) << 32) | random();
  name_ = fmt::format("/{}{}-{:016x}", kNamePrefix, ::getpid(), nonce_);
  const std::size_t bytes = segment_bytes(size_, slot_bytes_);
  const int fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return errno_text("shm_open");
  unlinked_ = false;
  std::string failure;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    failure = errno_text("ftruncate");
  } else if (const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
    failure = fmt::format("reserving {} MiB in /dev/shm: {}", bytes >> 20, std::strerror(rc));
  } else {
    failure = map(fd, bytes);
  }
  ::close(fd);
  if (!failure.empty()) {
    ::shm_unlink(name_.c_str());
    unlinked_ = true;
    return failure;
  }
  new (control_of(base_)) Control{};
  for (int r = 0; r < size_; ++r) {
    new (&records_of(base_)[r]) RankRecord{};
    new (&flags_of(base_, size_)[r]) Flag{};
  }
  auto* header = header_of(base_);
  header->nonce = nonce_;
  header->version = kVersion;
  header->world = static_cast<std::uint32_t>(size_);
  header->slot_bytes = slot_bytes_;
  std::atomic_thread_fence(std::memory_order_release);
  header->magic = kMagic;
  return "";
}

std::string ShmAllreduce::map(int fd, std::size_t bytes) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return errno_text("mmap");
  // Every page mapped writable now, in one call: a page's first touch in the
  // all-reduce would otherwise fault (a write fault on a shared mapping maps one
  // page), and faults are dear under a hypervisor (about 50 us each on the 2-core
  // VM of bench/RESULTS.md: a fresh group's first 4 MiB all-reduce took 34 ms
  // against 1.5 ms). Best effort: kernels before 5.14 lack MADV_POPULATE_WRITE.
  prefault(base, bytes);
  base_ = base;
  mapped_bytes_ = bytes;
  return "";
}

std::string ShmAllreduce::attach(const std::string& published) {
  if (published.empty()) return "rank 0 could not create the segment";
  std::istringstream in(published);
  std::string nonce_hex;
  if (!(in >> name_ >> nonce_hex)) return fmt::format("malformed segment record '{}'", published);
  try {
    nonce_ = std::stoull(nonce_hex, nullptr, 16);
  } catch (const std::exception&) {
    return fmt::format("malformed segment record '{}'", published);
  }
  const int fd = ::shm_open(name_.c_str(), O_RDWR, 0);
  if (fd < 0) return fmt::format("{} (another host or IPC namespace?)", errno_text("shm_open"));
  const std::size_t bytes = segment_bytes(size_, slot_bytes_);
  struct stat st {};
  std::string failure;
  if (::fstat(fd, &st) != 0) {
    failure = errno_text("fstat");
  } else if (static_cast<std::size_t>(st.st_size) != bytes) {
    failure = fmt::format("segment has {} bytes, expected {}", st.st_size, bytes);
  } else {
    failure = map(fd, bytes);
  }
  ::close(fd);
  if (!failure.empty()) return failure;
  std::atomic_thread_fence(std::memory_order_acquire);
  const auto* header = header_of(base_);
  if (header->magic != kMagic || header->nonce != nonce_ || header->version != kVersion ||
      header->world != static_cast<std::uint32_t>(size_) || header->slot_bytes != slot_bytes_) {
    return fmt::format("{} is not this group's segment (nonce, world or slot size differ)", name_);
  }
  return "";
}

std::uint8_t* ShmAllreduce::slot(std::size_t set, int rank) const {
  return static_cast<std::uint8_t*>(base_) + data_offset(size_) +
         (set * static_cast<std::size_t>(size_) + static_cast<std::size_t>(rank)) * slot_bytes_;
}

bool ShmAllreduce::peer_alive(int peer) const {
  if (!checkable_[static_cast<std::size_t>(peer)]) return true;
  const auto& record = records_of(base_)[peer];
  const auto now = stat_of(record.pid.load());
  if (now.kind == ProcessStat::Kind::kUnknown) return true;
  return now.kind == ProcessStat::Kind::kRunning && now.start_time == record.start_time.load();
}

void ShmAllreduce::barrier(const Deadline& deadline, const char* what) {
  ++phase_;
  Flag& mine = flags_of(base_, size_)[rank_];
  mine.phase.store(phase_, std::memory_order_seq_cst);
  if (mine.sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&mine.phase);
  for (int k = 1; k < size_; ++k) wait_for((rank_ + k) % size_, phase_, deadline, what);
  // Peers that aborted after publishing this phase must not be read from: a rank
  // that arrives late (it never had to sleep) fails like the others. One load
  // of a line that is written only by an abort.
  if (const std::uint32_t by = control_of(base_)->aborted_by.load(std::memory_order_acquire);
      by != 0) {
    throw_aborted(static_cast<int>(by) - 1, what);
  }
}

void ShmAllreduce::wait_for(int peer, std::uint32_t phase, const Deadline& deadline,
                            const char* what) {
  Flag& flag = flags_of(base_, size_)[peer];
  // Phases wrap around; a peer is never more than one phase ahead.
  auto reached = [&](std::uint32_t value) { return static_cast<std::int32_t>(value - phase) >= 0; };
  const auto spin_until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (reached(flag.phase.load(std::memory_order_acquire))) return;
    cpu_relax();
    if (i % 64 == 63 && std::chrono::steady_clock::now() >= spin_until) break;
  }
  const auto& aborted_by = control_of(base_)->aborted_by;
  while (true) {
    flag.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t value = flag.phase.load(std::memory_order_seq_cst);
    // An abort wakes every phase word; one that lands between this check and
    // the sleep is seen after the slice (kSleepSlice) at the latest.
    if (!reached(value) && aborted_by.load(std::memory_order_acquire) == 0) {
      std::chrono::nanoseconds slice = kSleepSlice;
      if (deadline.remaining() < kSleepSlice) {  // never() is near ms::max(): compare in ms first
        slice = std::max<std::chrono::nanoseconds>(
            deadline.when() - std::chrono::steady_clock::now(), std::chrono::microseconds(100));
      }
      futex_wait(&flag.phase, value, slice);
    }
    flag.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(flag.phase.load(std::memory_order_acquire))) return;
    if (const std::uint32_t by = aborted_by.load(std::memory_order_acquire); by != 0) {
      throw_aborted(static_cast<int>(by) - 1, what);
    }
    if (deadline.expired()) {
      throw TimeoutError("ShmAllreduce",
                         // "Timed out", as Gloo's transports say it: what programs
                         // written for torch's Gloo match (torch's own tests do).
                         fmt::format("group '{}' rank {}: Timed out waiting for rank {} "
                                     "in the shared-memory all-reduce ({})",
                                     group_name_, rank_, peer, what));
    }
    if (!peer_alive(peer)) {
      throw NetworkError(
          "ShmAllreduce",
          fmt::format("group '{}' rank {}: rank {} (pid {}) exited during the "
                      "shared-memory all-reduce ({})",
                      group_name_, rank_, peer, records_of(base_)[peer].pid.load(), what));
    }
  }
}

void ShmAllreduce::abort() {
  std::uint32_t none = 0;
  control_of(base_)->aborted_by.compare_exchange_strong(none, static_cast<std::uint32_t>(rank_) + 1,
                                                        std::memory_order_acq_rel);
  // Wake every rank's sleepers, whatever phase word they sleep on.
  for (int r = 0; r < size_; ++r) futex_wake_all(&flags_of(base_, size_)[r].phase);
}

void ShmAllreduce::throw_aborted(int by, const char* what) const {
  if (by == rank_) {
    throw GroupChanged("ShmAllreduce",
                       fmt::format("group '{}' rank {}: the group was aborted on this rank during "
                                   "the shared-memory all-reduce ({})",
                                   group_name_, rank_, what));
  }
  throw NetworkError("ShmAllreduce", fmt::format("group '{}' rank {}: rank {} aborted the group "
                                                 "during the shared-memory all-reduce ({})",
                                                 group_name_, rank_, by, what));
}

void ShmAllreduce::allreduce(void* data, std::size_t count, DType dtype, ReduceFn fn, int divisor,
                             const Deadline& deadline) {
  const std::size_t esize = element_size(dtype);
  const std::size_t total = count * esize;
  const std::size_t chunk = slot_bytes_;  // a multiple of 64, so of every element size
  auto* bytes = static_cast<std::uint8_t*>(data);
  for (std::size_t offset = 0; offset < total; offset += chunk) {
    const std::size_t n = std::min(chunk, total - offset);
    if (n <= kSmallBytes) {
      chunk_small(bytes + offset, n, esize, dtype, fn, divisor, deadline);
    } else {
      chunk_split(bytes + offset, n, esize, dtype, fn, divisor, deadline);
    }
  }
}

void ShmAllreduce::broadcast(const std::vector<Part>& parts, int root, const Deadline& deadline) {
  // A whole slot set a chunk: the sets alternate with the all-reduce's chunks, so
  // the root overwrites a set only once every rank passed the next barrier,
  // having copied out what it held.
  const std::size_t capacity = slot_bytes_ * static_cast<std::size_t>(size_);
  std::size_t total = 0;
  for (const Part& p : parts) total += p.bytes;
  std::size_t part = 0;  // the stream's cursor: parts[part], `within` bytes in
  std::size_t within = 0;
  for (std::size_t done = 0; done < total;) {
    const std::size_t n = std::min(capacity, total - done);
    std::uint8_t* set = slot(rounds_++ % 2, 0);  // the set's slots lie back to back
    // Copies the chunk between the parts and the set, and moves the cursor past it.
    auto copy = [&](bool into_set) {
      for (std::size_t at = 0; at < n;) {
        const Part& p = parts[part];
        const std::size_t len = std::min(p.bytes - within, n - at);
        auto* bytes = static_cast<std::uint8_t*>(p.data) + within;
        if (len == 0) {
          // an empty part (its data may be null): nothing to copy
        } else if (into_set) {
          std::memcpy(set + at, bytes, len);
        } else {
          std::memcpy(bytes, set + at, len);
        }
        at += len;
        within += len;
        if (within == p.bytes) {
          ++part;
          within = 0;
        }
      }
    };
    if (rank_ == root) copy(true);
    barrier(deadline, "broadcast");
    if (rank_ != root) copy(false);
    done += n;
  }
}

void ShmAllreduce::chunk_small(std::uint8_t* data, std::size_t nbytes, std::size_t esize,
                               DType dtype, ReduceFn fn, int divisor, const Deadline& deadline) {
  const std::size_t set = rounds_++ % 2;
  std::memcpy(slot(set, rank_), data, nbytes);
  barrier(deadline, "gather");
  // Every rank reduces the same inputs in the same order: identical results.
  const std::size_t count = nbytes / esize;
  fn(data, slot(set, 0), slot(set, 1), count);
  for (int k = 2; k < size_; ++k) fn(data, data, slot(set, k), count);
  if (divisor > 1) divide_by(data, count, dtype, divisor);
}

void ShmAllreduce::chunk_split(std::uint8_t* data, std::size_t nbytes, std::size_t esize,
                               DType dtype, ReduceFn fn, int divisor, const Deadline& deadline) {
  const std::size_t set = rounds_++ % 2;
  const std::size_t count = nbytes / esize;
  const std::size_t line = 64 / esize;  // parts start on cache lines
  const std::size_t per = round_up(
      (count + static_cast<std::size_t>(size_) - 1) / static_cast<std::size_t>(size_), line);
  auto part_begin = [&](int k) {
    return std::min(count, per * static_cast<std::size_t>(k)) * esize;
  };
  auto part_bytes = [&](int k) {
    return std::min(count, per * static_cast<std::size_t>(k + 1)) * esize - part_begin(k);
  };

  std::uint8_t* mine = slot(set, rank_);
  for (int k = 0; k < size_; ++k) {
    if (k != rank_ && part_bytes(k) > 0)
      std::memcpy(mine + part_begin(k), data + part_begin(k), part_bytes(k));
  }
  barrier(deadline, "gather");
  if (const std::size_t len = part_bytes(rank_); len > 0) {
    const std::size_t begin = part_begin(rank_);
    auto contribution = [&](int k) -> const std::uint8_t* {
      return k == rank_ ? data + begin : slot(set, k) + begin;
    };
    std::uint8_t* out = mine + begin;  // the other ranks copy the result from here
    const std::size_t n = len / esize;
    fn(out, contribution(0), contribution(1), n);
    for (int k = 2; k < size_; ++k) fn(out, out, contribution(k), n);
    if (divisor > 1) {
      divide_and_copy(out, data + begin, n, dtype, divisor);  // one pass, not two
    } else {
      std::memcpy(data + begin, out, len);
    }
  }
  barrier(deadline, "reduce");
  for (int k = 0; k < size_; ++k) {
    if (k != rank_ && part_bytes(k) > 0) {
      std::memcpy(data + part_begin(k), slot(set, k) + part_begin(k), part_bytes(k));
    }
  }
}

}  // namespace ddp::detail
