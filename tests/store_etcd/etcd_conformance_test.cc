// The store conformance suite (tests/store/conformance_suite.h) against
// EtcdStore on a one-member etcd cluster, directly and under a PrefixStore.
// One cluster serves the whole program (started on first use); each test
// gets a fresh random key prefix, so tests never see each other's keys.
#include <atomic>
#include <memory>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "conformance_suite.h"
#include "ddp/store/prefix_store.h"
#include "ddp/store_etcd/etcd_store.h"
#include "etcd_cluster.h"

namespace ddp::conformance {
namespace {

// The program's cluster, started on first use; nullptr (and `error`) when it
// could not start.
test::EtcdCluster* shared_cluster(std::string& error) {
  static std::unique_ptr<test::EtcdCluster> cluster;
  static std::string start_error;
  static bool tried = false;
  if (!tried) {
    tried = true;
    try {
      cluster = std::make_unique<test::EtcdCluster>(1);
    } catch (const std::exception& e) {
      start_error = e.what();
    }
  }
  error = start_error;
  return cluster.get();
}

std::string fresh_prefix() {
  static const std::string run = std::to_string(std::random_device{}());
  static std::atomic<int> next{0};
  return "conformance/" + run + "/" + std::to_string(next++) + "/";
}

std::shared_ptr<EtcdStore> connect_etcd(const std::string& prefix) {
  std::string error;
  test::EtcdCluster* cluster = shared_cluster(error);
  if (cluster == nullptr) throw std::runtime_error("the etcd cluster did not start: " + error);
  EtcdStoreOptions options;
  options.endpoints = cluster->client_endpoints();
  options.prefix = prefix;
  options.connect_timeout = std::chrono::seconds(10);
  options.request_timeout = std::chrono::seconds(10);
  options.timeout = kTestTimeout;
  return std::make_shared<EtcdStore>(options);
}

std::string etcd_skip_reason() {
  return test::EtcdCluster::available()
             ? std::string()
             : std::string("etcd is not installed (") + test::EtcdCluster::kBinary + " missing)";
}

struct EtcdEnv {
  static constexpr const char* kName = "EtcdStore";
  // Per test: the store's options.prefix, a key space of its own.
  const std::string kKeyPrefix = fresh_prefix();

  std::string skip_reason() { return etcd_skip_reason(); }
  std::shared_ptr<Store> client() { return connect_etcd(kKeyPrefix); }
  std::shared_ptr<Store> raw_client() { return connect_etcd(""); }
};

struct PrefixEtcdEnv {
  static constexpr const char* kName = "PrefixStoreOverEtcdStore";
  const std::string base_prefix = fresh_prefix();
  const std::string kKeyPrefix = base_prefix + "job/round0/";

  std::string skip_reason() { return etcd_skip_reason(); }
  std::shared_ptr<Store> client() {
    return std::make_shared<PrefixStore>("job/round0", connect_etcd(base_prefix));
  }
  std::shared_ptr<Store> raw_client() { return connect_etcd(""); }
};

}  // namespace

using Envs = ::testing::Types<EtcdEnv, PrefixEtcdEnv>;

}  // namespace ddp::conformance

#include "conformance_suite_tests.h"
