// ddprun's check of a Python program's interpreter after a failure: whether it
// finds torch (asked of real interpreters) and the note that names PYTHON_EXEC.
#include "ddp/launcher/python_check.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <string>

#include "temp_dir.h"

namespace ddp::launcher {
namespace {

using namespace std::chrono_literals;

// An executable shell script `name` in `dir` with `body` after its #! line.
std::string write_script(const test::TempDir& dir, const std::string& name,
                         const std::string& body) {
  const std::string path = (dir.path() / name).string();
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  ::chmod(path.c_str(), 0755);
  return path;
}

bool system_python_has_torch() {
  return std::system(
             "/usr/bin/python3 -c 'import importlib.util, sys; "
             "sys.exit(importlib.util.find_spec(\"torch\") is None)' 2>/dev/null") == 0;
}

TEST(PythonFindsTorch, TrueForAPythonWithTorch) {
  if (!system_python_has_torch()) GTEST_SKIP() << "/usr/bin/python3 has no torch";
  EXPECT_EQ(python_finds_torch("/usr/bin/python3", 30s), std::optional<bool>(true));
}

TEST(PythonFindsTorch, FalseForAPythonWithoutIt) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  test::TempDir dir("ddp-python-check");
  // -S leaves out site-packages and dist-packages, where torch lives.
  const std::string bare = write_script(dir, "python3", "exec /usr/bin/python3 -S \"$@\"");
  EXPECT_EQ(python_finds_torch(bare, 30s), std::optional<bool>(false));
}

TEST(PythonFindsTorch, UnknownWhenThePythonCannotAnswer) {
  test::TempDir dir("ddp-python-check");
  EXPECT_EQ(python_finds_torch((dir.path() / "missing").string(), 30s), std::nullopt);
  EXPECT_EQ(python_finds_torch(write_script(dir, "fails", "exit 3"), 30s), std::nullopt);
  EXPECT_EQ(python_finds_torch(write_script(dir, "chatty", "echo maybe"), 30s), std::nullopt);
  // One that never answers is killed at the timeout.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(python_finds_torch(write_script(dir, "hangs", "exec sleep 60"), 300ms), std::nullopt);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

TEST(MissingTorchNote, NamesThePythonAndPythonExec) {
  const std::string note =
      missing_torch_note("train.py", "/home/u/venv/bin/python3", PythonSource::kPath);
  EXPECT_EQ(note,
            "ddprun: note: the workers ran train.py with /home/u/venv/bin/python3 (the first "
            "python3 on PATH), which has no module named 'torch'\n"
            "ddprun: note: if train.py uses PyTorch, set PYTHON_EXEC to a Python that has it, "
            "e.g. PYTHON_EXEC=/usr/bin/python3 ddprun ...\n");
  const std::string from_exec =
      missing_torch_note("pkg.train", "/usr/bin/python3", PythonSource::kPythonExec);
  EXPECT_NE(from_exec.find("ran pkg.train with /usr/bin/python3 ($PYTHON_EXEC), which has no "
                           "module named 'torch'\n"),
            std::string::npos)
      << from_exec;
  // Never the lacking Python itself as the example.
  EXPECT_EQ(from_exec.find("PYTHON_EXEC=/usr/bin/python3"), std::string::npos) << from_exec;
  EXPECT_NE(from_exec.find("e.g. PYTHON_EXEC=/path/to/venv/bin/python3"), std::string::npos)
      << from_exec;
}

}  // namespace
}  // namespace ddp::launcher
