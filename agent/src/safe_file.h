// Opening files in a log directory that other users may be able to write to
// (a shared --log_dir): a planted symbolic link must not redirect a write or a
// read, and a planted FIFO must not block the agent. Internal to ddp::agent.
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

// The reason an open by open_no_symlinks failed, in words.
inline std::string open_error_text(int err) {
  if (err == ELOOP) return "it is, or lies under, a symbolic link (refused)";
  // O_NONBLOCK|O_WRONLY on a FIFO without a reader.
  if (err == ENXIO) return "it is a FIFO or device without a reader (refused)";
  return std::strerror(err);
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
