// The worker's side of the progress page: which descriptors it maps, what a
// process group and the Reducer record there, and the WorkTracker's
// completion hook (NCCL's completions as the watchdog sees them).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <new>
#include <thread>

#include "ddp/store/memory_store.h"
#include "ddp/worker/ddp.h"
#include "ddp/worker/step_recorder.h"
#include "ddp/worker_contract/env_names.h"
#include "progress_recorder.h"
#include "test_util.h"
#include "work_tracker.h"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;

// A page as the agent makes it (agent/src/progress_page_file.cc), unless told
// to leave out a step. The test keeps a mapping of its own.
struct AgentPage {
  int fd = -1;
  progress::Page* page = nullptr;
  explicit AgentPage(bool seal = true, std::size_t bytes = progress::kPageBytes) {
    fd = ::memfd_create("test-progress", MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
    if (seal) {
      EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK), 0);
    }
    void* memory = ::mmap(nullptr, progress::kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(memory, MAP_FAILED);
    page = new (memory) progress::Page();
  }
  std::string fd_text() const { return std::to_string(fd); }
  bool fd_open() const { return ::fcntl(fd, F_GETFD) >= 0; }
};

TEST(ProgressPage, OnlyAnAgentsSealedOnePageMemfdIsMapped) {
  EXPECT_EQ(detail::map_progress_page(nullptr), nullptr);
  EXPECT_EQ(detail::map_progress_page(""), nullptr);
  EXPECT_EQ(detail::map_progress_page("2"), nullptr);      // stderr: never
  EXPECT_EQ(detail::map_progress_page("7x"), nullptr);     // not a number
  EXPECT_EQ(detail::map_progress_page("99999"), nullptr);  // not open

  AgentPage unsealed(false);
  EXPECT_EQ(detail::map_progress_page(unsealed.fd_text().c_str()), nullptr);
  EXPECT_TRUE(unsealed.fd_open());

  AgentPage wrong_magic;
  wrong_magic.page->magic = 0;
  EXPECT_EQ(detail::map_progress_page(wrong_magic.fd_text().c_str()), nullptr);
  EXPECT_TRUE(wrong_magic.fd_open());

  // A regular file never: the library must not write into somebody's file.
  char path[] = "/tmp/progress_test_XXXXXX";
  const int file = ::mkstemp(path);
  ASSERT_GE(file, 0);
  ASSERT_EQ(::ftruncate(file, static_cast<off_t>(progress::kPageBytes)), 0);
  EXPECT_EQ(detail::map_progress_page(std::to_string(file).c_str()), nullptr);
  ::close(file);
  ::unlink(path);

  AgentPage good;
  progress::Page* mapped = detail::map_progress_page(good.fd_text().c_str());
  ASSERT_NE(mapped, nullptr);
  EXPECT_EQ(good.page->pid.load(), ::getpid());  // the agent's mapping sees the write
  EXPECT_FALSE(good.fd_open());                  // closed once mapped
  ::munmap(mapped, progress::kPageBytes);
}

class ProcessPageTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    agent_ = new AgentPage();
    ::setenv(env_names::kProgressFd, agent_->fd_text().c_str(), 1);
    ASSERT_NE(detail::progress_page(), nullptr);
  }
  static AgentPage* agent_;
};
AgentPage* ProcessPageTest::agent_ = nullptr;

TEST_F(ProcessPageTest, EveryCollectiveOfAGroupIsCountedWithItsKindAndSize) {
  GlooOptions options;
  options.timeout = 20s;
  options.name = "counted";
  const auto claimed_before = agent_->page->groups_claimed.load();
  auto groups = make_groups(2, std::make_shared<MemoryStore>(), options);
  run_threads(2, [&](int r) {
    std::vector<float> data(100, 1.0f);
    for (int i = 0; i < 5; ++i) groups[r]->allreduce(Buffer::of(data))->wait();
    groups[r]->barrier()->wait();
  });
  EXPECT_EQ(agent_->page->groups_claimed.load(), claimed_before + 2);
  int seen = 0;
  for (const auto& slot : agent_->page->groups) {
    if (slot.in_use.load() == 0 || std::string(slot.name) != "counted") continue;
    ++seen;
    EXPECT_EQ(slot.size.load(), 2u);
    EXPECT_EQ(slot.issued.load(), 6u);
    EXPECT_EQ(slot.completed.load(), 6u);
    EXPECT_EQ(static_cast<progress::Kind>(slot.last_kind.load()), progress::Kind::kBarrier);
    EXPECT_GT(slot.last_completed_ns.load(), 0);
    EXPECT_GE(slot.last_completed_ns.load(), slot.waiting_since_ns.load());
  }
  EXPECT_EQ(seen, 2);
}

TEST_F(ProcessPageTest, GatherScatterAndAlltoallAreCountedWithTheirKindsAndSendsAreNot) {
  GlooOptions options;
  options.timeout = 20s;
  options.name = "exchanged";
  auto groups = make_groups(2, std::make_shared<MemoryStore>(), options);
  auto slots = [&] {
    std::vector<const progress::GroupSlot*> found;
    for (const auto& slot : agent_->page->groups) {
      if (slot.in_use.load() != 0 && std::string(slot.name) == "exchanged") found.push_back(&slot);
    }
    return found;
  };
  ASSERT_EQ(slots().size(), 2u);
  auto expect_last = [&](progress::Kind kind, std::uint64_t bytes, std::uint64_t count) {
    for (const auto* slot : slots()) {
      EXPECT_EQ(static_cast<progress::Kind>(slot->last_kind.load()), kind)
          << progress::to_string(kind);
      EXPECT_EQ(slot->last_bytes.load(), bytes) << progress::to_string(kind);
      EXPECT_EQ(slot->issued.load(), count);
      EXPECT_EQ(slot->completed.load(), count);
    }
  };
  run_threads(2, [&](int r) {
    std::vector<std::int32_t> mine(10), all(r == 0 ? 20 : 0);
    ASSERT_TRUE(groups[r]->gather(Buffer::of(all), Buffer::of(mine), 0)->wait());
  });
  expect_last(progress::Kind::kGather, 40, 1);
  run_threads(2, [&](int r) {
    std::vector<std::int32_t> mine(10), all(r == 1 ? 20 : 0);
    ASSERT_TRUE(groups[r]->scatter(Buffer::of(mine), Buffer::of(all), 1)->wait());
  });
  expect_last(progress::Kind::kScatter, 40, 2);
  run_threads(2, [&](int r) {
    std::vector<double> in(6), out(6);
    ASSERT_TRUE(groups[r]->alltoall(Buffer::of(out), Buffer::of(in), {}, {})->wait());
    // Point to point is not a collective: the page does not count it.
    std::vector<double> message(3);
    auto p2p =
        r == 0 ? groups[r]->send(Buffer::of(message), 1) : groups[r]->recv_any(Buffer::of(message));
    ASSERT_TRUE(p2p->wait());
  });
  expect_last(progress::Kind::kAlltoall, 48, 3);
  EXPECT_STREQ(progress::to_string(progress::Kind::kGather), "gather");
  EXPECT_EQ(progress::kind_of(static_cast<std::int64_t>(progress::Kind::kScatter)),
            progress::Kind::kScatter);
}

TEST_F(ProcessPageTest, IssueAndCompletionStampTheOldestWait) {
  detail::GroupProgress group("stamped", 0, 2);
  const progress::GroupSlot* slot = nullptr;
  for (const auto& s : agent_->page->groups) {
    if (s.in_use.load() != 0 && std::string(s.name) == "stamped") slot = &s;
  }
  ASSERT_NE(slot, nullptr);
  group.issued(0, progress::Kind::kAllreduce, 64);
  const auto first_wait = slot->waiting_since_ns.load();
  EXPECT_GT(first_wait, 0);
  std::this_thread::sleep_for(2ms);
  group.issued(1, progress::Kind::kBroadcast, 8);  // queued behind #0: the wait stays #0's
  EXPECT_EQ(slot->waiting_since_ns.load(), first_wait);
  EXPECT_EQ(slot->last_bytes.load(), 8u);
  std::this_thread::sleep_for(2ms);
  group.completed(0);  // #1 becomes the oldest: it waits from now
  EXPECT_GT(slot->waiting_since_ns.load(), first_wait);
  EXPECT_EQ(slot->issued.load(), 2u);
  EXPECT_EQ(slot->completed.load(), 1u);
  const auto second_wait = slot->waiting_since_ns.load();
  group.completed(1);  // nothing outstanding: no new stamp
  EXPECT_EQ(slot->waiting_since_ns.load(), second_wait);
}

TEST_F(ProcessPageTest, DdpStepsAndNoSyncStepsAreMarked) {
  const auto steps_before = agent_->page->steps.load();
  const auto no_sync_before = agent_->page->no_sync_steps.load();
  GlooOptions options;
  options.timeout = 20s;
  options.name = "ddp";
  auto groups = make_groups(2, std::make_shared<MemoryStore>(), options);
  run_threads(2, [&](int r) {
    std::vector<float> w(32, 1.0f), g(32, 0.0f);
    DistributedDataParallel model(groups[r], {{"w", {}, Buffer::of(w), Buffer::of(g)}});
    for (int step = 0; step < 3; ++step) {
      std::this_thread::sleep_for(std::chrono::milliseconds(r == 0 ? 5 : 30));
      model.begin_forward();
      model.begin_backward();
      model.grad_ready(0);
      model.finalize();
    }
    auto guard = model.no_sync();
    model.begin_forward();
    model.begin_backward();
    model.grad_ready(0);
    model.finalize();
  });
  EXPECT_EQ(agent_->page->steps.load(), steps_before + 6);  // two ranks' steps, one page
  EXPECT_EQ(agent_->page->no_sync_steps.load(), no_sync_before + 2);
  EXPECT_GT(agent_->page->compute_ns.load(), 0);
  EXPECT_GT(agent_->page->last_wall_ns.load(), 0);
  EXPECT_EQ(agent_->page->timed_steps.load(), 4u);  // every step but each rank's first
  EXPECT_GE(agent_->page->total_compute_ns.load(), 4 * 5'000'000);
  EXPECT_GE(agent_->page->last_step_ns.load(), agent_->page->groups[0].last_issued_ns.load());
}

// A training loop with its own DDP (the torch backend's) records its steps
// through ddp::StepRecorder: the compute time runs from one step's end to the
// next one's gradients, not through the wait for their all-reduce.
TEST_F(ProcessPageTest, AStepRecorderMarksStepsWithTheirComputeTime) {
  const auto steps_before = agent_->page->steps.load();
  const auto no_sync_before = agent_->page->no_sync_steps.load();
  const auto timed_before = agent_->page->timed_steps.load();
  const auto compute_before = agent_->page->total_compute_ns.load();
  StepRecorder recorder;
  recorder.step_end(true);  // the first step: counted, its compute unknown
  for (int step = 0; step < 2; ++step) {
    std::this_thread::sleep_for(10ms);  // forward and backward
    recorder.gradients_ready();
    std::this_thread::sleep_for(200ms);  // waiting for the all-reduce
    recorder.step_end(true);
  }
  recorder.step_end(false);
  EXPECT_EQ(agent_->page->steps.load(), steps_before + 3);
  EXPECT_EQ(agent_->page->no_sync_steps.load(), no_sync_before + 1);
  EXPECT_EQ(agent_->page->timed_steps.load(), timed_before + 2);
  const auto compute = agent_->page->total_compute_ns.load() - compute_before;
  EXPECT_GE(compute, 2 * 10'000'000);
  EXPECT_LT(compute, 2 * 200'000'000);  // the all-reduce's wait is not in it
  EXPECT_GE(agent_->page->last_wall_ns.load(), 210'000'000);
}

TEST(WorkTrackerProgress, CompletionsOfCollectivesReachTheHookInIssueOrder) {
  std::vector<std::uint64_t> completed;
  detail::WorkTracker::Hooks hooks;
  hooks.completed = [&](std::uint64_t seq) { completed.push_back(seq); };
  detail::WorkTracker tracker("test", 10s, nullptr, hooks);
  bool done[3] = {false, false, false};
  for (int i = 0; i < 3; ++i) {
    auto work = std::make_shared<detail::WorkImpl>(i, "allreduce", 10s);
    std::optional<std::uint64_t> seq;
    if (i != 1) seq = static_cast<std::uint64_t>(i == 0 ? 0 : 1);  // #1 is a send: no seq
    tracker.add(work, seq, [&done, i] { return done[i]; });
  }
  done[2] = true;  // finished first, completes after #0
  tracker.poll();
  EXPECT_TRUE(completed.empty());
  done[0] = true;
  done[1] = true;
  tracker.poll();
  EXPECT_EQ(completed, (std::vector<std::uint64_t>{0, 1}));
}

}  // namespace
}  // namespace ddp::test
