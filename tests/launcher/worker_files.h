// What ddprun_test_worker's "elastic" mode leaves in its directory
// (test_worker.cc): one file "ws<WORLD_SIZE>_r<RANK>_<pid>" per worker, written
// through a ".tmp" file and renamed, so a listed file is complete.
//
// Ownership: none. Blocking: a directory listing. Thread-safety: any thread.
// Errors: std::filesystem::filesystem_error when `dir` cannot be listed.
#pragma once

#include <filesystem>
#include <string>

namespace ddp::test {

// Workers in `dir` that announced WORLD_SIZE = `world`.
inline int workers_with_world(const std::filesystem::path& dir, int world) {
  int n = 0;
  const std::string prefix = "ws" + std::to_string(world) + "_";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0 &&
        entry.path().extension() != ".tmp")
      ++n;
  }
  return n;
}

}  // namespace ddp::test
