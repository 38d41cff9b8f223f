#include "torch_store.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <chrono>
#include <thread>

#include "ddp/common/error.h"

namespace ddp::torch_backend {
namespace {

constexpr const char* kOrigin = "ddp_torch store";

std::vector<std::uint8_t> bytes_of(const std::string& text) {
  return std::vector<std::uint8_t>(text.begin(), text.end());
}

std::string text_of(const std::vector<std::uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::string key_list(const std::vector<std::string>& keys) {
  std::string list;
  for (const auto& key : keys) list += (list.empty() ? "" : ", ") + key;
  return list;
}

// Runs `call` on the torch store, turning torch's errors into ddp's.
template <typename Call>
auto guarded(const char* what, Call&& call) -> decltype(call()) {
  try {
    return call();
  } catch (const ddp::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw NetworkError(kOrigin, std::string(what) + ": " + e.what());
  }
}

// Reads the PrefixStore's prefix (a protected member) through a member pointer
// taken in a derived class: no object of the derived type is ever made.
struct PrefixReader : c10d::PrefixStore {
  static const std::string& prefix_of(const c10d::PrefixStore& store) {
    return store.*(&PrefixReader::prefix_);
  }
};

}  // namespace

TorchStore::TorchStore(c10::intrusive_ptr<c10d::Store> store, Duration timeout)
    : ddp::Store(timeout), store_(std::move(store)) {
  if (!store_) throw InvalidArgument(kOrigin, "the torch store is null");
}

void TorchStore::set(const std::string& key, const std::string& value) {
  guarded("set", [&] { store_->set(key, bytes_of(value)); });
}

std::string TorchStore::get(const std::string& key, Duration timeout) {
  wait({key}, timeout);
  return guarded("get", [&] { return text_of(store_->get(key)); });
}

std::int64_t TorchStore::add(const std::string& key, std::int64_t delta) {
  return guarded("add", [&] { return store_->add(key, delta); });
}

std::string TorchStore::compare_set(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  return guarded("compare_set", [&] {
    return text_of(store_->compareSet(key, bytes_of(expected), bytes_of(desired)));
  });
}

void TorchStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  // The pause between two checks: short at first (peers usually answer within
  // a few milliseconds), then growing to kMaxPause.
  constexpr Duration kMaxPause = std::chrono::milliseconds(20);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Duration pause = std::chrono::milliseconds(1);
  while (!check(keys)) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      throw TimeoutError(kOrigin, "keys not set within " + std::to_string(timeout.count()) +
                                      " ms: " + key_list(keys));
    }
    std::this_thread::sleep_for(
        std::min(pause, std::chrono::duration_cast<Duration>(deadline - now)));
    pause = std::min(pause * 2, kMaxPause);
  }
}

bool TorchStore::check(const std::vector<std::string>& keys) {
  return guarded("check", [&] { return store_->check(keys); });
}

bool TorchStore::delete_key(const std::string& key) {
  return guarded("delete_key", [&] { return store_->deleteKey(key); });
}

std::int64_t TorchStore::num_keys() {
  return guarded("num_keys", [&] { return store_->getNumKeys(); });
}

std::vector<std::string> TorchStore::multi_get(const std::vector<std::string>& keys,
                                               Duration timeout) {
  wait(keys, timeout);
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& key : keys) {
    values.push_back(guarded("multi_get", [&] { return text_of(store_->get(key)); }));
  }
  return values;
}

void TorchStore::multi_set(const std::vector<std::string>& keys,
                           const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw InvalidArgument(kOrigin, "multi_set: " + std::to_string(keys.size()) + " keys but " +
                                       std::to_string(values.size()) + " values");
  }
  for (std::size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

void TorchStore::append(const std::string& key, const std::string& value) {
  // Read-modify-write made atomic by compare_set: retried while another rank
  // appended in between.
  std::string current = check({key}) ? get(key, timeout()) : std::string();
  for (;;) {
    const std::string desired = current + value;
    const std::string now = compare_set(key, current, desired);
    if (now == desired) return;
    current = now;
  }
}

std::string torch_group_name(const c10::intrusive_ptr<c10d::Store>& store) {
  const auto* prefix_store = dynamic_cast<const c10d::PrefixStore*>(store.get());
  return prefix_store == nullptr ? std::string() : PrefixReader::prefix_of(*prefix_store);
}

}  // namespace ddp::torch_backend
