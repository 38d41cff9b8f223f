#include "ddp/store/forwarding_store.h"

#include "ddp/common/error.h"

namespace ddp {

namespace {

// The base's timeout, read before the base is moved from.
Store::Duration timeout_of(const std::shared_ptr<Store>& base, const char* origin) {
  if (!base) throw InvalidArgument(origin, "base store is null");
  return base->timeout();
}

}  // namespace

ForwardingStore::ForwardingStore(std::shared_ptr<Store> base, const char* origin)
    : Store(timeout_of(base, origin)), base_(std::move(base)) {}

std::vector<std::string> ForwardingStore::base_keys(const std::vector<std::string>& keys) const {
  std::vector<std::string> named;
  named.reserve(keys.size());
  for (const auto& k : keys) named.push_back(base_key(k));
  return named;
}

void ForwardingStore::set(const std::string& key, const std::string& value) {
  before_call("set");
  base_->set(base_key(key), value);
}

std::string ForwardingStore::get(const std::string& key, Duration timeout) {
  const std::string named = base_key(key);
  std::string value;
  run_blocking("get", timeout, [&](Duration t) { value = base_->get(named, t); });
  return value;
}

std::int64_t ForwardingStore::add(const std::string& key, std::int64_t delta) {
  before_call("add");
  return base_->add(base_key(key), delta);
}

std::string ForwardingStore::compare_set(const std::string& key, const std::string& expected,
                                         const std::string& desired) {
  before_call("compare_set");
  return base_->compare_set(base_key(key), expected, desired);
}

void ForwardingStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  const std::vector<std::string> named = base_keys(keys);
  run_blocking("wait", timeout, [&](Duration t) { base_->wait(named, t); });
}

bool ForwardingStore::check(const std::vector<std::string>& keys) {
  before_call("check");
  return base_->check(base_keys(keys));
}

bool ForwardingStore::delete_key(const std::string& key) {
  before_call("delete_key");
  return base_->delete_key(base_key(key));
}

std::int64_t ForwardingStore::num_keys() {
  before_call("num_keys");
  return base_->num_keys();
}

std::vector<std::string> ForwardingStore::multi_get(const std::vector<std::string>& keys,
                                                    Duration timeout) {
  const std::vector<std::string> named = base_keys(keys);
  std::vector<std::string> values;
  run_blocking("multi_get", timeout, [&](Duration t) { values = base_->multi_get(named, t); });
  return values;
}

void ForwardingStore::multi_set(const std::vector<std::string>& keys,
                                const std::vector<std::string>& values) {
  before_call("multi_set");
  base_->multi_set(base_keys(keys), values);
}

void ForwardingStore::append(const std::string& key, const std::string& value) {
  before_call("append");
  base_->append(base_key(key), value);
}

}  // namespace ddp
