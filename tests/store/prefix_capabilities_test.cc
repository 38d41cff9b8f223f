// A PrefixStore offers its base's capabilities (store_capabilities.h) with its
// prefix: wrapping a store that has leases, watches, tickets and prefix
// operations keeps them, each on the prefixed keys; a base without them gives
// none. The base here is FakeLeaseStore (tests/support), etcd's model.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/store/memory_store.h"
#include "ddp/store/prefix_store.h"
#include "ddp/store/store_capabilities.h"
#include "fake_lease_store.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using test::FakeLeaseStore;

class PrefixCapabilities : public ::testing::Test {
 protected:
  FakeTime time_;
  std::shared_ptr<FakeLeaseStore> base_ = std::make_shared<FakeLeaseStore>(time_);
  PrefixStore store_{"job", base_};
};

TEST(PrefixStoreCapabilities, ABaseWithoutCapabilitiesGivesNone) {
  PrefixStore store("job", std::make_shared<MemoryStore>());
  EXPECT_EQ(store.leases(), nullptr);
  EXPECT_EQ(store.watches(), nullptr);
  EXPECT_EQ(store.tickets(), nullptr);
  EXPECT_EQ(store.prefixes(), nullptr);
}

TEST_F(PrefixCapabilities, EveryCapabilityOfTheBaseIsOffered) {
  EXPECT_NE(store_.leases(), nullptr);
  EXPECT_NE(store_.watches(), nullptr);
  EXPECT_NE(store_.tickets(), nullptr);
  EXPECT_NE(store_.prefixes(), nullptr);
  PrefixStore twice("inner", std::make_shared<PrefixStore>("outer", base_));
  EXPECT_NE(twice.leases(), nullptr) << "a prefix of a prefix keeps them too";
}

TEST_F(PrefixCapabilities, AKeyOnALeaseIsPrefixedAndGoesWithTheLease) {
  StoreLeases& leases = *store_.leases();
  const auto lease = leases.grant_lease(2s);
  leases.set_with_lease("alive/a", "1", lease);
  EXPECT_EQ(base_->get("job/alive/a", 0ms), "1");
  EXPECT_EQ(store_.get("alive/a", 0ms), "1");
  time_.advance(3s);
  base_->expire();
  EXPECT_FALSE(store_.check({"alive/a"}));
  EXPECT_EQ(leases.lease_time_left(lease), -1);
}

TEST_F(PrefixCapabilities, AWatchSeesOnlyItsPrefixAndTellsKeysAsTheCallerNamesThem) {
  std::vector<std::string> deleted;
  auto watch = store_.watches()->watch_prefix(
      "alive/", store_.watches()->revision() + 1,
      [&](const StoreEvent& event) {
        if (event.kind == StoreEvent::Kind::kDelete) deleted.push_back(event.key);
      },
      [](const std::string&) {});
  base_->set("alive/x", "outside the prefix");
  base_->delete_key("alive/x");
  store_.set("alive/b", "1");
  store_.delete_key("alive/b");
  EXPECT_EQ(deleted, std::vector<std::string>{"alive/b"});
}

TEST_F(PrefixCapabilities, TicketsArePrefixed) {
  StoreTickets& tickets = *store_.tickets();
  EXPECT_EQ(tickets.take_ticket("round_0/arrivals"), 0);
  EXPECT_EQ(tickets.take_ticket("round_0/arrivals"), 1);
  EXPECT_EQ(base_->tickets_taken("job/round_0/arrivals"), 2);
  EXPECT_EQ(base_->tickets_taken("round_0/arrivals"), 0);
  tickets.delete_tickets("round_0/arrivals");
  EXPECT_EQ(tickets.tickets_taken("round_0/arrivals"), 0);
}

TEST_F(PrefixCapabilities, ATakeOverDeletesOnlyBelowThePrefixedPrefix) {
  base_->set("other/keep", "1");
  store_.set("run/config", "old");
  store_.set("run/current", "3 2");
  EXPECT_TRUE(store_.prefixes()->take_over("run/config", "old", "new", "run/"));
  EXPECT_EQ(store_.get("run/config", 0ms), "new");
  EXPECT_FALSE(store_.check({"run/current"}));
  EXPECT_TRUE(base_->check({"other/keep"}));
  EXPECT_FALSE(store_.prefixes()->take_over("run/config", "old", "newer", "run/"));
  EXPECT_THROW(store_.prefixes()->take_over("elsewhere", "new", "x", "run/"), InvalidArgument);
}

}  // namespace
}  // namespace ddp
