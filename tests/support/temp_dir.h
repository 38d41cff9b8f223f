// A temporary directory for a test, removed with everything in it.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace ddp::test {

class TempDir {
 public:
  // Created under the system's temporary directory as "<prefix>-XXXXXX". The
  // path is resolved (no symbolic links), since the launcher refuses log and
  // error files behind one. Aborts when no directory can be made.
  explicit TempDir(const std::string& prefix = "ddp-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
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
