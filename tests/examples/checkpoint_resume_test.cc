// The Fashion-MNIST demo is killed (SIGKILL) mid-run after it wrote a
// checkpoint; started again with the same flags it resumes at the saved
// position (epoch, step, global step) and trains to the end.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;

std::string demo_binary() {
  const char* dir = std::getenv("DDP_BUILD_BIN");
  return std::string(dir ? dir : "build/bin") + "/train_fashion_mnist";
}

// Starts the demo alone (no launcher environment) with stdout+stderr to `log`.
pid_t spawn(const std::vector<std::string>& args, const fs::path& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::unsetenv("RANK");
    ::unsetenv("WORLD_SIZE");
    ::unsetenv("DDP_STORE_ADDR");
    FILE* out = std::fopen(log.c_str(), "w");
    if (out == nullptr) ::_exit(126);
    ::dup2(::fileno(out), 1);
    ::dup2(::fileno(out), 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using ddp::test::TempDir;

TEST(DemoCheckpoint, ResumesAfterKill) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt.bin";
  // 2048 samples / batch 32 = 64 steps per epoch, 2 epochs, a checkpoint every 4 steps.
  const std::vector<std::string> args = {demo_binary(), "--train-limit", "2048", "--test-limit", "500",
                                         "--batch-size", "32", "--epochs", "2", "--hidden", "64",
                                         "--checkpoint", ckpt.string(), "--checkpoint-every", "4",
                                         "--log-every", "1"};
  std::vector<std::string> slow = args;
  slow.insert(slow.end(), {"--throttle-ms", "25"});
  const pid_t first = spawn(slow, dir.path() / "run1.log");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(ckpt) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // a few more steps, maybe a newer checkpoint
  ::kill(first, SIGKILL);
  ASSERT_EQ(wait_exit(first), 128 + SIGKILL) << read_file(dir.path() / "run1.log");

  const auto saved = ddp::examples::load_checkpoint(ckpt.string());
  ASSERT_TRUE(saved.has_value());
  ASSERT_GT(saved->global_step, 0u);
  ASSERT_LT(saved->global_step, 128u) << "the first run finished before it was killed";
  EXPECT_EQ(saved->world_size, 1u);
  EXPECT_EQ(saved->epoch * 64 + saved->step, saved->global_step);

  const pid_t second = spawn(args, dir.path() / "run2.log");
  ASSERT_EQ(wait_exit(second), 0) << read_file(dir.path() / "run2.log");
  const std::string out = read_file(dir.path() / "run2.log");
  std::ostringstream resumed;
  resumed << "resumed from checkpoint " << ckpt.string() << " at epoch " << saved->epoch + 1 << " step "
          << saved->step << " (global step " << saved->global_step << ")";
  EXPECT_NE(out.find(resumed.str()), std::string::npos) << out;
  // The first step trained after the restart is the one after the saved position.
  std::ostringstream next;
  next << "epoch " << saved->epoch + 1 << "/2 step " << saved->step + 1 << "/64 ";
  const auto p = out.find("/2 step ");
  ASSERT_NE(p, std::string::npos) << out;
  const auto line_start = out.rfind('\n', p) + 1;  // npos + 1 == 0 for the first line
  const std::string line = out.substr(line_start, out.find('\n', p) - line_start);
  EXPECT_EQ(line.rfind(next.str(), 0), 0u) << line;
  if (saved->epoch == 0) {
    EXPECT_EQ(out.find("epoch 1/2 step 1/64 "), std::string::npos) << out;
  }
  EXPECT_NE(out.find("final test accuracy: "), std::string::npos) << out;
  const auto final_ckpt = ddp::examples::load_checkpoint(ckpt.string());
  ASSERT_TRUE(final_ckpt.has_value());
  EXPECT_EQ(final_ckpt->global_step, 128u);
  EXPECT_EQ(final_ckpt->epoch, 2u);
}

}  // namespace
