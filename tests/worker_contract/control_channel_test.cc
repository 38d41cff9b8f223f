#include "ddp/worker_contract/control_channel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/error.h"

namespace ddp::control {
namespace {

struct Pair {
  Pair() { std::tie(agent, worker) = make_socket_pair(); }
  ~Pair() {
    if (agent >= 0) ::close(agent);
    if (worker >= 0) ::close(worker);
  }
  int agent = -1;
  int worker = -1;
};

TEST(ControlChannel, AMessageRoundTripsWithItsFields) {
  Message m("round");
  m.set("round", 3).set("rank", 5).set("store_addr", "10.0.0.1").set("seconds", 0.25);
  auto back = decode(encode(m));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->type, "round");
  EXPECT_EQ(back->integer("round"), 3);
  EXPECT_EQ(back->integer("rank"), 5);
  EXPECT_EQ(back->text("store_addr"), "10.0.0.1");
  EXPECT_DOUBLE_EQ(*back->number("seconds"), 0.25);
  EXPECT_EQ(back->text("missing"), "");
  EXPECT_FALSE(back->integer("missing"));
  EXPECT_FALSE(back->integer("store_addr"));  // not a whole number
  EXPECT_FALSE(back->integer("seconds"));
}

TEST(ControlChannel, EncodeRefusesWhatDecodeCouldNotReadBack) {
  EXPECT_THROW(encode(Message("Bad")), InvalidArgument);
  EXPECT_THROW(encode(Message("")), InvalidArgument);
  Message key("abort");
  key.set("Why", "x");
  EXPECT_THROW(encode(key), InvalidArgument);
  Message type_field("abort");
  type_field.set("type", "round");
  EXPECT_THROW(encode(type_field), InvalidArgument);
  Message big("abort");
  big.set("why", std::string(kMaxMessageBytes, 'x'));
  EXPECT_THROW(encode(big), InvalidArgument);
  Message many("abort");
  for (std::size_t i = 0; i < kMaxFields; ++i) {
    many.set(std::string(1, static_cast<char>('a' + i / 26)) + static_cast<char>('a' + i % 26), 1);
  }
  EXPECT_NO_THROW(encode(many));
  many.set("zz", 1);  // one more than kMaxFields
  EXPECT_THROW(encode(many), InvalidArgument);
}

// A value is any bytes: what once made encode() throw out of the agent's loop
// (a reason with a newline) is escaped and read back as it was.
TEST(ControlChannel, ValuesWithNewlinesEqualsSignsBackslashesAndNulsRoundTrip) {
  const std::vector<std::string> values = {"two\nlines",
                                           "\n",
                                           "a=b=c",
                                           "=",
                                           "back\\slash",
                                           "\\",
                                           "\\n",
                                           "ends with \\",
                                           "\\\\\n\\",
                                           std::string("nul\0here", 8),
                                           std::string(1, '\0'),
                                           "",
                                           "tab\tand\rcarriage",
                                           "\xff\xfe bytes"};
  for (const auto& value : values) {
    Message m("abort");
    m.set("why", value).set("empty", "").set("round", 7);
    std::string bytes;
    ASSERT_NO_THROW(bytes = encode(m)) << "value '" << value << "'";
    // One field a line: the value's newline is not a line of its own.
    EXPECT_EQ(std::count(bytes.begin(), bytes.end(), '\n'), 5) << bytes;
    EXPECT_EQ(bytes.find('\0'), std::string::npos);
    auto back = decode(bytes);
    ASSERT_TRUE(back) << "value '" << value << "' encoded as " << bytes;
    EXPECT_EQ(*back, m);
    EXPECT_EQ(back->text("why"), value);
    EXPECT_EQ(back->text("empty"), "");
    EXPECT_EQ(back->integer("round"), 7);
    EXPECT_EQ(encode(*back), bytes);
  }
  // The escapes as written: a backslash, a newline, a NUL.
  Message m("abort");
  m.set("why", std::string("a\\b\nc\0d", 7));
  EXPECT_EQ(encode(m), "ddp-control 1\ntype=abort\nwhy=a\\\\b\\nc\\0d\n");
}

TEST(ControlChannel, DecodeRefusesEscapesEncodeNeverWrites) {
  EXPECT_TRUE(decode("ddp-control 1\ntype=abort\nwhy=a\\\\b\\nc\\0\n"));
  EXPECT_FALSE(decode("ddp-control 1\ntype=abort\nwhy=a\\tb\n"));  // not an escape of ours
  EXPECT_FALSE(decode("ddp-control 1\ntype=abort\nwhy=a\\\n"));    // a lone backslash at the end
  EXPECT_FALSE(decode("ddp-control 1\ntype=abort\nwhy=\\\n"));
  EXPECT_FALSE(decode("ddp-control 1\ntype=ab\\nort\n"));  // a type is a name: no escapes
}

TEST(ControlChannel, DecodeRefusesMalformedBytes) {
  EXPECT_FALSE(decode(""));
  EXPECT_FALSE(decode("ddp-control 2\ntype=round\n"));        // another version
  EXPECT_FALSE(decode("ddp-control 1\n"));                    // no type
  EXPECT_FALSE(decode("ddp-control 1\nrank=1\ntype=x\n"));    // type not first
  EXPECT_FALSE(decode("ddp-control 1\ntype=round\nrank"));    // no '=' and no newline
  EXPECT_FALSE(decode("ddp-control 1\ntype=round\nrank=1"));  // the last line unterminated
  EXPECT_FALSE(decode("ddp-control 1\ntype=round\nrank=1\nrank=2\n"));  // a key twice
  EXPECT_FALSE(decode("ddp-control 1\ntype=round\nRank=1\n"));
  EXPECT_FALSE(decode("ddp-control 1\ntype=round\ntype=abort\n"));
  EXPECT_FALSE(decode(std::string("ddp-control 1\ntype=round\nwhy=a\0b\n", 34)));
  std::string many = "ddp-control 1\ntype=round\n";
  for (std::size_t i = 0; i <= kMaxFields; ++i) {
    std::string key;
    for (std::size_t n = i + 1; n > 0; n /= 26) key += static_cast<char>('a' + n % 26);
    many += key + "=1\n";
  }
  EXPECT_FALSE(decode(many));
  EXPECT_TRUE(decode("ddp-control 1\ntype=round\nwhy=\n"));  // an empty value is a value
}

TEST(ControlChannel, MessagesCrossTheSocketPairInOrder) {
  Pair p;
  ASSERT_EQ(send(p.worker, Message("hello").set("in_place", 1)), Sent::kSent);
  ASSERT_EQ(send(p.worker, Message("reformed").set("round", 2)), Sent::kSent);
  Message got;
  ASSERT_EQ(receive(p.agent, got, false), Received::kMessage);
  EXPECT_EQ(got.type, "hello");
  ASSERT_EQ(receive(p.agent, got, false), Received::kMessage);
  EXPECT_EQ(got.type, "reformed");
  EXPECT_EQ(receive(p.agent, got, false), Received::kNothing);
}

TEST(ControlChannel, AWaitingReceiveWakesForAMessageAndForTheOtherEndClosing) {
  Pair p;
  std::thread sender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    send(p.agent, Message("abort").set("why", "node 2 was lost"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ::close(p.agent);
    p.agent = -1;
  });
  Message got;
  EXPECT_EQ(receive(p.worker, got, true), Received::kMessage);
  EXPECT_EQ(got.text("why"), "node 2 was lost");
  EXPECT_EQ(receive(p.worker, got, true), Received::kClosed);
  sender.join();
  // Sending to a closed end reports it instead of raising SIGPIPE.
  EXPECT_EQ(send(p.worker, Message("hello")), Sent::kClosed);
}

TEST(ControlChannel, ForeignAndOversizedDatagramsAreMalformedAndDropped) {
  Pair p;
  ASSERT_EQ(::send(p.worker, "hello", 5, 0), 5);
  std::string big = encode(Message("hello")) + std::string(kMaxMessageBytes, 'x');
  ASSERT_EQ(::send(p.worker, big.data(), big.size(), 0), static_cast<ssize_t>(big.size()));
  ASSERT_EQ(send(p.worker, Message("synced").set("bytes", 10)), Sent::kSent);
  Message got;
  EXPECT_EQ(receive(p.agent, got, false), Received::kMalformed);
  EXPECT_EQ(receive(p.agent, got, false), Received::kMalformed);
  ASSERT_EQ(receive(p.agent, got, false), Received::kMessage);  // the next one still reads
  EXPECT_EQ(got.integer("bytes"), 10);
}

// A peer that never reads: send() returns at once, kFull, once the socket's
// buffer holds all it can (it used to block there, and the agent's loop with it).
TEST(ControlChannel, SendingToAPeerThatNeverReadsReturnsFullInsteadOfBlocking) {
  Pair p;
  Message m("abort");
  m.set("why", std::string(1000, 'x'));
  auto filling = std::async(std::launch::async, [&] {
    std::vector<Sent> results;
    for (int i = 0; i < 100000; ++i) {  // a few hundred fill the buffer
      results.push_back(send(p.agent, m));
      if (results.back() != Sent::kSent) break;
    }
    return results;
  });
  if (filling.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ::shutdown(p.worker, SHUT_RDWR);  // the blocked send returns: the test ends
    filling.wait();
    FAIL() << "send() blocked on a peer that never reads";
  }
  const std::vector<Sent> results = filling.get();
  ASSERT_GT(results.size(), 1u);
  EXPECT_EQ(results.back(), Sent::kFull);
  EXPECT_EQ(std::count(results.begin(), results.end(), Sent::kSent),
            static_cast<std::ptrdiff_t>(results.size() - 1));
  // Still full, still at once; the messages queued are intact and in order.
  EXPECT_EQ(send(p.agent, m), Sent::kFull);
  Message got;
  ASSERT_EQ(receive(p.worker, got, false), Received::kMessage);
  EXPECT_EQ(got, m);
  // Once the peer read, there is room again.
  while (receive(p.worker, got, false) == Received::kMessage) {
  }
  EXPECT_EQ(send(p.agent, m), Sent::kSent);
  EXPECT_NE(std::string(describe(Sent::kFull)).find("full"), std::string::npos);
}

TEST(ControlChannel, SendRefusesAMessageItCannotEncodeWithoutThrowing) {
  Pair p;
  Message big("abort");
  big.set("why", std::string(kMaxMessageBytes, 'x'));
  EXPECT_EQ(send(p.agent, big), Sent::kRefused);
  EXPECT_EQ(send(p.agent, Message("Bad")), Sent::kRefused);
  Message got;
  EXPECT_EQ(receive(p.worker, got, false), Received::kNothing);
}

TEST(ControlChannel, BothEndsAreCloseOnExec) {
  Pair p;
  EXPECT_TRUE(::fcntl(p.agent, F_GETFD) & FD_CLOEXEC);
  EXPECT_TRUE(::fcntl(p.worker, F_GETFD) & FD_CLOEXEC);
}

}  // namespace
}  // namespace ddp::control
