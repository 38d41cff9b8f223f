// The server's socket-free handler (store_server/src/store_handler.h): parking,
// waking, cancelling, expiring and shutting down blocked requests.
#include "store_handler.h"

#include <gtest/gtest.h>

#include <deque>
#include <string>
#include <vector>

namespace ddp {
namespace {

using protocol::Op;
using protocol::Reply;
using protocol::Request;
using protocol::Status;

struct Recorder final : StoreHandler::Waiter {
  std::vector<std::string> replies;
  void on_wake(std::string_view reply) override { replies.emplace_back(reply); }
};

// Decodes the single reply frame in `bytes`. The reply's views point into a copy
// kept for the rest of the test program (callers pass temporaries).
Reply decode(Op op, const std::string& bytes) {
  static std::deque<std::string> keep;
  keep.push_back(bytes);
  std::string_view input = keep.back();
  protocol::FrameParser parser(1u << 30);
  EXPECT_EQ(parser.consume(input), protocol::FrameParser::State::kGood);
  EXPECT_TRUE(input.empty()) << "exactly one reply expected";
  Reply reply;
  EXPECT_TRUE(protocol::decode_reply(op, parser.payload(), reply).ok());
  return reply;
}

class StoreHandlerTest : public ::testing::Test {
 protected:
  // Runs `q` and returns its reply frame; fails when it parks.
  std::string run(const Request& q) {
    std::string out;
    EXPECT_TRUE(handler.handle(q, out, &other)) << "unexpectedly parked";
    return out;
  }
  void set(const std::string& key, const std::string& value) {
    Request q;
    q.op = Op::kSet;
    q.key = key;
    q.value = value;
    EXPECT_EQ(decode(Op::kSet, run(q)).status, Status::kOk);
  }
  // Parks a request for `waiter`; fails when it completes at once.
  void park(const Request& q, Recorder& waiter) {
    std::string out;
    EXPECT_FALSE(handler.handle(q, out, &waiter)) << "completed at once";
    EXPECT_TRUE(out.empty());
    EXPECT_TRUE(handler.is_parked(&waiter));
  }
  static Request get(const std::string& key, std::uint64_t timeout_ms = 1000) {
    Request q;
    q.op = Op::kGet;
    q.key = key;
    q.timeout_ms = timeout_ms;
    return q;
  }
  static Request wait(std::vector<std::string_view> keys, std::uint64_t timeout_ms = 1000) {
    Request q;
    q.op = Op::kWait;
    q.keys = std::move(keys);
    q.timeout_ms = timeout_ms;
    return q;
  }

  StoreHandler handler;
  Recorder other;
};

TEST_F(StoreHandlerTest, ParkedGetIsWokenBySet) {
  Recorder w;
  // The request's views may dangle after handle(): the handler keeps its own copy.
  {
    std::string key = "k";
    park(get(key), w);
  }
  EXPECT_EQ(handler.num_parked(), 1u);
  set("k", "v");
  ASSERT_EQ(w.replies.size(), 1u);
  EXPECT_EQ(decode(Op::kGet, w.replies[0]).value, "v");
  EXPECT_FALSE(handler.is_parked(&w));
  EXPECT_EQ(handler.num_parked(), 0u);
}

TEST_F(StoreHandlerTest, EveryWritingOperationWakes) {
  Recorder by_add, by_cas, by_multi_set, by_append;
  park(get("a"), by_add);
  park(get("c"), by_cas);
  park(get("m"), by_multi_set);
  park(get("p"), by_append);
  Request q;
  q.op = Op::kAdd;
  q.key = "a";
  q.delta = 3;
  run(q);
  q = {};
  q.op = Op::kCompareSet;
  q.key = "c";
  q.desired = "new";
  run(q);
  q = {};
  q.op = Op::kMultiSet;
  q.keys = {"x", "m"};
  q.values = {"1", "2"};
  run(q);
  q = {};
  q.op = Op::kAppend;
  q.key = "p";
  q.value = "tail";
  run(q);
  ASSERT_EQ(by_add.replies.size(), 1u);
  EXPECT_EQ(decode(Op::kGet, by_add.replies[0]).value, "3");
  ASSERT_EQ(by_cas.replies.size(), 1u);
  EXPECT_EQ(decode(Op::kGet, by_cas.replies[0]).value, "new");
  ASSERT_EQ(by_multi_set.replies.size(), 1u);
  EXPECT_EQ(decode(Op::kGet, by_multi_set.replies[0]).value, "2");
  ASSERT_EQ(by_append.replies.size(), 1u);
  EXPECT_EQ(decode(Op::kGet, by_append.replies[0]).value, "tail");
}

TEST_F(StoreHandlerTest, CompareSetThatChangesNothingDoesNotWake) {
  Recorder w;
  park(get("c"), w);
  Request q;
  q.op = Op::kCompareSet;
  q.key = "c";
  q.value = "not-empty";  // missing key, non-empty expected: nothing is set
  q.desired = "d";
  EXPECT_EQ(decode(Op::kCompareSet, run(q)).value, "not-empty");
  EXPECT_TRUE(w.replies.empty());
  EXPECT_TRUE(handler.is_parked(&w));
}

TEST_F(StoreHandlerTest, WaitCompletesOnlyWhenEveryKeyExists) {
  Recorder w;
  park(wait({"a", "b", "c"}), w);
  set("b", "1");
  set("a", "1");
  EXPECT_TRUE(w.replies.empty());
  set("c", "1");
  ASSERT_EQ(w.replies.size(), 1u);
  EXPECT_EQ(decode(Op::kWait, w.replies[0]).status, Status::kOk);
}

TEST_F(StoreHandlerTest, KeyDeletedWhileParkedIsWaitedForAgain) {
  Recorder getter, waiter;
  set("a", "a1");
  Request q;
  q.op = Op::kMultiGet;
  q.keys = {"a", "b"};
  q.timeout_ms = 1000;
  park(q, getter);
  park(wait({"a", "b"}), waiter);
  Request del;
  del.op = Op::kDeleteKey;
  del.key = "a";
  EXPECT_TRUE(decode(Op::kDeleteKey, run(del)).flag);
  set("b", "b1");
  EXPECT_TRUE(getter.replies.empty()) << "answered while key a was missing";
  EXPECT_TRUE(waiter.replies.empty()) << "answered while key a was missing";
  EXPECT_TRUE(handler.is_parked(&getter));
  set("a", "a2");
  ASSERT_EQ(getter.replies.size(), 1u);
  auto reply = decode(Op::kMultiGet, getter.replies[0]);
  ASSERT_EQ(reply.values.size(), 2u);
  EXPECT_EQ(reply.values[0], "a2");
  EXPECT_EQ(reply.values[1], "b1");
  ASSERT_EQ(waiter.replies.size(), 1u);
  EXPECT_EQ(decode(Op::kWait, waiter.replies[0]).status, Status::kOk);
}

TEST_F(StoreHandlerTest, MultiGetReturnsValuesInKeyOrder) {
  Recorder w;
  Request q;
  q.op = Op::kMultiGet;
  q.keys = {"y", "x"};
  q.timeout_ms = 1000;
  park(q, w);
  set("x", "ex");
  set("y", "why");
  ASSERT_EQ(w.replies.size(), 1u);
  auto reply = decode(Op::kMultiGet, w.replies[0]);
  ASSERT_EQ(reply.values.size(), 2u);
  EXPECT_EQ(reply.values[0], "why");
  EXPECT_EQ(reply.values[1], "ex");
}

TEST_F(StoreHandlerTest, ManyWaitersOnOneKeyAllWake) {
  std::vector<Recorder> waiters(100);
  for (auto& w : waiters) park(get("barrier"), w);
  EXPECT_EQ(handler.num_parked(), 100u);
  set("barrier", "open");
  for (auto& w : waiters) EXPECT_EQ(w.replies.size(), 1u);
  EXPECT_EQ(handler.num_parked(), 0u);
}

TEST_F(StoreHandlerTest, CancelledWaiterIsNeverWoken) {
  Recorder gone, stays;
  park(get("k"), gone);
  park(get("k"), stays);
  handler.cancel(&gone);
  handler.cancel(&gone);  // no-op
  EXPECT_FALSE(handler.is_parked(&gone));
  set("k", "v");
  EXPECT_TRUE(gone.replies.empty());
  EXPECT_EQ(stays.replies.size(), 1u);
}

// Waiters leaving from anywhere in a key's list (a job's clients disconnect
// in any order) leave the others parked, woken once each in the order they came.
TEST_F(StoreHandlerTest, WaitersLeavingFromTheMiddleLeaveTheOthersWokenInOrder) {
  struct Ordered final : StoreHandler::Waiter {
    std::vector<int>* woken = nullptr;
    int id = 0;
    void on_wake(std::string_view) override { woken->push_back(id); }
  };
  std::vector<int> woken;
  std::vector<Ordered> waiters(6);
  for (int i = 0; i < 6; ++i) {
    waiters[i].woken = &woken;
    waiters[i].id = i;
    std::string out;
    ASSERT_FALSE(handler.handle(get("k"), out, &waiters[i]));
  }
  for (int gone : {0, 2, 3, 5}) handler.cancel(&waiters[gone]);
  handler.cancel(&waiters[2]);  // no-op
  EXPECT_EQ(handler.num_parked(), 2u);
  set("k", "v");
  EXPECT_EQ(woken, (std::vector<int>{1, 4}));
  EXPECT_EQ(handler.num_parked(), 0u);
  // Parked again on the same key after it is deleted: nothing stale is left.
  Request del;
  del.op = Op::kDeleteKey;
  del.key = "k";
  run(del);
  std::string out;
  ASSERT_FALSE(handler.handle(get("k"), out, &waiters[3]));
  handler.cancel(&waiters[3]);
  ASSERT_FALSE(handler.handle(get("k"), out, &waiters[0]));
  set("k", "again");
  EXPECT_EQ(woken, (std::vector<int>{1, 4, 0}));
}

TEST_F(StoreHandlerTest, ExpireRepliesTimeoutNamingTheMissingKeys) {
  Recorder w;
  park(wait({"here", "missing"}, 250), w);
  set("here", "1");
  std::string out;
  ASSERT_TRUE(handler.expire(&w, out));
  auto reply = decode(Op::kWait, out);
  EXPECT_EQ(reply.status, Status::kTimeout);
  EXPECT_NE(reply.message.find("missing"), std::string_view::npos) << reply.message;
  EXPECT_EQ(reply.message.find("here"), std::string_view::npos) << reply.message;
  EXPECT_NE(reply.message.find("0.250"), std::string_view::npos) << reply.message;
  EXPECT_FALSE(handler.is_parked(&w));
  out.clear();
  EXPECT_FALSE(handler.expire(&w, out));
  EXPECT_TRUE(out.empty());
}

TEST_F(StoreHandlerTest, ZeroTimeoutTimesOutAtOnce) {
  std::string out;
  Recorder w;
  EXPECT_TRUE(handler.handle(get("nope", 0), out, &w));
  EXPECT_EQ(decode(Op::kGet, out).status, Status::kTimeout);
  EXPECT_FALSE(handler.is_parked(&w));
}

TEST_F(StoreHandlerTest, PresentKeysAnswerAtOnce) {
  set("k", "v");
  EXPECT_EQ(decode(Op::kGet, run(get("k", 0))).value, "v");
  EXPECT_EQ(decode(Op::kWait, run(wait({"k"}, 0))).status, Status::kOk);
}

TEST_F(StoreHandlerTest, ShutdownFailsEveryParkedRequest) {
  Recorder a, b;
  park(get("x"), a);
  park(wait({"y", "z"}), b);
  handler.shutdown("going away");
  for (auto* w : {&a, &b}) {
    ASSERT_EQ(w->replies.size(), 1u);
    auto reply = decode(Op::kGet, w->replies[0]);
    EXPECT_EQ(reply.status, Status::kShutdown);
    EXPECT_EQ(reply.message, "going away");
  }
  EXPECT_EQ(handler.num_parked(), 0u);
  set("x", "late");  // wakes nobody, touches nothing freed
  EXPECT_EQ(a.replies.size(), 1u);
}

TEST_F(StoreHandlerTest, AddOnTextIsInvalidArgumentAndStoresNothing) {
  set("t", "text");
  Request q;
  q.op = Op::kAdd;
  q.key = "t";
  q.delta = 1;
  auto reply = decode(Op::kAdd, run(q));
  EXPECT_EQ(reply.status, Status::kInvalidArgument);
  EXPECT_NE(reply.message.find("'t'"), std::string_view::npos) << reply.message;
  EXPECT_EQ(decode(Op::kGet, run(get("t"))).value, "text");
}

TEST_F(StoreHandlerTest, DeleteCheckAndNumKeys) {
  set("a", "1");
  set("b", "2");
  Request q;
  q.op = Op::kCheck;
  q.keys = {"a", "b"};
  EXPECT_TRUE(decode(Op::kCheck, run(q)).flag);
  q.keys = {"a", "zz"};
  EXPECT_FALSE(decode(Op::kCheck, run(q)).flag);
  Request del;
  del.op = Op::kDeleteKey;
  del.key = "a";
  EXPECT_TRUE(decode(Op::kDeleteKey, run(del)).flag);
  EXPECT_FALSE(decode(Op::kDeleteKey, run(del)).flag);
  Request n;
  n.op = Op::kNumKeys;
  EXPECT_EQ(decode(Op::kNumKeys, run(n)).integer, 1);
}

TEST(StoreHandlerLimits, ParkedRequestsHoldBoundedKeyBytes) {
  StoreHandler::Limits limits;
  limits.max_parked_bytes = 1024;
  StoreHandler handler(limits);
  std::vector<std::string> storage;
  for (int i = 0; i < 10; ++i) storage.push_back(std::string(30, 'k') + std::to_string(i));
  Request wait;
  wait.op = Op::kWait;
  wait.timeout_ms = protocol::kNoTimeout;
  wait.keys.assign(storage.begin(), storage.end());
  Recorder a, b;
  std::string out;
  ASSERT_FALSE(handler.handle(wait, out, &a)) << "ten keys fit";
  EXPECT_GT(handler.parked_bytes(), 0u);
  // A second wait on as many keys would pass the bound: refused, not parked.
  ASSERT_TRUE(handler.handle(wait, out, &b));
  EXPECT_FALSE(handler.is_parked(&b));
  EXPECT_EQ(decode(Op::kWait, out).status, Status::kStoreFull);
  handler.cancel(&a);
  EXPECT_EQ(handler.parked_bytes(), 0u);
  out.clear();
  EXPECT_FALSE(handler.handle(wait, out, &b)) << "the bound frees with the cancelled wait";
  handler.shutdown("bye");
  EXPECT_EQ(handler.parked_bytes(), 0u);
}

TEST(StoreHandlerLimits, StoredBytesFollowEveryWrite) {
  StoreHandler handler;
  Recorder waiter;
  std::string out;
  Request set;
  set.op = Op::kSet;
  set.key = "k";
  set.value = "12345";
  handler.handle(set, out, &waiter);
  const auto one = StoreHandler::kEntryOverhead + 1 + 5;
  EXPECT_EQ(handler.stored_bytes(), one);
  Request add;
  add.op = Op::kAdd;
  add.key = "n";
  add.delta = 100;
  handler.handle(add, out, &waiter);
  EXPECT_EQ(handler.stored_bytes(), one + StoreHandler::kEntryOverhead + 1 + 3);
  Request del;
  del.op = Op::kDeleteKey;
  del.key = "n";
  handler.handle(del, out, &waiter);
  EXPECT_EQ(handler.stored_bytes(), one);
  Request cas;
  cas.op = Op::kCompareSet;
  cas.key = "k";
  cas.value = "12345";
  cas.desired = "1";
  handler.handle(cas, out, &waiter);
  EXPECT_EQ(handler.stored_bytes(), StoreHandler::kEntryOverhead + 1 + 1);
  Request append;
  append.op = Op::kAppend;
  append.key = "k";
  append.value = "23";
  handler.handle(append, out, &waiter);
  EXPECT_EQ(handler.stored_bytes(), StoreHandler::kEntryOverhead + 1 + 3);
}

}  // namespace
}  // namespace ddp
