// The Store conformance suite (c10d's approach): typed tests that every Store
// implementation must pass. This header has what environments need (the
// timeouts, the fixture); conformance_suite_tests.h has the tests. A test
// program includes this header, declares its environments and their list as
// ddp::conformance::Envs, then includes conformance_suite_tests.h once:
//
//   #include "conformance_suite.h"
//   namespace ddp::conformance {
//   struct MyEnv {
//     static constexpr const char* kName = "MyStore";   // the test names' type part
//     // What the client's keys look like in the store below it: raw_client()
//     // sees client()'s key k as kKeyPrefix + k. A static constexpr member, or a
//     // per-environment (non-static) std::string member.
//     static constexpr const char* kKeyPrefix = "";
//     std::shared_ptr<Store> client();       // a new client (default timeout kTestTimeout)
//     std::shared_ptr<Store> raw_client();   // a client of the store without the prefix
//     std::string skip_reason();             // optional: non-empty skips each test
//   };
//   using Envs = ::testing::Types<MyEnv>;
//   }  // namespace ddp::conformance
//   #include "conformance_suite_tests.h"
//
// The tests are named StoreConformance/<kName>.<Test>. (A typed suite whose
// type list is declared first rather than TYPED_TEST_SUITE_P: gtest refuses
// an empty instantiation prefix, so _P would rename every test.)
//
// An environment is created per test, so each test starts with an empty
// store (or, for a shared server, an empty key space under kKeyPrefix).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ddp/common/error.h"
#include "ddp/store/prefix_store.h"
#include "ddp/store/store.h"

namespace ddp::conformance {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using SteadyClock = std::chrono::steady_clock;

// Default timeout of every store under test: long enough never to fire in a
// passing test, short enough that a broken blocking call fails the test
// instead of hanging it for the 5-minute library default.
constexpr Store::Duration kTestTimeout = 10s;
// Timeout used where a test expects a TimeoutError.
constexpr Store::Duration kShortTimeout = 150ms;
// How long a test waits to be sure that a blocking call is still blocked.
constexpr auto kStillBlocked = 100ms;

inline double seconds_since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// An environment may have `std::string skip_reason()`: when it returns
// something, each test is skipped with that reason (etcd not installed).
template <typename Env>
class StoreConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    if constexpr (requires(Env & env) { env.skip_reason(); }) {
      const std::string reason = env_.skip_reason();
      if (!reason.empty()) GTEST_SKIP() << reason;
    }
    store_ = env_.client();
  }

  Env env_;
  std::shared_ptr<Store> store_;
};

// Names the instantiations after Env::kName ("StoreConformance/TcpStore.*").
struct EnvNames {
  template <typename Env>
  static std::string GetName(int) {
    return Env::kName;
  }
};

}  // namespace ddp::conformance
