// ddprun's parsed configuration where it meets the rendezvous': the defaults
// agree (before: last_call_timeout was 30 s in LaunchConfig and 1 s in
// RendezvousParams), and an etcd password file is read as its one line (before:
// a CRLF file kept its "\r" in the password, which etcd then refused).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "ddp/launcher/launch_config.h"
#include "ddp/rendezvous/rendezvous.h"
#include "ddp/rendezvous/rendezvous_factory.h"
#include "temp_dir.h"

namespace ddp::launcher {
namespace {

using namespace std::chrono_literals;

ParseResult parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

TEST(LaunchConfig, RendezvousDefaultsAgreeWithTheRendezvousOwn) {
  auto parsed = parse({"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29400", "--nnodes=1:2",
                       "--no_python", "/bin/true"});
  ASSERT_TRUE(parsed.config) << parsed.output;
  const RendezvousParams params;
  const RendezvousConfig rendezvous;
  EXPECT_EQ(parsed.config->rendezvous.params.last_call_timeout, params.last_call_timeout);
  EXPECT_EQ(params.last_call_timeout, 30s) << "torchrun's default";
  EXPECT_EQ(parsed.config->rendezvous.params.join_timeout, params.join_timeout);
  EXPECT_EQ(parsed.config->rendezvous.params.keep_alive_interval, params.keep_alive_interval);
  EXPECT_EQ(parsed.config->rendezvous.params.keep_alive_max_attempt, params.keep_alive_max_attempt);
  EXPECT_EQ(parsed.config->rendezvous.keep_alive_write_timeout,
            rendezvous.keep_alive_write_timeout);
  EXPECT_EQ(parsed.config->rendezvous.read_timeout, rendezvous.read_timeout);
}

TEST(LaunchConfig, APasswordFileIsItsFirstLineWithoutItsLineEnd) {
  test::TempDir dir("ddp-launch-config");
  const std::string crlf = (dir.path() / "crlf").string();
  const std::string lf = (dir.path() / "lf").string();
  const std::string empty = (dir.path() / "empty").string();
  std::ofstream(crlf) << "s3cret\r\n";
  std::ofstream(lf) << "s3cret\nsecond line\n";
  std::ofstream(empty) << "\r\n";
  for (const auto& file : {crlf, lf}) {
    auto parsed =
        parse({"--rdzv_backend=etcd", "--rdzv_endpoint=127.0.0.1", "--nnodes=1:2",
               "--rdzv_conf=username=root,password_file=" + file, "--no_python", "/bin/true"});
    ASSERT_TRUE(parsed.config) << parsed.output;
    EXPECT_EQ(parsed.config->rendezvous.etcd.password, "s3cret") << file;
  }
  auto refused =
      parse({"--rdzv_backend=etcd", "--rdzv_endpoint=127.0.0.1", "--nnodes=1:2",
             "--rdzv_conf=username=root,password_file=" + empty, "--no_python", "/bin/true"});
  EXPECT_FALSE(refused.config);
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.output.find("password_file"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("holds no password"), std::string::npos) << refused.output;
}

}  // namespace
}  // namespace ddp::launcher
