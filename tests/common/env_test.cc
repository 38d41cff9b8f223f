#include "ddp/common/env.h"

#include <cstdlib>

#include <gtest/gtest.h>

#include "ddp/common/error.h"
#include "ddp/common/logging.h"

namespace ddp {
namespace {

class EnvTest : public ::testing::Test {
 protected:
  void TearDown() override {
    ::unsetenv("DDP_TEST_VAR");
    ::unsetenv("DDP_LOG_LEVEL");
  }
};

TEST_F(EnvTest, UnsetIsNullopt) {
  ::unsetenv("DDP_TEST_VAR");
  EXPECT_FALSE(env::get("DDP_TEST_VAR").has_value());
  EXPECT_FALSE(env::get_int("DDP_TEST_VAR").has_value());
  EXPECT_EQ(env::get_or("DDP_TEST_VAR", "fallback"), "fallback");
}

TEST_F(EnvTest, ParsesIntegers) {
  ::setenv("DDP_TEST_VAR", "-42", 1);
  EXPECT_EQ(env::get_int("DDP_TEST_VAR"), -42);
  ::setenv("DDP_TEST_VAR", "4x", 1);
  try {
    env::get_int("DDP_TEST_VAR");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_TEST_VAR"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'4x'"), std::string::npos) << e.what();
  }
}

TEST_F(EnvTest, ParsesBooleans) {
  for (const char* yes : {"1", "true", "TRUE", "yes", "on"}) {
    ::setenv("DDP_TEST_VAR", yes, 1);
    EXPECT_EQ(env::get_bool("DDP_TEST_VAR"), true) << yes;
  }
  for (const char* no : {"0", "false", "No", "off"}) {
    ::setenv("DDP_TEST_VAR", no, 1);
    EXPECT_EQ(env::get_bool("DDP_TEST_VAR"), false) << no;
  }
  ::setenv("DDP_TEST_VAR", "maybe", 1);
  EXPECT_THROW(env::get_bool("DDP_TEST_VAR"), InvalidArgument);
}

TEST_F(EnvTest, ParsesSeconds) {
  EXPECT_EQ(env::parse_seconds("1.5", "t").count(), 1500);
  EXPECT_EQ(env::parse_seconds("0", "t").count(), 0);
  EXPECT_THROW(env::parse_seconds("-1", "t"), InvalidArgument);
  EXPECT_THROW(env::parse_seconds("soon", "t"), InvalidArgument);
  EXPECT_THROW(env::parse_seconds("", "t"), InvalidArgument);
}

TEST_F(EnvTest, LogLevelComesFromTheEnvironment) {
  ::setenv("DDP_LOG_LEVEL", "debug", 1);
  auto logger = log::init("env_test_debug");
  EXPECT_EQ(logger->level(), spdlog::level::debug);
  ::setenv("DDP_LOG_LEVEL", "loud", 1);
  EXPECT_THROW(log::init("env_test_bad"), InvalidArgument);
  EXPECT_EQ(log::parse_level("off", "x"), spdlog::level::off);
}

}  // namespace
}  // namespace ddp
