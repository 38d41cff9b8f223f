// The worker of reform_test: recovers in place and all-reduces its rank + 1
// in a loop, saying on stdout (one line each, flushed) what it sees:
//   ready rank=R world=W pid=P          after init_process_group
//   sum rank=R world=W value=V          the first all-reduce after each (re)formation
//   changed: <what>                     a GroupChanged
//   reformed round=N rank=R world=W     after ddp::reform()
//   node group_rank=G group_world_size=N restart_count=C master=A:P
//                                       after it too: the rest of the round it was told
// After init_process_group and after each reform() it syncs a ReplicaState
// (its count of formations), so its agent hears a `synced` for the round.
//   shutdown: <what>                    reform() said the agent went away (exit 4)
// Its argument is a folder whose files steer it:
//   stop             it leaves (exit 0); every all-reduce carries each rank's
//                    "I saw stop" vote, so all ranks leave after the same
//                    collective (a rank that left alone would leave the others
//                    waiting in one it never issues)
//   crash_rank<R>    the worker of rank R removes it and exits 7 (a crash)
//   no_reform        a GroupChanged ends it (exit 6) instead of a re-form
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/worker/init.h"
#include "ddp/worker/recovery.h"
#include "ddp/worker/replica_state.h"

namespace {

void say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  const std::filesystem::path stop_file = dir / "stop";
  ddp::InitOptions init;
  init.recover_in_place = true;
  init.timeout = std::chrono::seconds(60);
  try {
    ddp::init_process_group(init);
  } catch (const std::exception& e) {
    say(std::string("init failed: ") + e.what());
    return 3;
  }
  say("ready rank=" + std::to_string(ddp::rank()) + " world=" + std::to_string(ddp::world_size()) +
      " pid=" + std::to_string(::getpid()) +
      " in_place=" + std::to_string(ddp::recovers_in_place() ? 1 : 0));
  bool fresh = true;    // no sum said since the last (re)formation
  bool synced = false;  // the state synced since the last (re)formation
  std::int64_t formations = 1;
  ddp::ReplicaState state;
  state.add("formations", &formations);
  for (;;) {
    try {
      if (!synced) {
        state.sync(*ddp::default_group());
        synced = true;
      }
      std::vector<std::int64_t> value = {ddp::rank() + 1,
                                         std::filesystem::exists(stop_file) ? 1 : 0};
      ddp::default_group()->allreduce(ddp::Buffer::of(value))->wait();
      if (value[1] > 0) break;
      const auto crash = dir / ("crash_rank" + std::to_string(ddp::rank()));
      if (std::filesystem::remove(crash)) {
        say("crash");
        return 7;
      }
      if (fresh) {
        say("sum rank=" + std::to_string(ddp::rank()) +
            " world=" + std::to_string(ddp::world_size()) + " value=" + std::to_string(value[0]));
        fresh = false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } catch (const ddp::GroupChanged& e) {
      say(std::string("changed: ") + e.what());
      if (std::filesystem::exists(dir / "no_reform")) return 6;
      for (;;) {
        try {
          const ddp::Reformed r = ddp::reform();
          say("reformed round=" + std::to_string(r.round) + " rank=" + std::to_string(r.rank) +
              " world=" + std::to_string(r.world_size));
          say("node group_rank=" + std::to_string(r.group_rank) +
              " group_world_size=" + std::to_string(r.group_world_size) +
              " restart_count=" + std::to_string(r.restart_count) + " master=" + r.master_addr +
              ":" + std::to_string(r.master_port));
          ++formations;
          fresh = true;
          synced = false;
          break;
        } catch (const ddp::GroupChanged& again) {
          say(std::string("changed: ") + again.what());
        } catch (const ddp::ShutdownError& gone) {
          say(std::string("shutdown: ") + gone.what());
          return 4;
        }
      }
    } catch (const std::exception& e) {
      say(std::string("error: ") + e.what());
      return 5;
    }
  }
  ddp::destroy_process_group();
  return 0;
}
