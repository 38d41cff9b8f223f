#include "ddp/common/text.h"

#include <gtest/gtest.h>

namespace ddp {
namespace {

TEST(Printable, KeepsPrintableAsciiAndReplacesEveryOtherByte) {
  EXPECT_EQ(printable("node-7.example.org:29400 ~!\"'\\"), "node-7.example.org:29400 ~!\"'\\");
  // An escape sequence, a forged log line, DEL, a NUL and the bytes of "é".
  EXPECT_EQ(printable(std::string("a\x1b[2Jb\nddprun: x\r\x7f\0\xc3\xa9", 21)),
            "a?[2Jb?ddprun: x?????");
  EXPECT_EQ(printable(""), "");
  for (int c = 0; c < 256; ++c) {
    const char byte = static_cast<char>(c);
    EXPECT_EQ(is_printable(byte), c >= 0x20 && c <= 0x7e) << c;
    EXPECT_EQ(printable(std::string(1, byte)), is_printable(byte) ? std::string(1, byte) : "?");
  }
}

TEST(SecondsText, WritesExactSecondsWithoutTrailingZeros) {
  using std::chrono::milliseconds;
  EXPECT_EQ(seconds_text(milliseconds(0)), "0");
  EXPECT_EQ(seconds_text(milliseconds(300000)), "300");
  EXPECT_EQ(seconds_text(milliseconds(500)), "0.5");
  EXPECT_EQ(seconds_text(milliseconds(1250)), "1.25");
  EXPECT_EQ(seconds_text(milliseconds(1001)), "1.001");
  EXPECT_EQ(seconds_text(milliseconds(1234567)), "1234.567");
  EXPECT_EQ(seconds_text(milliseconds(-1250)), "-1.25");
  EXPECT_EQ(seconds_text(milliseconds(-3000)), "-3");
}

}  // namespace
}  // namespace ddp
