#include "checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>

namespace ddp::examples {
namespace {

// File layout (integers little-endian u64, as the machine writes them):
//   magic (8 bytes: "DDPCKPT1" or "DDPCKPT2"), epoch, step, global_step, world_size,
//   version 2 only: the number of settings, then per setting its name and its
//   value, each as a length and bytes,
//   the number of tensors, then per tensor its element count and its floats.
constexpr char kMagicV1[8] = {'D', 'D', 'P', 'C', 'K', 'P', 'T', '1'};
constexpr char kMagicV2[8] = {'D', 'D', 'P', 'C', 'K', 'P', 'T', '2'};
constexpr std::uint64_t kMaxSettings = 1024;
constexpr std::uint64_t kMaxSettingBytes = 1 << 16;
constexpr std::uint64_t kMaxTensors = 4096;
constexpr std::uint64_t kMaxTensorElements = std::uint64_t{1} << 32;

void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(path + ": write failed: " + std::strerror(errno));
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void put_u64(std::string& out, std::uint64_t v) {
  out.append(reinterpret_cast<const char*>(&v), 8);
}
void put_text(std::string& out, const std::string& text) {
  put_u64(out, text.size());
  out += text;
}

std::string encode(const Checkpoint& ckpt) {
  std::string bytes(kMagicV2, sizeof kMagicV2);
  put_u64(bytes, ckpt.epoch);
  put_u64(bytes, ckpt.step);
  put_u64(bytes, ckpt.global_step);
  put_u64(bytes, ckpt.world_size);
  put_u64(bytes, ckpt.settings.size());
  for (const auto& [name, value] : ckpt.settings) {
    put_text(bytes, name);
    put_text(bytes, value);
  }
  put_u64(bytes, ckpt.tensors.size());
  for (const auto& t : ckpt.tensors) {
    put_u64(bytes, t.size());
    bytes.append(reinterpret_cast<const char*>(t.data()), t.size() * sizeof(float));
  }
  return bytes;
}

// The directory part of `path` ("." for a bare name) and the file name.
std::pair<std::string, std::string> split_path(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

// Whether `path` still names the file open as `fd` (nobody unlinked or replaced it).
bool still_named(int fd, const std::string& path) {
  struct stat open_st {
  }, path_st{};
  if (::fstat(fd, &open_st) != 0 || ::lstat(path.c_str(), &path_st) != 0) return false;
  return open_st.st_dev == path_st.st_dev && open_st.st_ino == path_st.st_ino;
}

// Creates (or truncates) `tmp` and holds an exclusive flock on it, which tells
// remove_stale_temporaries() that its writer is alive. A cleaner may remove the
// file between our open and our lock (it saw no lock yet): then start again.
int open_locked(const std::string& tmp) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) throw std::runtime_error(tmp + ": cannot create: " + std::strerror(errno));
    int rc;
    do {
      rc = ::flock(fd, LOCK_EX);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int err = errno;
      ::close(fd);
      throw std::runtime_error(tmp + ": cannot lock: " + std::strerror(err));
    }
    if (still_named(fd, tmp)) return fd;
    ::close(fd);
  }
  throw std::runtime_error(tmp + ": removed again and again while being created");
}

void fsync_directory(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

bool is_temporary_of(const std::string& name, const std::string& base) {
  const std::string prefix = base + ".tmp.";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size()), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& ckpt) {
  const std::string bytes = encode(ckpt);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = open_locked(tmp);
  try {
    write_all(fd, bytes.data(), bytes.size(), tmp);
    if (::fsync(fd) != 0) throw std::runtime_error(tmp + ": fsync failed: " + std::strerror(errno));
    // Renamed while still locked, so no cleaner ever sees it unlocked under its
    // temporary name.
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      throw std::runtime_error(path + ": rename failed: " + std::strerror(errno));
    }
  } catch (...) {
    ::unlink(tmp.c_str());
    ::close(fd);
    throw;
  }
  ::close(fd);
  fsync_directory(split_path(path).first);  // make the rename itself durable
}

std::optional<Checkpoint> load_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  auto fail = [&](const char* what) {
    return std::runtime_error(path + ": corrupt checkpoint (" + what + ")");
  };
  char magic[8];
  if (!in.read(magic, 8)) throw fail("truncated");
  const bool v1 = std::memcmp(magic, kMagicV1, 8) == 0;
  if (!v1 && std::memcmp(magic, kMagicV2, 8) != 0) throw fail("bad magic");
  auto get = [&] {
    std::uint64_t v = 0;
    if (!in.read(reinterpret_cast<char*>(&v), 8)) throw fail("truncated");
    return v;
  };
  auto get_text = [&] {
    const std::uint64_t n = get();
    if (n > kMaxSettingBytes) throw fail("setting too long");
    std::string text(n, '\0');
    if (!in.read(text.data(), static_cast<std::streamsize>(n))) throw fail("truncated setting");
    return text;
  };
  Checkpoint c;
  c.epoch = get();
  c.step = get();
  c.global_step = get();
  c.world_size = get();
  if (!v1) {
    const std::uint64_t n = get();
    if (n > kMaxSettings) throw fail("too many settings");
    for (std::uint64_t i = 0; i < n; ++i) {
      std::string name = get_text();
      std::string value = get_text();
      if (!c.settings.emplace(std::move(name), std::move(value)).second)
        throw fail("a setting given twice");
    }
  }
  const std::uint64_t n = get();
  if (n > kMaxTensors) throw fail("too many tensors");
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t count = get();
    if (count > kMaxTensorElements) throw fail("tensor too large");
    std::vector<float> t(count);
    if (!in.read(reinterpret_cast<char*>(t.data()),
                 static_cast<std::streamsize>(count * sizeof(float)))) {
      throw fail("truncated tensor");
    }
    c.tensors.push_back(std::move(t));
  }
  if (in.peek() != std::ifstream::traits_type::eof()) throw fail("bytes after the last tensor");
  return c;
}

std::vector<std::string> remove_stale_temporaries(const std::string& path) {
  const auto [dir, base] = split_path(path);
  std::vector<std::string> removed;
  DIR* listing = ::opendir(dir.c_str());
  if (listing == nullptr) {
    if (errno == ENOENT) return removed;  // no directory, so no temporary file either
    throw std::runtime_error(dir + ": cannot list: " + std::strerror(errno));
  }
  std::vector<std::string> candidates;
  while (const dirent* entry = ::readdir(listing)) {
    if (is_temporary_of(entry->d_name, base))
      candidates.push_back((dir == "/" ? "" : dir) + "/" + entry->d_name);
  }
  ::closedir(listing);
  for (const auto& candidate : candidates) {
    // O_NONBLOCK: a FIFO planted under that name must not block the open.
    const int fd = ::open(candidate.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;  // gone already (renamed by its writer), or not ours to open
    struct stat st {};
    const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    // A writer holds the lock from creation to rename: a lock we can take
    // belongs to nobody, so that writer is gone.
    if (regular && ::flock(fd, LOCK_EX | LOCK_NB) == 0 && still_named(fd, candidate) &&
        ::unlink(candidate.c_str()) == 0) {
      removed.push_back(candidate);
    }
    ::close(fd);
  }
  return removed;
}

std::optional<std::string> settings_mismatch(const Settings& saved, const Settings& current) {
  auto value_in = [](const Settings& settings, const std::string& name) {
    const auto it = settings.find(name);
    return it == settings.end() ? std::string("(none)") : it->second;
  };
  std::set<std::string> names;
  for (const auto& entry : saved) names.insert(entry.first);
  for (const auto& entry : current) names.insert(entry.first);
  for (const auto& name : names) {
    const std::string a = value_in(saved, name);
    const std::string b = value_in(current, name);
    if (a != b) return name + ": the checkpoint has " + a + ", this run has " + b;
  }
  return std::nullopt;
}

}  // namespace ddp::examples
