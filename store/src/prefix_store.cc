#include "ddp/store/prefix_store.h"

#include "ddp/common/error.h"

namespace ddp {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  if (!base_) throw InvalidArgument("PrefixStore", "base store is null");
  set_timeout(base_->timeout());
}

std::vector<std::string> PrefixStore::keys(const std::vector<std::string>& keys) const {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const auto& k : keys) prefixed.push_back(key(k));
  return prefixed;
}

void PrefixStore::set(const std::string& k, const std::string& value) { base_->set(key(k), value); }

std::string PrefixStore::get(const std::string& k, Duration timeout) {
  return base_->get(key(k), timeout);
}

std::int64_t PrefixStore::add(const std::string& k, std::int64_t delta) {
  return base_->add(key(k), delta);
}

std::string PrefixStore::compare_set(const std::string& k, const std::string& expected,
                                     const std::string& desired) {
  return base_->compare_set(key(k), expected, desired);
}

void PrefixStore::wait(const std::vector<std::string>& ks, Duration timeout) {
  base_->wait(keys(ks), timeout);
}

bool PrefixStore::check(const std::vector<std::string>& ks) { return base_->check(keys(ks)); }

bool PrefixStore::delete_key(const std::string& k) { return base_->delete_key(key(k)); }

std::int64_t PrefixStore::num_keys() { return base_->num_keys(); }

std::vector<std::string> PrefixStore::multi_get(const std::vector<std::string>& ks,
                                                Duration timeout) {
  return base_->multi_get(keys(ks), timeout);
}

void PrefixStore::multi_set(const std::vector<std::string>& ks,
                            const std::vector<std::string>& values) {
  base_->multi_set(keys(ks), values);
}

void PrefixStore::append(const std::string& k, const std::string& value) {
  base_->append(key(k), value);
}

}  // namespace ddp
