#include "ddp/common/error.h"

#include <gtest/gtest.h>

namespace ddp {
namespace {

TEST(Error, CarriesKindOriginAndMessage) {
  TimeoutError error("TcpStore::get", "timed out after 1 s");
  EXPECT_EQ(error.kind(), ErrorKind::kTimeout);
  EXPECT_EQ(error.origin(), "TcpStore::get");
  EXPECT_STREQ(error.what(), "TcpStore::get: timed out after 1 s");
}

TEST(Error, EmptyOriginLeavesMessageAlone) {
  InvalidArgument error("", "--nnodes: expected N or MIN:MAX");
  EXPECT_STREQ(error.what(), "--nnodes: expected N or MIN:MAX");
}

TEST(Error, ThrowErrorRaisesTheSubclassOfItsKind) {
  EXPECT_THROW(throw_error(ErrorKind::kNetwork, "x", "y"), NetworkError);
  EXPECT_THROW(throw_error(ErrorKind::kProtocol, "x", "y"), ProtocolError);
  EXPECT_THROW(throw_error(ErrorKind::kAuth, "x", "y"), AuthError);
  EXPECT_THROW(throw_error(ErrorKind::kTimeout, "x", "y"), TimeoutError);
  EXPECT_THROW(throw_error(ErrorKind::kShutdown, "x", "y"), ShutdownError);
  EXPECT_THROW(throw_error(ErrorKind::kGroupChanged, "x", "y"), GroupChanged);
  EXPECT_THROW(throw_error(ErrorKind::kBackend, "x", "y"), BackendError);
  EXPECT_THROW(throw_error(ErrorKind::kInvalidArgument, "x", "y"), InvalidArgument);
  EXPECT_THROW(throw_error(ErrorKind::kInternal, "x", "y"), InternalError);
  try {
    throw_error(ErrorKind::kNetwork, "origin", "message");
  } catch (const Error& e) {
    EXPECT_EQ(e.origin(), "origin");
    EXPECT_EQ(to_string(e.kind()), "NetworkError");
  }
}

TEST(Error, WhatOfACapturedExceptionIsItsMessage) {
  EXPECT_EQ(what_of(std::make_exception_ptr(std::runtime_error("disk full"))), "disk full");
  EXPECT_EQ(what_of(std::make_exception_ptr(NetworkError("TcpStore::get", "reset"))),
            NetworkError("TcpStore::get", "reset").what());
  EXPECT_EQ(what_of(std::make_exception_ptr(42)), "unknown error");
}

}  // namespace
}  // namespace ddp
