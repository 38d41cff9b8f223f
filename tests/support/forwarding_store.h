// ForwardingStore: a Store that passes every call on to another one. Tests
// derive from it and override the calls they want to delay, fail or record
// (a store host that freezes, a connection that drops), keeping the inner
// store's behaviour for the rest.
//
// Ownership: shares the inner store (shared_ptr). Blocking and errors: those
// of the inner store, plus what an override adds. Thread-safety: as the inner
// store (every Store is thread-safe); an override must keep it so.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/store/store.h"

namespace ddp::test {

class ForwardingStore : public Store {
 public:
  explicit ForwardingStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}

  void set(const std::string& key, const std::string& value) override { inner_->set(key, value); }
  using Store::get;
  std::string get(const std::string& key, Duration timeout) override {
    return inner_->get(key, timeout);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return inner_->add(key, delta);
  }
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    return inner_->compare_set(key, expected, desired);
  }
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Duration timeout) override {
    inner_->wait(keys, timeout);
  }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  bool delete_key(const std::string& key) override { return inner_->delete_key(key); }
  std::int64_t num_keys() override { return inner_->num_keys(); }
  using Store::multi_get;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     Duration timeout) override {
    return inner_->multi_get(keys, timeout);
  }
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override {
    inner_->multi_set(keys, values);
  }
  void append(const std::string& key, const std::string& value) override {
    inner_->append(key, value);
  }

  Store& inner() { return *inner_; }

 private:
  std::shared_ptr<Store> inner_;
};

}  // namespace ddp::test
