// A collective that fails with one of ddp's own errors must hand the caller
// that error with its dynamic type intact (catch (const ProtocolError&) has to
// match), not a copy sliced down to the ddp::Error base.
//
// The path: under DDP_DEBUG=DETAIL every rank exchanges a descriptor of the
// collective before running it. Here rank 1 is not a ProcessGroupGloo but a bare
// Gloo context that joins the same rendezvous and sends bytes that are no
// descriptor, so rank 0's check fails with ProtocolError from inside the
// collective's worker thread.
#include <gtest/gtest.h>

#include <gloo/allgather.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <thread>
#include <vector>

#include "ddp/common/error.h"
#include "gloo/collective_check.h"
#include "gloo/gloo_store.h"
#include "gloo/hierarchical.h"
#include "shm/shm_allreduce.h"
#include "test_util.h"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;

TEST(GlooErrorType, ProtocolErrorFromACollectiveKeepsItsType) {
  auto store = std::make_shared<MemoryStore>();
  GlooOptions options;
  options.hostname = "127.0.0.1";
  options.timeout = 10s;
  options.debug_detail = true;
  options.shared_memory = false;

  std::shared_ptr<ProcessGroup> group;
  std::shared_ptr<gloo::rendezvous::Context> peer;
  // Both sides set up in parallel, as two real ranks would: each waits for the other.
  run_threads(2, [&](int rank) {
    if (rank == 0) {
      group = make_gloo_process_group(store, 0, 2, options);
      return;
    }
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(1, 2);
    context->setTimeout(options.timeout);
    detail::GlooStore gloo_store(store, options.timeout);
    context->connectFullMesh(gloo_store, device);
    // ProcessGroupGloo's constructor also plans the hosts (hierarchical all-reduce)
    // and runs the shared-memory setup on every rank; take part in both, declining,
    // so rank 0 is not left waiting for us.
    const auto plan = detail::plan_hosts(*store, 1, 2, detail::this_host_id(),
                                         /*want_hierarchical=*/false,
                                         /*want_shared_memory=*/false, options.timeout);
    EXPECT_EQ(plan.hosts, 1);
    detail::ShmAllreduce::Options shm;
    shm.enabled = false;
    shm.timeout = options.timeout;
    EXPECT_EQ(detail::ShmAllreduce::create(*store, 1, 2, shm), nullptr);
    peer = std::move(context);
  });
  ASSERT_NE(group, nullptr);
  ASSERT_NE(peer, nullptr);

  std::vector<float> data(16, 1.0f);
  auto work = group->allreduce(Buffer::of(data));
  // Rank 1's half of the descriptor exchange of collective #0 (tag 2 * seq):
  // the right size, but garbage.
  std::vector<std::uint8_t> garbage(detail::CollectiveDescriptor::kEncodedSize, 0xAB);
  std::vector<std::uint8_t> all(2 * garbage.size());
  gloo::AllgatherOptions gather(peer);
  gather.setInput(garbage.data(), garbage.size());
  gather.setOutput(all.data(), all.size());
  gather.setTag(0);
  gather.setTimeout(options.timeout);
  gloo::allgather(gather);

  // Before the fix this threw a plain ddp::Error with kind kProtocol.
  try {
    work->wait();
    FAIL() << "an allreduce whose descriptor exchange got garbage succeeded";
  } catch (const ProtocolError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kProtocol);
    EXPECT_NE(std::string(e.what()).find("not a collective descriptor"), std::string::npos)
        << e.what();
  } catch (const ddp::Error& e) {
    FAIL() << "expected ProtocolError, got a ddp::Error of kind " << to_string(e.kind())
           << " that no longer is one: " << e.what();
  }
  // The rethrown object is the same one every time (it is kept, not copied).
  EXPECT_THROW(work->wait(), ProtocolError);
  group.reset();
  peer.reset();
}

}  // namespace
}  // namespace ddp::test
