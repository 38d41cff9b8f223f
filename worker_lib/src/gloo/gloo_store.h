// Adapter from ddp::Store to gloo::rendezvous::Store, so Gloo's full-mesh
// rendezvous exchanges its addresses through our store (and its prefix).
#pragma once

#include <memory>

#include <gloo/rendezvous/store.h>

#include "ddp/store/store.h"

namespace ddp::detail {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  // `timeout` bounds get/wait without an explicit timeout (Gloo's API has none).
  GlooStore(std::shared_ptr<ddp::Store> store, std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    auto value = store_->get(key, timeout_);
    return {value.begin(), value.end()};
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<ddp::Store> store_;
  std::chrono::milliseconds timeout_;
};

}  // namespace ddp::detail
