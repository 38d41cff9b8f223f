#include "checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace ddp::examples {
namespace {

constexpr char kMagic[8] = {'D', 'D', 'P', 'C', 'K', 'P', 'T', '1'};

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

void put_u64(std::string& out, std::uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& ckpt) {
  std::string bytes(kMagic, sizeof kMagic);
  put_u64(bytes, ckpt.epoch);
  put_u64(bytes, ckpt.step);
  put_u64(bytes, ckpt.global_step);
  put_u64(bytes, ckpt.world_size);
  put_u64(bytes, ckpt.tensors.size());
  for (const auto& t : ckpt.tensors) {
    put_u64(bytes, t.size());
    bytes.append(reinterpret_cast<const char*>(t.data()), t.size() * sizeof(float));
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(tmp + ": cannot create: " + std::strerror(errno));
  try {
    write_all(fd, bytes.data(), bytes.size(), tmp);
    if (::fsync(fd) != 0) throw std::runtime_error(tmp + ": fsync failed: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error(path + ": rename failed: " + std::strerror(err));
  }
  // Make the rename itself durable.
  std::string dir = path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
  if (dir.empty()) dir = path.find('/') == 0 ? "/" : ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::optional<Checkpoint> load_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  auto fail = [&](const char* what) { return std::runtime_error(path + ": corrupt checkpoint (" + what + ")"); };
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) throw fail("bad magic");
  auto get = [&] {
    std::uint64_t v = 0;
    if (!in.read(reinterpret_cast<char*>(&v), 8)) throw fail("truncated");
    return v;
  };
  Checkpoint c;
  c.epoch = get();
  c.step = get();
  c.global_step = get();
  c.world_size = get();
  const std::uint64_t n = get();
  if (n > 4096) throw fail("too many tensors");
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t count = get();
    if (count > (std::uint64_t{1} << 32)) throw fail("tensor too large");
    std::vector<float> t(count);
    if (!in.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(count * sizeof(float)))) {
      throw fail("truncated tensor");
    }
    c.tensors.push_back(std::move(t));
  }
  return c;
}

}  // namespace ddp::examples
