// The demo's checkpoints: the file format (version 2 with the run's settings,
// version 1 still read), the removal of temporary files that dead writers left,
// and, with the Fashion-MNIST demo itself, a resume after SIGKILL at the saved
// position, a resume with other settings refused, and a stale temporary file
// removed by the next start.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <map>
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

using ddp::examples::Checkpoint;
using ddp::test::TempDir;

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void put_u64(std::string& out, std::uint64_t v) {
  out.append(reinterpret_cast<const char*>(&v), 8);
}

Checkpoint sample_checkpoint() {
  Checkpoint c;
  c.epoch = 1;
  c.step = 7;
  c.global_step = 71;
  c.world_size = 3;
  c.settings = {
      {"--batch-size", "32"}, {"--lr", "0.05"}, {"training set", "2048 samples, crc32 0badf00d"}};
  c.tensors = {{1.0f, -2.5f, 3.25f}, {}, {0.125f}};
  return c;
}

TEST(CheckpointFormat, RoundTripsEverything) {
  TempDir dir;
  const auto path = (dir.path() / "c.bin").string();
  const Checkpoint c = sample_checkpoint();
  ddp::examples::save_checkpoint(path, c);
  const auto back = ddp::examples::load_checkpoint(path);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->epoch, c.epoch);
  EXPECT_EQ(back->step, c.step);
  EXPECT_EQ(back->global_step, c.global_step);
  EXPECT_EQ(back->world_size, c.world_size);
  EXPECT_EQ(back->settings, c.settings);
  EXPECT_EQ(back->tensors, c.tensors);
  // Saving the same state again writes the same bytes, and leaves no temporary file.
  const std::string first = read_bytes(path);
  ddp::examples::save_checkpoint(path, *back);
  EXPECT_EQ(read_bytes(path), first);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
  EXPECT_FALSE(ddp::examples::load_checkpoint((dir.path() / "missing.bin").string()).has_value());
}

TEST(CheckpointFormat, ReadsVersion1WithoutSettings) {
  TempDir dir;
  std::string bytes = "DDPCKPT1";
  for (std::uint64_t v : {2, 5, 69, 2}) put_u64(bytes, v);  // epoch, step, global step, world size
  put_u64(bytes, 1);                                        // one tensor
  put_u64(bytes, 2);
  const float values[2] = {0.5f, -1.0f};
  bytes.append(reinterpret_cast<const char*>(values), sizeof values);
  write_bytes(dir.path() / "v1.bin", bytes);
  const auto c = ddp::examples::load_checkpoint((dir.path() / "v1.bin").string());
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->global_step, 69u);
  EXPECT_TRUE(c->settings.empty());
  ASSERT_EQ(c->tensors.size(), 1u);
  EXPECT_EQ(c->tensors[0], (std::vector<float>{0.5f, -1.0f}));
}

TEST(CheckpointFormat, RefusesCorruptFiles) {
  TempDir dir;
  const auto path = (dir.path() / "c.bin").string();
  ddp::examples::save_checkpoint(path, sample_checkpoint());
  const std::string good = read_bytes(path);
  auto refused = [&](const std::string& bytes, const std::string& why) {
    write_bytes(path, bytes);
    try {
      ddp::examples::load_checkpoint(path);
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << why;
  };
  refused(good.substr(0, good.size() - 1), "truncated");
  refused(good + "x", "bytes after the last tensor");
  refused("DDPCKPT9" + good.substr(8), "bad magic");
  refused("", "truncated");
}

TEST(CheckpointSettings, NamesTheFirstDifference) {
  using ddp::examples::settings_mismatch;
  const ddp::examples::Settings a = {{"--batch-size", "32"}, {"--seed", "0"}};
  EXPECT_FALSE(settings_mismatch(a, a).has_value());
  EXPECT_EQ(settings_mismatch(a, {{"--batch-size", "64"}, {"--seed", "0"}}).value_or(""),
            "--batch-size: the checkpoint has 32, this run has 64");
  EXPECT_EQ(settings_mismatch(a, {{"--batch-size", "32"}}).value_or(""),
            "--seed: the checkpoint has 0, this run has (none)");
  EXPECT_EQ(settings_mismatch({{"--batch-size", "32"}}, a).value_or(""),
            "--seed: the checkpoint has (none), this run has 0");
}

// A child that holds an exclusive flock on `file` (as a live writer does) until killed.
pid_t hold_lock(const fs::path& file) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT, 0644);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(1);
    (void)!::write(ready[1], "x", 1);
    while (true) ::pause();
  }
  ::close(ready[1]);
  char c;
  const bool ok = ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  return ok ? pid : -1;
}

TEST(CheckpointTemporaries, RemovesOnlyThoseOfDeadWriters) {
  TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt.bin";
  write_bytes(ckpt, "the checkpoint");
  write_bytes(dir.path() / "ckpt.bin.tmp.123", "a dead writer's");  // nobody holds its lock
  write_bytes(dir.path() / "ckpt.bin.tmp.4567", "another dead one");
  write_bytes(dir.path() / "ckpt.bin.tmp.x1", "not a writer's name");
  write_bytes(dir.path() / "other.bin.tmp.99", "another checkpoint's");
  fs::create_directory(dir.path() / "ckpt.bin.tmp.77");             // not a regular file
  const pid_t writer = hold_lock(dir.path() / "ckpt.bin.tmp.999");  // a live writer
  ASSERT_GT(writer, 0);

  auto removed = ddp::examples::remove_stale_temporaries(ckpt.string());
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (std::vector<std::string>{(dir.path() / "ckpt.bin.tmp.123").string(),
                                               (dir.path() / "ckpt.bin.tmp.4567").string()}));
  EXPECT_TRUE(fs::exists(dir.path() / "ckpt.bin.tmp.999"));
  EXPECT_TRUE(fs::exists(dir.path() / "ckpt.bin.tmp.x1"));
  EXPECT_TRUE(fs::exists(dir.path() / "other.bin.tmp.99"));
  EXPECT_TRUE(fs::exists(dir.path() / "ckpt.bin.tmp.77"));
  EXPECT_EQ(read_bytes(ckpt), "the checkpoint");

  // Once its writer is gone, its file is stale too.
  ::kill(writer, SIGKILL);
  ::waitpid(writer, nullptr, 0);
  EXPECT_EQ(ddp::examples::remove_stale_temporaries(ckpt.string()),
            (std::vector<std::string>{(dir.path() / "ckpt.bin.tmp.999").string()}));
  EXPECT_TRUE(
      ddp::examples::remove_stale_temporaries((dir.path() / "no-such-dir" / "c.bin").string())
          .empty());
}

TEST(DemoCheckpoint, ResumesAfterKill) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt.bin";
  // 2048 samples / batch 32 = 64 steps per epoch, 2 epochs, a checkpoint every 4 steps.
  const std::vector<std::string> args = {
      demo_binary(), "--train-limit",      "2048", "--test-limit", "500", "--batch-size",
      "32",          "--epochs",           "2",    "--hidden",     "64",  "--checkpoint",
      ckpt.string(), "--checkpoint-every", "4",    "--log-every",  "1"};
  std::vector<std::string> slow = args;
  slow.insert(slow.end(), {"--throttle-ms", "25"});
  const pid_t first = spawn(slow, dir.path() / "run1.log");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(ckpt) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(
      std::chrono::milliseconds(150));  // a few more steps, maybe a newer checkpoint
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
  resumed << "resumed from checkpoint " << ckpt.string() << " at epoch " << saved->epoch + 1
          << " step " << saved->step << " (global step " << saved->global_step << ")";
  EXPECT_NE(out.find(resumed.str()), std::string::npos) << out;
  // The first step trained after the restart is the one after the saved
  // position: the next global step, one global batch further into the epoch.
  std::ostringstream next, where;
  next << "epoch " << saved->epoch + 1 << "/2 step " << saved->global_step + 1 << " loss ";
  where << "(" << (saved->step + 1) * 32 << "/2048 samples, " << std::fixed << std::setprecision(1)
        << 100.0 * (saved->step + 1) * 32 / 2048 << "%; world 1: 64 steps an epoch)";
  const auto p = out.find("/2 step ");
  ASSERT_NE(p, std::string::npos) << out;
  const auto line_start = out.rfind('\n', p) + 1;  // npos + 1 == 0 for the first line
  const std::string line = out.substr(line_start, out.find('\n', p) - line_start);
  EXPECT_EQ(line.rfind(next.str(), 0), 0u) << line;
  EXPECT_TRUE(line.ends_with(where.str())) << line << "\nwanted the end: " << where.str();
  if (saved->epoch == 0) {
    EXPECT_EQ(out.find("epoch 1/2 step 1 loss "), std::string::npos) << out;
  }
  EXPECT_NE(out.find("final test accuracy: "), std::string::npos) << out;
  const auto final_ckpt = ddp::examples::load_checkpoint(ckpt.string());
  ASSERT_TRUE(final_ckpt.has_value());
  EXPECT_EQ(final_ckpt->global_step, 128u);
  EXPECT_EQ(final_ckpt->epoch, 2u);
}

// A small run of the demo (16 steps) checkpointing to `ckpt`; `changes` replace or add flags.
std::vector<std::string> small_run(const fs::path& ckpt,
                                   const std::map<std::string, std::string>& changes = {}) {
  std::map<std::string, std::string> flags = {{"--train-limit", "512"},
                                              {"--test-limit", "100"},
                                              {"--batch-size", "32"},
                                              {"--epochs", "1"},
                                              {"--hidden", "16"},
                                              {"--log-every", "100"},
                                              {"--checkpoint", ckpt.string()}};
  for (const auto& [flag, value] : changes) flags[flag] = value;
  std::vector<std::string> args = {demo_binary()};
  for (const auto& [flag, value] : flags) args.insert(args.end(), {flag, value});
  return args;
}

TEST(DemoCheckpoint, RefusesToResumeWithOtherSettings) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt.bin";
  ASSERT_EQ(wait_exit(spawn(small_run(ckpt, {{"--max-steps", "3"}}), dir.path() / "run1.log")), 0)
      << read_file(dir.path() / "run1.log");
  const std::string saved = read_bytes(ckpt);
  const auto c = ddp::examples::load_checkpoint(ckpt.string());
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->global_step, 3u);
  EXPECT_EQ(c->settings.at("--batch-size"), "32");
  EXPECT_EQ(c->settings.at("--seed"), "0");
  EXPECT_EQ(c->settings.at("--hidden"), "16");
  EXPECT_EQ(c->settings.at("--lr"), "0.05");
  EXPECT_EQ(c->settings.at("training set").rfind("512 samples, crc32 ", 0), 0u);

  // Each of these would train something else than the run that wrote it.
  const std::vector<std::pair<std::string, std::string>> changes = {
      {"--batch-size", "16"}, {"--seed", "7"},
      {"--lr", "0.1"},        {"--epochs", "2"},
      {"--hidden", "16,8"},   {"--comm-hook", "fp16"},
      {"--momentum", "0.8"},  {"--weight-decay", "0.25"},
      {"--accumulate", "2"}};
  for (const auto& [flag, value] : changes) {
    const fs::path log = dir.path() / "refused.log";
    EXPECT_EQ(wait_exit(spawn(small_run(ckpt, {{flag, value}}), log)), 1) << flag;
    const std::string out = read_file(log);
    EXPECT_NE(
        out.find("was written by a run with other settings (" + flag + ": the checkpoint has "),
        std::string::npos)
        << out;
    EXPECT_NE(out.find("this run has " + value + ")"), std::string::npos) << out;
    EXPECT_EQ(read_bytes(ckpt), saved) << "a refused resume must not touch the checkpoint";
  }
  {  // another training set
    const fs::path log = dir.path() / "refused.log";
    EXPECT_EQ(wait_exit(spawn(small_run(ckpt, {{"--train-limit", "640"}}), log)), 1);
    const std::string out = read_file(log);
    EXPECT_NE(out.find("(training set: the checkpoint has 512 samples, crc32 "), std::string::npos)
        << out;
    EXPECT_NE(out.find("this run has 640 samples, crc32 "), std::string::npos) << out;
  }
  // The same settings resume, whatever the logging, checkpointing or throttling.
  const fs::path log = dir.path() / "run2.log";
  ASSERT_EQ(wait_exit(spawn(small_run(ckpt, {{"--log-every", "1"},
                                             {"--checkpoint-every", "5"},
                                             {"--throttle-ms", "1"},
                                             {"--test-limit", "50"}}),
                            log)),
            0)
      << read_file(log);
  EXPECT_NE(read_file(log).find("(global step 3)"), std::string::npos) << read_file(log);
  EXPECT_NE(read_file(dir.path() / "run2.log").find("(global step 3)"), std::string::npos);
}

TEST(DemoCheckpoint, NextStartRemovesATemporaryFileOfADeadWriter) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt.bin";
  // What rank 0 leaves when it is killed in the middle of save_checkpoint.
  write_bytes(dir.path() / "ckpt.bin.tmp.4194301", "DDPCKPT2 half-writ");
  const fs::path log = dir.path() / "run.log";
  ASSERT_EQ(wait_exit(spawn(small_run(ckpt), log)), 0) << read_file(log);
  EXPECT_NE(read_file(log).find("removed " + (dir.path() / "ckpt.bin.tmp.4194301").string()),
            std::string::npos)
      << read_file(log);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir.path()))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"ckpt.bin", "run.log"}));
}

}  // namespace
