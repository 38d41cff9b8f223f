#include "ddp/store/memory_store.h"

#include "ddp/common/error.h"
#include "ddp/common/time.h"
#include "ddp/store/store_util.h"

namespace ddp {

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard lock(mutex_);
    data_[key] = value;
  }
  changed_.notify_all();
}

std::string MemoryStore::get(const std::string& key, Duration timeout) {
  std::unique_lock lock(mutex_);
  wait_locked(lock, {key}, timeout, "MemoryStore::get");
  return data_.at(key);
}

std::int64_t MemoryStore::add(const std::string& key, std::int64_t delta) {
  std::int64_t result = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = data_.find(key);
    result = store_util::add_to_decimal(it == data_.end() ? nullptr : &it->second, delta,
                                        "MemoryStore::add", key);
    data_[key] = std::to_string(result);
  }
  changed_.notify_all();
  return result;
}

std::string MemoryStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  std::string result;
  {
    std::lock_guard lock(mutex_);
    auto it = data_.find(key);
    result = store_util::compare_set(data_, it, key, expected, desired);
  }
  changed_.notify_all();
  return result;
}

void MemoryStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock lock(mutex_);
  wait_locked(lock, keys, timeout, "MemoryStore::wait");
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  for (const auto& key : keys) {
    if (data_.find(key) == data_.end()) return false;
  }
  return true;
}

bool MemoryStore::delete_key(const std::string& key) {
  std::lock_guard lock(mutex_);
  return data_.erase(key) > 0;
}

std::int64_t MemoryStore::num_keys() {
  std::lock_guard lock(mutex_);
  return static_cast<std::int64_t>(data_.size());
}

std::vector<std::string> MemoryStore::multi_get(const std::vector<std::string>& keys,
                                                Duration timeout) {
  std::unique_lock lock(mutex_);
  wait_locked(lock, keys, timeout, "MemoryStore::multi_get");
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(data_.at(key));
  return values;
}

void MemoryStore::multi_set(const std::vector<std::string>& keys,
                            const std::vector<std::string>& values) {
  store_util::check_multi_set(keys, values, "MemoryStore::multi_set");
  {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < keys.size(); ++i) data_[keys[i]] = values[i];
  }
  changed_.notify_all();
}

void MemoryStore::append(const std::string& key, const std::string& value) {
  {
    std::lock_guard lock(mutex_);
    data_[key] += value;
  }
  changed_.notify_all();
}

void MemoryStore::wait_locked(std::unique_lock<std::mutex>& lock,
                              const std::vector<std::string>& keys, Duration timeout,
                              const char* origin) {
  Deadline deadline(timeout);
  auto all_present = [&] {
    for (const auto& key : keys) {
      if (data_.find(key) == data_.end()) return false;
    }
    return true;
  };
  while (!all_present()) {
    // An expired deadline (a zero timeout: "is it there?") does not sleep first.
    if (deadline.expired() ||
        (changed_.wait_until(lock, deadline.when()) == std::cv_status::timeout && !all_present())) {
      std::vector<std::string> missing;
      for (const auto& key : keys) {
        if (data_.find(key) == data_.end()) missing.push_back(key);
      }
      throw TimeoutError(origin, store_util::timeout_message(missing, timeout));
    }
  }
}

}  // namespace ddp
