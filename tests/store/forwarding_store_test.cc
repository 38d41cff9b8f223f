// ForwardingStore: every call reaches the base with the key the hook names,
// non-blocking calls pass before_call first, blocking ones go through
// run_blocking with the caller's timeout.
#include "ddp/store/forwarding_store.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/store/memory_store.h"

namespace ddp {
namespace {

using std::chrono::milliseconds;

// Renames keys to "x.<key>", records the hooks' calls, and refuses every call
// once `refuse` is set.
class Recording final : public ForwardingStore {
 public:
  explicit Recording(std::shared_ptr<Store> base) : ForwardingStore(std::move(base), "Recording") {}
  std::vector<std::string> calls;
  std::vector<Duration> timeouts;
  bool refuse = false;

 private:
  std::string base_key(const std::string& key) const override { return "x." + key; }
  void before_call(const char* op) override {
    calls.emplace_back(op);
    if (refuse) throw InvalidArgument("Recording", op);
  }
  void run_blocking(const char* op, Duration timeout, const BlockingCall& call) override {
    calls.emplace_back(std::string("blocking ") + op);
    timeouts.push_back(timeout);
    if (refuse) throw InvalidArgument("Recording", op);
    call(timeout);
  }
};

TEST(ForwardingStore, EveryCallReachesTheBaseUnderTheHooksKey) {
  auto base = std::make_shared<MemoryStore>(milliseconds(50));
  Recording store(base);
  EXPECT_EQ(store.timeout(), milliseconds(50));  // the base's, at first
  EXPECT_EQ(store.base(), base);

  store.set("a", "1");
  EXPECT_EQ(base->get("x.a"), "1");
  EXPECT_EQ(store.get("a", milliseconds(20)), "1");
  EXPECT_EQ(store.add("n", 5), 5);
  EXPECT_EQ(base->get("x.n"), "5");
  EXPECT_EQ(store.compare_set("a", "1", "2"), "2");
  store.wait({"a", "n"}, milliseconds(30));
  EXPECT_TRUE(store.check({"a", "n"}));
  EXPECT_FALSE(store.check({"missing"}));
  store.multi_set({"b", "c"}, {"B", "C"});
  EXPECT_EQ(store.multi_get({"b", "c"}, milliseconds(40)), (std::vector<std::string>{"B", "C"}));
  store.append("b", "+");
  EXPECT_EQ(base->get("x.b"), "B+");
  EXPECT_EQ(store.num_keys(), base->num_keys());
  EXPECT_TRUE(store.delete_key("c"));
  EXPECT_FALSE(base->check({"x.c"}));

  EXPECT_EQ(store.calls,
            (std::vector<std::string>{"set", "blocking get", "add", "compare_set", "blocking wait",
                                      "check", "check", "multi_set", "blocking multi_get", "append",
                                      "num_keys", "delete_key"}));
  EXPECT_EQ(store.timeouts,
            (std::vector<Store::Duration>{milliseconds(20), milliseconds(30), milliseconds(40)}));
}

TEST(ForwardingStore, AHookThatThrowsKeepsTheCallFromTheBase) {
  auto base = std::make_shared<MemoryStore>();
  Recording store(base);
  store.refuse = true;
  EXPECT_THROW(store.set("a", "1"), InvalidArgument);
  EXPECT_THROW(store.append("a", "1"), InvalidArgument);
  EXPECT_THROW(store.get("a", milliseconds(10)), InvalidArgument);
  EXPECT_EQ(base->num_keys(), 0);
}

TEST(ForwardingStore, ANullBaseIsRefused) {
  EXPECT_THROW(Recording store(nullptr), InvalidArgument);
}

}  // namespace
}  // namespace ddp
