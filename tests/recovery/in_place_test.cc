// ddp::in_place (ddp/worker/recovery.h), the steps of in-place recovery for a
// program that makes its own groups, in this process: the test holds the
// agent's end of the control channel (DDP_CONTROL_FD, a socket pair) and says
// what ddprun's agent says (abort, round). The channel opens once per process
// and gtest_discover_tests runs each test in a process of its own.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/store/memory_store.h"
#include "ddp/worker/process_group_gloo.h"
#include "ddp/worker/recovery.h"
#include "ddp/worker_contract/control_channel.h"
#include "ddp/worker_contract/worker_contract.h"
#include "process_util.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;

class InPlaceSeamTest : public ::testing::Test {
 protected:
  // The environment ddprun gives a worker of round 0 (rank 0 of 1), and the
  // worker's end of the control channel.
  void SetUp() override {
    auto [agent_fd, worker_fd] = control::make_socket_pair();
    agent_fd_ = agent_fd;
    for (const auto& [name, value] : contract::environment_of(round_of(0, 0, 1))) {
      ::setenv(name.c_str(), value.c_str(), 1);
    }
    ::setenv("DDP_CONTROL_FD", std::to_string(worker_fd).c_str(), 1);
  }
  void TearDown() override { ::close(agent_fd_); }

  // Round `number` as ddprun's agent names it to a worker of rank `rank` (one a node).
  static contract::WorkerRound round_of(int number, int rank, int world) {
    contract::WorkerRound round;
    round.round = number;
    round.rank = rank;
    round.world_size = world;
    round.group_rank = rank;
    round.group_world_size = world;
    round.master_addr = "127.0.0.1";
    round.master_port = 29555;
    round.store_addr = "127.0.0.1";
    round.store_port = 1;  // never reached: the groups here meet in a MemoryStore
    round.store_prefix = "round" + std::to_string(number) + "/workers";
    round.change_grace = 500ms;  // how long a failed collective waits for the agent's word
    return round;
  }

  void tell(const control::Message& message) {
    ASSERT_EQ(control::send(agent_fd_, message), control::Sent::kSent);
  }

  // The next message the worker sent (at most 10 s).
  control::Message heard() {
    control::Message message;
    const bool got = test::eventually(
        [&] { return control::receive(agent_fd_, message, false) == control::Received::kMessage; },
        10s, 5ms);
    EXPECT_TRUE(got) << "the worker said nothing";
    return message;
  }

  static std::shared_ptr<ProcessGroup> world_of_one(std::shared_ptr<Store> store) {
    GlooOptions options;
    options.hostname = "127.0.0.1";
    options.timeout = 30s;
    options.on_failure = in_place::failure_explainer();
    return make_gloo_process_group(std::move(store), 0, 1, options);
  }

  int agent_fd_ = -1;
};

TEST_F(InPlaceSeamTest, OpensOnceAndSaysHello) {
  EXPECT_FALSE(in_place::is_open());
  ASSERT_TRUE(in_place::open());
  EXPECT_TRUE(in_place::open());  // the same channel
  EXPECT_TRUE(in_place::is_open());
  const auto hello = contract::decode_hello(heard());
  ASSERT_TRUE(hello.has_value());
  EXPECT_TRUE(hello->in_place);
  EXPECT_EQ(hello->pid, ::getpid());
  control::Message more;
  EXPECT_EQ(control::receive(agent_fd_, more, false), control::Received::kNothing) << more.type;
}

TEST_F(InPlaceSeamTest, TheRoundsEndAbortsItsTrackedGroupsAndTellsItsNumber) {
  ASSERT_TRUE(in_place::open());
  auto group = world_of_one(std::make_shared<MemoryStore>());
  in_place::track(group);
  const in_place::RoundNow before = in_place::current_round();
  EXPECT_EQ(before.generation, 0);
  EXPECT_EQ(before.number, -1);  // the environment does not name it
  EXPECT_FALSE(before.ended);
  std::vector<float> data{1, 2};
  group->allreduce(Buffer::of(data))->wait();  // a live group

  tell(contract::encode(contract::Abort{4, "node 1 was lost"}));
  ASSERT_TRUE(test::eventually([] { return in_place::current_round().ended; }, 10s, 5ms));
  const in_place::RoundNow after = in_place::current_round();
  EXPECT_EQ(after.generation, 0);
  EXPECT_EQ(after.number, 4);  // learnt from the abort
  EXPECT_EQ(after.why, "node 1 was lost");
  EXPECT_EQ(in_place::round_number(0), 4);
  EXPECT_EQ(in_place::round_number(1), -1);
  try {
    group->allreduce(Buffer::of(data))->wait();
    FAIL() << "the aborted group's allreduce succeeded";
  } catch (const GroupChanged& e) {
    EXPECT_NE(std::string(e.what()).find("node 1 was lost"), std::string::npos) << e.what();
  }
  // A group tracked after its round ended is aborted at once.
  auto late = world_of_one(std::make_shared<MemoryStore>());
  in_place::track(late);
  EXPECT_THROW(late->allreduce(Buffer::of(data))->wait(), GroupChanged);
}

TEST_F(InPlaceSeamTest, TheNextRoundBecomesTheCurrentOneAndReformedIsReported) {
  ASSERT_TRUE(in_place::open());
  heard();  // hello
  tell(contract::encode(contract::Abort{2, "a new node asked to join"}));
  const contract::WorkerRound next = round_of(3, 1, 2);
  tell(contract::encode(next));
  const contract::WorkerRound joined = in_place::wait_next_round(10s);
  EXPECT_EQ(joined, next);
  const in_place::RoundNow now = in_place::current_round();
  EXPECT_EQ(now.generation, 1);
  EXPECT_EQ(now.number, 3);
  EXPECT_FALSE(now.ended);
  EXPECT_EQ(in_place::round_number(0), 2);

  // The new round's store ends its waits when that round ends.
  auto store = in_place::round_store(std::make_shared<MemoryStore>());
  store->set("k", "v");
  tell(contract::encode(contract::Abort{3, "node 0 was lost"}));
  ASSERT_TRUE(test::eventually([] { return in_place::current_round().ended; }, 10s, 5ms));
  EXPECT_THROW(store->get("never set"), GroupChanged);

  EXPECT_TRUE(in_place::report_reformed(joined, 0.5, 0.25));
  const auto reformed = contract::decode_reformed(heard());
  ASSERT_TRUE(reformed.has_value());
  EXPECT_EQ(reformed->round, 3);
  EXPECT_EQ(reformed->rank, 1);
  EXPECT_DOUBLE_EQ(reformed->wait_seconds, 0.5);
  EXPECT_DOUBLE_EQ(reformed->build_seconds, 0.25);
}

TEST_F(InPlaceSeamTest, AFailureIsGroupChangedWhenTheRoundEndsWithinTheGrace) {
  ASSERT_TRUE(in_place::open());
  const auto explain = in_place::failure_explainer();
  ASSERT_TRUE(explain);
  const auto broken = std::make_exception_ptr(NetworkError("test", "the peer's connection broke"));
  // No word from the agent: after the grace (500 ms), the failure as it was.
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(explain(broken), broken);
  EXPECT_GE(std::chrono::steady_clock::now() - started, 500ms);
  // The word comes within the grace: GroupChanged, naming why.
  std::thread agent([this] {
    std::this_thread::sleep_for(100ms);
    tell(contract::encode(contract::Abort{1, "node 3 was lost"}));
  });
  const auto explained = explain(broken);
  agent.join();
  try {
    std::rethrow_exception(explained);
  } catch (const GroupChanged& e) {
    EXPECT_NE(std::string(e.what()).find("node 3 was lost"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    FAIL() << "not GroupChanged: " << e.what();
  }
}

TEST_F(InPlaceSeamTest, ARoundForAnotherLocalRankIsAProtocolError) {
  ASSERT_TRUE(in_place::open());
  contract::WorkerRound next = round_of(1, 1, 2);
  next.local_rank = 1;  // this worker is local rank 0
  next.local_world_size = 2;
  tell(contract::encode(next));
  EXPECT_THROW(in_place::wait_next_round(10s), ProtocolError);
}

TEST_F(InPlaceSeamTest, OutsideDdprunNothingChanges) {
  ::unsetenv("DDP_STORE_ADDR");
  EXPECT_FALSE(in_place::open());
  EXPECT_FALSE(in_place::is_open());
  EXPECT_FALSE(in_place::failure_explainer());
  auto base = std::make_shared<MemoryStore>();
  EXPECT_EQ(in_place::round_store(base), base);
  EXPECT_THROW(in_place::wait_next_round(1s), InvalidArgument);
  EXPECT_FALSE(in_place::report_reformed(contract::WorkerRound{}, 0, 0));
  EXPECT_EQ(in_place::current_round().generation, 0);
  EXPECT_FALSE(in_place::current_round().ended);
}

}  // namespace
}  // namespace ddp
