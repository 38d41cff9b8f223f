// A temporary directory for a test or a benchmark, removed with everything in
// it when the TempDir is destroyed.
//
// Ownership: the TempDir owns the directory (not copyable). Blocking: the
// constructor and destructor touch the file system. Thread-safety: path() may
// be read from any thread; one thread destroys it. Errors: the constructor
// throws std::runtime_error when no directory can be made; removal errors
// are ignored (a crashed test leaves its directory behind).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "sys_error.h"

namespace ddp::test {

class TempDir {
 public:
  // Created under the system's temporary directory as "<prefix>-XXXXXX". The
  // path is resolved (no symbolic links), since the launcher refuses log and
  // error files behind one.
  explicit TempDir(const std::string& prefix = "ddp-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw sys_error("mkdtemp " + pattern);
    path_ = std::filesystem::canonical(pattern);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace ddp::test
