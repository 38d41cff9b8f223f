// Opening files in a log directory that other users may be able to write to
// (a shared --log_dir): a planted symbolic link must not redirect a write or a
// read, and a planted FIFO must not block the agent; and writing them whole.
// Internal to ddp::agent.
#pragma once

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace ddp::agent::detail {

// Opens `path` with `flags` (O_CLOEXEC and O_NOFOLLOW are always added) and
// refuses a symbolic link in ANY component of the path, where the kernel can
// (openat2 with RESOLVE_NO_SYMLINKS, Linux 5.6+; ELOOP when one is met).
// Where openat2 is unavailable (ENOSYS, or EPERM from a seccomp filter) only
// the final component is checked (O_NOFOLLOW). Callers therefore pass paths
// whose directories ddprun resolved itself (main.cc canonicalizes --log_dir).
// Returns the descriptor, or -1 with errno set.
inline int open_no_symlinks(const std::string& path, int flags, mode_t mode = 0) {
  flags |= O_CLOEXEC | O_NOFOLLOW;
  open_how how{};
  how.flags = static_cast<__u64>(flags);
  // openat2 rejects a non-zero mode unless a file may be created.
  how.mode = (flags & O_CREAT) != 0 ? mode : 0;
  how.resolve = RESOLVE_NO_SYMLINKS;
  long fd;
  do {
    fd = ::syscall(SYS_openat2, AT_FDCWD, path.c_str(), &how, sizeof(how));
  } while (fd < 0 && errno == EINTR);
  if (fd >= 0 || (errno != ENOSYS && errno != EPERM)) return static_cast<int>(fd);
  do {
    fd = ::open(path.c_str(), flags, mode);
  } while (fd < 0 && errno == EINTR);
  return static_cast<int>(fd);
}

// Creates the directories of `relative` (components separated by '/') below
// the existing directory `base`, one at a time relative to its parent's
// descriptor, never following a symbolic link: a link planted at any
// component is refused (ELOOP) before anything is created through it.
// Returns 0, or the errno of the first step that failed.
inline int make_directories_no_symlinks(const std::string& base, const std::string& relative) {
  int dir = open_no_symlinks(base, O_RDONLY | O_DIRECTORY);
  if (dir < 0) return errno;
  std::size_t start = 0;
  while (start < relative.size()) {
    std::size_t end = relative.find('/', start);
    if (end == std::string::npos) end = relative.size();
    const std::string name = relative.substr(start, end - start);
    start = end + 1;
    if (name.empty()) continue;
    if (::mkdirat(dir, name.c_str(), 0755) != 0 && errno != EEXIST) {
      int err = errno;
      ::close(dir);
      return err;
    }
    int next = ::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int err = errno;
    ::close(dir);
    if (next < 0) return err == ENOTDIR ? ELOOP : err;  // O_NOFOLLOW on a link: ELOOP or ENOTDIR
    dir = next;
  }
  ::close(dir);
  return 0;
}

// The reason an open by open_no_symlinks failed, in words.
inline std::string open_error_text(int err) {
  if (err == ELOOP) return "it is, or lies under, a symbolic link (refused)";
  // O_NONBLOCK|O_WRONLY on a FIFO without a reader.
  if (err == ENXIO) return "it is a FIFO or device without a reader (refused)";
  return std::strerror(err);
}

// Writes all `size` bytes of `data` to `fd`, retrying after EINTR and short
// writes. False when a write failed (the console gone, a full disk); how much
// reached the file is then unknown.
inline bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

// "a FIFO", "a directory", ... for a refused file type.
inline std::string file_type_text(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

}  // namespace ddp::agent::detail
