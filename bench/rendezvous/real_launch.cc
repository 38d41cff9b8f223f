// rendezvous_bench's real launchers (see rendezvous_bench.cc for what they
// measure): N ddprun (or torchrun) agents started at once on one loopback
// endpoint, each in a process group of its own, output in a temporary folder.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "net_util.h"
#include "process_util.h"
#include "rendezvous_bench.h"
#include "temp_dir.h"

namespace ddp::bench {
namespace {

// Every agent leads a process group of its own (a timeout kills what it
// started too) and dies with the bench.
constexpr test::SpawnOptions kAgent{.own_group = true, .die_with_parent = true};

}  // namespace

std::optional<double> run_real(int n, const std::vector<std::string>& launcher,
                               const std::map<std::string, std::string>& extra_env,
                               const std::string& name, double timeout_s, std::string* why) {
  test::TempDir dir("rdzv-bench-real");
  const std::uint16_t port = test::free_port();
  std::vector<std::string> argv = launcher;
  for (const std::string& a :
       {fmt::format("--nnodes={}", n), std::string("--nproc_per_node=1"),
        std::string("--rdzv_backend=c10d"), fmt::format("--rdzv_endpoint=127.0.0.1:{}", port),
        fmt::format("--rdzv_id={}{}", name, n), std::string("--no_python"),
        std::string("/bin/true")}) {
    argv.push_back(a);
  }
  const auto env = test::environment_with(extra_env);
  std::vector<test::Child> children;
  test::ChildrenGuard guard{children};
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    children.push_back(test::spawn(argv, env, dir.path(), fmt::format("agent{}", i), kAgent));
  }
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
  const bool all = test::wait_children(children, start + timeout);
  if (!all) test::kill_children(children);
  for (int i = 0; i < n; ++i) {
    const test::Child& c = children[static_cast<std::size_t>(i)];
    if (!c.ok()) {
      *why = fmt::format("{} agent {} of {}: {}{}; its stderr:\n{}", name, i, n, c.exit_text(),
                         all ? "" : fmt::format(" (killed after the {:.0f} s timeout)", timeout_s),
                         tail(test::read_text(c.err)));
      return std::nullopt;
    }
  }
  Clock::time_point last = start;
  for (const auto& c : children) last = std::max(last, c.ended);
  return seconds(last - start);
}

}  // namespace ddp::bench
