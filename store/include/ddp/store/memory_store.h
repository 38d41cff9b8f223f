// An in-process Store (Gloo's HashStore): a map guarded by one mutex, blocked
// readers wait on a condition variable. For tests and for single-process use.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "ddp/store/store.h"

namespace ddp {

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(Duration timeout = kDefaultTimeout) : Store(timeout) {}

  void set(const std::string& key, const std::string& value) override;
  using Store::get;
  std::string get(const std::string& key, Duration timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  std::int64_t num_keys() override;
  using Store::multi_get;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     Duration timeout) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;
  void append(const std::string& key, const std::string& value) override;

 private:
  // Waits, with mutex_ held through `lock`, until every key exists.
  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   Duration timeout, const char* origin);

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> data_;
};

}  // namespace ddp
