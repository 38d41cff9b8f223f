#include "ddp/common/control_channel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

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
  Message newline("abort");
  newline.set("why", "two\nlines");
  EXPECT_THROW(encode(newline), InvalidArgument);
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
  ASSERT_TRUE(send(p.worker, Message("hello").set("in_place", 1)));
  ASSERT_TRUE(send(p.worker, Message("reformed").set("round", 2)));
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
  EXPECT_FALSE(send(p.worker, Message("hello")));
}

TEST(ControlChannel, ForeignAndOversizedDatagramsAreMalformedAndDropped) {
  Pair p;
  ASSERT_EQ(::send(p.worker, "hello", 5, 0), 5);
  std::string big = encode(Message("hello")) + std::string(kMaxMessageBytes, 'x');
  ASSERT_EQ(::send(p.worker, big.data(), big.size(), 0), static_cast<ssize_t>(big.size()));
  ASSERT_TRUE(send(p.worker, Message("synced").set("bytes", 10)));
  Message got;
  EXPECT_EQ(receive(p.agent, got, false), Received::kMalformed);
  EXPECT_EQ(receive(p.agent, got, false), Received::kMalformed);
  ASSERT_EQ(receive(p.agent, got, false), Received::kMessage);  // the next one still reads
  EXPECT_EQ(got.integer("bytes"), 10);
}

TEST(ControlChannel, BothEndsAreCloseOnExec) {
  Pair p;
  EXPECT_TRUE(::fcntl(p.agent, F_GETFD) & FD_CLOEXEC);
  EXPECT_TRUE(::fcntl(p.worker, F_GETFD) & FD_CLOEXEC);
}

}  // namespace
}  // namespace ddp::control
