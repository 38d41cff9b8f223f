// The typed tests of the Store conformance suite; see conformance_suite.h.
// Included once per test program, after ddp::conformance::Envs is declared.
#pragma once

#include "conformance_suite.h"

namespace ddp::conformance {

TYPED_TEST_SUITE(StoreConformance, Envs, EnvNames);

// ---------------------------------------------------------------------------
// set / get

TYPED_TEST(StoreConformance, SetThenGetReturnsValue) {
  auto& store = *this->store_;
  store.set("key", "value");
  EXPECT_EQ(store.get("key"), "value");
  EXPECT_EQ(store.get("key", 1s), "value");
}

TYPED_TEST(StoreConformance, SetReplacesValue) {
  auto& store = *this->store_;
  store.set("key", "first");
  store.set("key", "second, longer");
  EXPECT_EQ(store.get("key"), "second, longer");
  store.set("key", "3");
  EXPECT_EQ(store.get("key"), "3");
}

TYPED_TEST(StoreConformance, TheDefaultTimeoutMayBeSetWhileCallsUseIt) {
  // Every method is thread-safe, set_timeout too (before: a plain member
  // written while other threads read it: a data race ThreadSanitizer reports).
  auto& store = *this->store_;
  store.set("present", "v");
  std::atomic<bool> stop{false};
  std::thread setter([&] {
    for (int i = 0; !stop.load(); ++i) store.set_timeout(std::chrono::milliseconds(1000 + i % 7));
  });
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(store.get("present"), "v");  // uses timeout()
    EXPECT_GE(store.timeout(), std::chrono::milliseconds(1000));
  }
  stop = true;
  setter.join();
}

TYPED_TEST(StoreConformance, ValueSetByOneClientIsSeenByAnother) {
  auto writer = this->env_.client();
  auto reader = this->env_.client();
  writer->set("shared", "from writer");
  EXPECT_EQ(reader->get("shared"), "from writer");
}

TYPED_TEST(StoreConformance, GetBlocksUntilAnotherClientSets) {
  auto blocked = this->env_.client();
  auto setter = this->env_.client();
  auto start = SteadyClock::now();
  auto reader = std::async(std::launch::async, [&] { return blocked->get("late", 10s); });
  ASSERT_EQ(reader.wait_for(kStillBlocked), std::future_status::timeout)
      << "get returned before the key existed";
  setter->set("late", "arrived");
  ASSERT_EQ(reader.wait_for(5s), std::future_status::ready) << "get did not wake up on set";
  EXPECT_EQ(reader.get(), "arrived");
  EXPECT_GE(seconds_since(start), 0.09);
}

TYPED_TEST(StoreConformance, OneSetWakesEveryClientWaitingOnTheKey) {
  constexpr int kWaiters = 3;
  std::vector<std::shared_ptr<Store>> clients;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(this->env_.client());
  std::vector<std::future<std::string>> readers;
  for (int i = 0; i < kWaiters; ++i) {
    readers.push_back(std::async(std::launch::async, [&, i] {
      if (i == 0) {
        clients[i]->wait({"shared-key"}, 10s);
        return std::string("woken");
      }
      return clients[i]->get("shared-key", 10s);
    }));
  }
  for (auto& r : readers) ASSERT_EQ(r.wait_for(kStillBlocked), std::future_status::timeout);
  this->store_->set("shared-key", "woken");
  for (auto& r : readers) {
    ASSERT_EQ(r.wait_for(5s), std::future_status::ready);
    EXPECT_EQ(r.get(), "woken");
  }
}

TYPED_TEST(StoreConformance, GetOfADeletedKeyBlocksUntilItIsSetAgain) {
  auto blocked = this->env_.client();
  auto& store = *this->store_;
  store.set("k", "old");
  ASSERT_TRUE(store.delete_key("k"));
  auto reader = std::async(std::launch::async, [&] { return blocked->get("k", 10s); });
  ASSERT_EQ(reader.wait_for(kStillBlocked), std::future_status::timeout)
      << "get returned a deleted value";
  store.set("k", "new");
  ASSERT_EQ(reader.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(reader.get(), "new");
}

TYPED_TEST(StoreConformance, GetTimesOutWithTimeoutErrorNamingTheKey) {
  auto& store = *this->store_;
  auto start = SteadyClock::now();
  try {
    store.get("missing-key-42", kShortTimeout);
    FAIL() << "get of a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
    EXPECT_THAT(e.what(), HasSubstr("missing-key-42"));
  }
  double elapsed = seconds_since(start);
  EXPECT_GE(elapsed, 0.14);
  EXPECT_LT(elapsed, 2.0);
}

TYPED_TEST(StoreConformance, GetWithoutTimeoutUsesTheStoreTimeout) {
  auto& store = *this->store_;
  store.set_timeout(kShortTimeout);
  EXPECT_EQ(store.timeout(), kShortTimeout);
  auto start = SteadyClock::now();
  EXPECT_THROW(store.get("never-set"), TimeoutError);
  double elapsed = seconds_since(start);
  EXPECT_GE(elapsed, 0.14);
  EXPECT_LT(elapsed, 2.0);
}

TYPED_TEST(StoreConformance, ZeroTimeoutDoesNotBlock) {
  auto& store = *this->store_;
  store.set("here", "v");
  EXPECT_EQ(store.get("here", 0ms), "v");
  store.wait({"here"}, 0ms);
  EXPECT_EQ(store.multi_get({"here"}, 0ms), (std::vector<std::string>{"v"}));
  auto start = SteadyClock::now();
  EXPECT_THROW(store.get("absent", 0ms), TimeoutError);
  EXPECT_THROW(store.wait({"absent"}, 0ms), TimeoutError);
  EXPECT_LT(seconds_since(start), 1.0);
}

TYPED_TEST(StoreConformance, StoreStaysUsableAfterATimeout) {
  auto& store = *this->store_;
  EXPECT_THROW(store.get("slow", kShortTimeout), TimeoutError);
  EXPECT_THROW(store.wait({"slow"}, kShortTimeout), TimeoutError);
  // A late reply to the timed-out calls must not be mistaken for these.
  store.set("other", "o");
  EXPECT_EQ(store.get("other"), "o");
  store.set("slow", "s");
  EXPECT_EQ(store.get("slow"), "s");
  EXPECT_EQ(store.add("counter", 3), 3);
  EXPECT_EQ(store.get("other"), "o");
}

// ---------------------------------------------------------------------------
// add

TYPED_TEST(StoreConformance, AddOnMissingKeyStartsAtZero) {
  auto& store = *this->store_;
  EXPECT_EQ(store.add("counter", 5), 5);
  EXPECT_EQ(store.get("counter"), "5");
}

TYPED_TEST(StoreConformance, AddAccumulatesIncludingNegativeAndZeroDeltas) {
  auto& store = *this->store_;
  EXPECT_EQ(store.add("counter", 5), 5);
  EXPECT_EQ(store.add("counter", -7), -2);
  EXPECT_EQ(store.get("counter"), "-2");
  EXPECT_EQ(store.add("counter", 0), -2);
  EXPECT_EQ(store.add("counter", 1'000'000'000'000), 999'999'999'998);
  EXPECT_EQ(store.get("counter"), "999999999998");
}

TYPED_TEST(StoreConformance, AddOnDecimalValueSetBySet) {
  auto& store = *this->store_;
  store.set("counter", "41");
  EXPECT_EQ(store.add("counter", 1), 42);
  store.set("negative", "-10");
  EXPECT_EQ(store.add("negative", 3), -7);
}

TYPED_TEST(StoreConformance, AddOnNonIntegerValueThrowsInvalidArgument) {
  auto& store = *this->store_;
  for (const std::string bad : {"abc", "12x", "", " 1", "1.5"}) {
    store.set("text", bad);
    try {
      store.add("text", 1);
      ADD_FAILURE() << "add on '" << bad << "' returned";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("text"));
    }
    EXPECT_EQ(store.get("text"), bad) << "a failed add changed the value";
  }
  // The store (and for TcpStore the connection) goes on working.
  EXPECT_EQ(store.add("fine", 2), 2);
}

TYPED_TEST(StoreConformance, ConcurrentAddsFromSeveralClientsAreAtomic) {
  constexpr int kThreads = 4;
  constexpr int kAddsPerThread = 200;
  std::vector<std::shared_ptr<Store>> clients;
  for (int t = 0; t < kThreads; ++t) clients.push_back(this->env_.client());
  std::vector<std::vector<std::int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAddsPerThread; ++i) seen[t].push_back(clients[t]->add("counter", 1));
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<std::int64_t> all;
  for (const auto& s : seen) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  std::vector<std::int64_t> expected(kThreads * kAddsPerThread);
  std::iota(expected.begin(), expected.end(), 1);
  EXPECT_EQ(all, expected) << "two adds returned the same value";
  EXPECT_EQ(this->store_->get("counter"), std::to_string(kThreads * kAddsPerThread));
}

TYPED_TEST(StoreConformance, OneClientIsSafeToShareBetweenThreads) {
  constexpr int kThreads = 4;
  constexpr int kOps = 100;
  auto shared = this->env_.client();
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOps; ++i) {
        std::string key = "t" + std::to_string(t) + "/" + std::to_string(i);
        shared->set(key, key + "-value");
        if (shared->get(key) != key + "-value") ++mismatches;
        shared->add("total", 1);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(shared->add("total", 0), kThreads * kOps);
}

// ---------------------------------------------------------------------------
// compare_set

TYPED_TEST(StoreConformance, CompareSetOnMissingKeyWithEmptyExpectedSets) {
  auto& store = *this->store_;
  EXPECT_EQ(store.compare_set("cas", "", "desired"), "desired");
  EXPECT_EQ(store.get("cas"), "desired");
}

TYPED_TEST(StoreConformance, CompareSetOnMissingKeyWithNonEmptyExpectedDoesNotSet) {
  auto& store = *this->store_;
  EXPECT_EQ(store.compare_set("cas", "expected", "desired"), "expected");
  EXPECT_FALSE(store.check({"cas"}));
}

TYPED_TEST(StoreConformance, CompareSetWithMatchingExpectedSets) {
  auto& store = *this->store_;
  store.set("cas", "old");
  EXPECT_EQ(store.compare_set("cas", "old", "new"), "new");
  EXPECT_EQ(store.get("cas"), "new");
}

TYPED_TEST(StoreConformance, CompareSetWithMismatchReturnsCurrentAndDoesNotSet) {
  auto& store = *this->store_;
  store.set("cas", "current");
  EXPECT_EQ(store.compare_set("cas", "other", "new"), "current");
  EXPECT_EQ(store.get("cas"), "current");
  // A present key holding "" is compared like any value.
  store.set("empty", "");
  EXPECT_EQ(store.compare_set("empty", "", "filled"), "filled");
  EXPECT_EQ(store.get("empty"), "filled");
}

TYPED_TEST(StoreConformance, CompareSetElectsExactlyOneWinner) {
  constexpr int kClients = 4;
  std::vector<std::shared_ptr<Store>> clients;
  for (int c = 0; c < kClients; ++c) clients.push_back(this->env_.client());
  std::vector<std::string> results(kClients);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back(
        [&, c] { results[c] = clients[c]->compare_set("leader", "", std::to_string(c)); });
  }
  for (auto& thread : threads) thread.join();
  std::string winner = this->store_->get("leader");
  for (const auto& r : results) EXPECT_EQ(r, winner);
}

TYPED_TEST(StoreConformance, CompareSetWakesBlockedGet) {
  auto blocked = this->env_.client();
  auto setter = this->env_.client();
  auto reader = std::async(std::launch::async, [&] { return blocked->get("cas", 10s); });
  ASSERT_EQ(reader.wait_for(kStillBlocked), std::future_status::timeout);
  EXPECT_EQ(setter->compare_set("cas", "", "created"), "created");
  ASSERT_EQ(reader.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(reader.get(), "created");
}

// ---------------------------------------------------------------------------
// wait, check

TYPED_TEST(StoreConformance, WaitReturnsAtOnceWhenKeysExist) {
  auto& store = *this->store_;
  store.set("a", "1");
  store.set("b", "2");
  auto start = SteadyClock::now();
  store.wait({"a", "b"}, 1s);
  store.wait({});
  EXPECT_LT(seconds_since(start), 0.5);
}

TYPED_TEST(StoreConformance, WaitBlocksUntilEveryKeyExists) {
  auto blocked = this->env_.client();
  auto setter = this->env_.client();
  auto waiter = std::async(std::launch::async, [&] { blocked->wait({"a", "b", "c"}, 10s); });
  setter->set("a", "1");
  setter->add("b", 1);
  ASSERT_EQ(waiter.wait_for(kStillBlocked), std::future_status::timeout)
      << "wait returned while key c was missing";
  setter->append("c", "x");
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  waiter.get();
}

TYPED_TEST(StoreConformance, WaitTimesOutNamingTheMissingKey) {
  auto& store = *this->store_;
  store.set("present", "1");
  auto start = SteadyClock::now();
  try {
    store.wait({"present", "absent-key-7"}, kShortTimeout);
    FAIL() << "wait on a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("absent-key-7"));
  }
  double elapsed = seconds_since(start);
  EXPECT_GE(elapsed, 0.14);
  EXPECT_LT(elapsed, 2.0);
}

TYPED_TEST(StoreConformance, WaitWithoutTimeoutUsesTheStoreTimeout) {
  auto& store = *this->store_;
  store.set_timeout(kShortTimeout);
  auto start = SteadyClock::now();
  EXPECT_THROW(store.wait({"never"}), TimeoutError);
  EXPECT_LT(seconds_since(start), 2.0);
}

TYPED_TEST(StoreConformance, CheckNeverBlocks) {
  auto& store = *this->store_;
  auto start = SteadyClock::now();
  EXPECT_FALSE(store.check({"a"}));
  store.set("a", "1");
  EXPECT_TRUE(store.check({"a"}));
  EXPECT_FALSE(store.check({"a", "b"}));
  store.set("b", "");
  EXPECT_TRUE(store.check({"a", "b"}));
  EXPECT_TRUE(store.check({}));
  EXPECT_LT(seconds_since(start), 1.0);
}

// ---------------------------------------------------------------------------
// delete_key, num_keys

TYPED_TEST(StoreConformance, DeleteKeyRemovesAndReportsWhetherItExisted) {
  auto& store = *this->store_;
  store.set("doomed", "v");
  store.set("kept", "v");
  EXPECT_TRUE(store.delete_key("doomed"));
  EXPECT_FALSE(store.check({"doomed"}));
  EXPECT_TRUE(store.check({"kept"}));
  EXPECT_FALSE(store.delete_key("doomed"));
  EXPECT_FALSE(store.delete_key("never-existed"));
  EXPECT_THROW(store.get("doomed", kShortTimeout), TimeoutError);
  // A deleted counter starts again from zero.
  store.add("count", 5);
  EXPECT_TRUE(store.delete_key("count"));
  EXPECT_EQ(store.add("count", 1), 1);
}

TYPED_TEST(StoreConformance, NumKeysCountsSetsAndDeletes) {
  auto& store = *this->store_;
  std::int64_t before = store.num_keys();
  store.set("k1", "v");
  store.add("k2", 1);
  store.append("k3", "x");
  store.compare_set("k4", "", "v");
  EXPECT_EQ(store.num_keys(), before + 4);
  store.set("k1", "replaced");
  EXPECT_EQ(store.num_keys(), before + 4);
  store.delete_key("k1");
  EXPECT_EQ(store.num_keys(), before + 3);
  store.compare_set("k5", "not-empty", "v");  // does not create
  EXPECT_EQ(store.num_keys(), before + 3);
}

// ---------------------------------------------------------------------------
// multi_get, multi_set

TYPED_TEST(StoreConformance, MultiSetThenMultiGetInOrder) {
  auto& store = *this->store_;
  store.multi_set({"x", "y", "z"}, {"1", "2", "3"});
  EXPECT_EQ(store.multi_get({"z", "x", "y"}), (std::vector<std::string>{"3", "1", "2"}));
  EXPECT_EQ(store.get("y"), "2");
  EXPECT_EQ(store.multi_get({"x", "x"}), (std::vector<std::string>{"1", "1"}));
  EXPECT_TRUE(store.multi_get({}).empty());
  store.multi_set({}, {});
}

TYPED_TEST(StoreConformance, MultiSetWithSizeMismatchThrowsInvalidArgument) {
  auto& store = *this->store_;
  std::int64_t before = store.num_keys();
  EXPECT_THROW(store.multi_set({"a", "b"}, {"1"}), InvalidArgument);
  EXPECT_THROW(store.multi_set({"a"}, {"1", "2"}), InvalidArgument);
  EXPECT_EQ(store.num_keys(), before) << "a rejected multi_set changed the store";
  store.multi_set({"a"}, {"1"});
  EXPECT_EQ(store.get("a"), "1");
}

TYPED_TEST(StoreConformance, MultiGetBlocksUntilEveryKeyExists) {
  auto blocked = this->env_.client();
  auto setter = this->env_.client();
  setter->set("m1", "one");
  auto reader = std::async(std::launch::async, [&] {
    return blocked->multi_get({"m1", "m2"}, 10s);
  });
  ASSERT_EQ(reader.wait_for(kStillBlocked), std::future_status::timeout);
  setter->set("m2", "two");
  ASSERT_EQ(reader.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(reader.get(), (std::vector<std::string>{"one", "two"}));
}

// A key that existed when the call began but is deleted before the others
// arrive is missing again: the call goes on waiting for it.
TYPED_TEST(StoreConformance, MultiGetAndWaitWaitForAKeyDeletedMeanwhile) {
  auto multi_getter = this->env_.client();
  auto waiter = this->env_.client();
  auto& store = *this->store_;
  store.set("a", "a1");
  auto values = std::async(std::launch::async, [&] {
    return multi_getter->multi_get({"a", "b"}, 10s);
  });
  auto waited = std::async(std::launch::async, [&] { waiter->wait({"a", "b"}, 10s); });
  ASSERT_EQ(values.wait_for(kStillBlocked), std::future_status::timeout);
  ASSERT_EQ(waited.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  ASSERT_TRUE(store.delete_key("a"));
  store.set("b", "b1");
  EXPECT_EQ(values.wait_for(kStillBlocked), std::future_status::timeout)
      << "multi_get returned while key a was missing";
  EXPECT_EQ(waited.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout)
      << "wait returned while key a was missing";
  store.set("a", "a2");
  ASSERT_EQ(values.wait_for(5s), std::future_status::ready);
  ASSERT_EQ(waited.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(values.get(), (std::vector<std::string>{"a2", "b1"}));
  waited.get();
}

TYPED_TEST(StoreConformance, MultiGetTimesOutNamingTheMissingKey) {
  auto& store = *this->store_;
  store.set("m1", "one");
  try {
    store.multi_get({"m1", "m-missing-3"}, kShortTimeout);
    FAIL() << "multi_get with a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("m-missing-3"));
  }
}

// ---------------------------------------------------------------------------
// append

TYPED_TEST(StoreConformance, AppendCreatesThenAppends) {
  auto& store = *this->store_;
  store.append("log", "a");
  EXPECT_EQ(store.get("log"), "a");
  store.append("log", "bc");
  store.append("log", "");
  store.append("log", "d");
  EXPECT_EQ(store.get("log"), "abcd");
}

TYPED_TEST(StoreConformance, AppendWakesBlockedGet) {
  auto blocked = this->env_.client();
  auto setter = this->env_.client();
  auto reader = std::async(std::launch::async, [&] { return blocked->get("log", 10s); });
  ASSERT_EQ(reader.wait_for(kStillBlocked), std::future_status::timeout);
  setter->append("log", "first");
  ASSERT_EQ(reader.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(reader.get(), "first");
}

TYPED_TEST(StoreConformance, ConcurrentAppendsLoseNothing) {
  constexpr int kThreads = 4;
  constexpr int kAppends = 50;
  std::vector<std::shared_ptr<Store>> clients;
  for (int t = 0; t < kThreads; ++t) clients.push_back(this->env_.client());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAppends; ++i) clients[t]->append("log", std::string(1, 'a' + t));
    });
  }
  for (auto& thread : threads) thread.join();
  std::string log = this->store_->get("log");
  ASSERT_EQ(log.size(), static_cast<std::size_t>(kThreads * kAppends));
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(std::count(log.begin(), log.end(), 'a' + t), kAppends);
  }
}

// ---------------------------------------------------------------------------
// Values and keys are byte strings

inline std::string every_byte() {
  std::string bytes(256, '\0');
  for (int i = 0; i < 256; ++i) bytes[i] = static_cast<char>(i);
  return bytes;
}

TYPED_TEST(StoreConformance, BinaryValuesWithNulBytesRoundTrip) {
  auto& store = *this->store_;
  const std::string value = std::string("a\0b\0\0c", 6) + every_byte();
  store.set("bin", value);
  EXPECT_EQ(store.get("bin"), value);
  store.append("bin", std::string("\0\xff", 2));
  EXPECT_EQ(store.get("bin"), value + std::string("\0\xff", 2));
  store.multi_set({"b1", "b2"}, {std::string(3, '\0'), every_byte()});
  EXPECT_EQ(store.multi_get({"b1", "b2"}),
            (std::vector<std::string>{std::string(3, '\0'), every_byte()}));
  EXPECT_EQ(store.compare_set("b1", std::string(3, '\0'), std::string("\0x", 2)),
            std::string("\0x", 2));
}

TYPED_TEST(StoreConformance, BinaryKeysRoundTrip) {
  auto& store = *this->store_;
  const std::string key1("k\0ey", 4);
  const std::string key2("k\0ez", 4);
  const std::string key3 = "\xff\xfe/\x01";
  store.set(key1, "one");
  store.set(key2, "two");
  store.set(key3, "three");
  EXPECT_EQ(store.get(key1), "one");
  EXPECT_EQ(store.get(key2), "two");
  EXPECT_EQ(store.get(key3), "three");
  EXPECT_FALSE(store.check({std::string("k")}));
  EXPECT_TRUE(store.delete_key(key1));
  EXPECT_EQ(store.get(key2), "two");
}

TYPED_TEST(StoreConformance, EmptyValueIsAPresentKey) {
  auto& store = *this->store_;
  store.set("empty", "");
  EXPECT_TRUE(store.check({"empty"}));
  EXPECT_EQ(store.get("empty", 1s), "");
  store.wait({"empty"}, 1s);
  EXPECT_EQ(store.multi_get({"empty"}), (std::vector<std::string>{""}));
  EXPECT_TRUE(store.delete_key("empty"));
}

TYPED_TEST(StoreConformance, LargeValueOf8MiBRoundTrips) {
  auto& store = *this->store_;
  std::string big(8 << 20, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  store.set("big", big);
  auto reader = this->env_.client();
  EXPECT_TRUE(reader->get("big") == big) << "8 MiB value came back different";
  store.append("big", "tail");
  std::string back = reader->get("big");
  EXPECT_EQ(back.size(), big.size() + 4);
  EXPECT_TRUE(back.compare(0, big.size(), big) == 0 && back.substr(big.size()) == "tail");
  // The connection still carries small requests after the large ones.
  store.set("small", "s");
  EXPECT_EQ(reader->get("small"), "s");
}

// ---------------------------------------------------------------------------
// Prefixes

TYPED_TEST(StoreConformance, ClientKeysLandUnderTheExpectedPrefix) {
  auto raw = this->env_.raw_client();
  const std::string prefix = this->env_.kKeyPrefix;
  this->store_->set("placed", "here");
  EXPECT_EQ(raw->get(prefix + "placed"), "here");
  if (!prefix.empty()) {
    EXPECT_FALSE(raw->check({"placed"}));
  }
  raw->set(prefix + "from-raw", "r");
  EXPECT_EQ(this->store_->get("from-raw"), "r");
}

TYPED_TEST(StoreConformance, PrefixStoresAreIsolated) {
  auto base = this->store_;
  PrefixStore a("a", base);
  PrefixStore b("b", base);
  EXPECT_EQ(a.prefix(), "a");
  a.set("k", "from a");
  EXPECT_FALSE(b.check({"k"}));
  EXPECT_THROW(b.get("k", kShortTimeout), TimeoutError);
  b.set("k", "from b");
  EXPECT_EQ(a.get("k"), "from a");
  EXPECT_EQ(b.get("k"), "from b");
  EXPECT_EQ(base->get("a/k"), "from a");
  EXPECT_FALSE(base->check({"k"}));
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", 5), 5);
  EXPECT_EQ(a.compare_set("n", "2", "3"), "3");
  EXPECT_EQ(b.get("n"), "5");
  EXPECT_TRUE(b.delete_key("k"));
  EXPECT_EQ(a.get("k"), "from a");
  a.multi_set({"m1", "m2"}, {"1", "2"});
  EXPECT_FALSE(b.check({"m1"}));
  EXPECT_EQ(base->multi_get({"a/m1", "a/m2"}), (std::vector<std::string>{"1", "2"}));
  // num_keys counts the whole store below, not just one prefix.
  EXPECT_EQ(a.num_keys(), base->num_keys());
  // Nested prefixes compose.
  auto outer = std::make_shared<PrefixStore>("outer", base);
  PrefixStore inner("inner", outer);
  inner.set("deep", "d");
  EXPECT_EQ(base->get("outer/inner/deep"), "d");
}

TYPED_TEST(StoreConformance, PrefixStoreTakesTheTimeoutOfItsBase) {
  auto base = this->store_;
  base->set_timeout(1234ms);
  PrefixStore prefixed("p", base);
  EXPECT_EQ(prefixed.timeout(), 1234ms);
  EXPECT_THROW(PrefixStore("p", nullptr), InvalidArgument);
}

}  // namespace ddp::conformance
