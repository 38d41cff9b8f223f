// A Store that passes every call on to another store, its base: the one
// shape of a store decorator (PrefixStore; the worker library's
// AbortableStore). A decorator changes what passes through by overriding the
// three hooks below, never the calls themselves, so the list of Store's calls
// is written here once for all of them.
//
// Ownership: shares the base. Blocking: as the base's calls, plus what
// run_blocking adds. Thread-safety: as the base (every call may come from
// several threads at once), so the hooks must be thread-safe. Errors: the
// base's, and what the hooks throw.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/store/store.h"

namespace ddp {

class ForwardingStore : public Store {
 public:
  void set(const std::string& key, const std::string& value) final;
  using Store::get;
  std::string get(const std::string& key, Duration timeout) final;
  std::int64_t add(const std::string& key, std::int64_t delta) final;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) final;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Duration timeout) final;
  bool check(const std::vector<std::string>& keys) final;
  bool delete_key(const std::string& key) final;
  std::int64_t num_keys() final;
  using Store::multi_get;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys, Duration timeout) final;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) final;
  void append(const std::string& key, const std::string& value) final;

  const std::shared_ptr<Store>& base() const { return base_; }

 protected:
  // Shares ownership of `base`; its timeout is the initial timeout here.
  // Throws InvalidArgument (origin `origin`) for a null base.
  ForwardingStore(std::shared_ptr<Store> base, const char* origin);

  // The base's name for `key`; `key` itself unless overridden.
  virtual std::string base_key(const std::string& key) const { return key; }

  // Called before a call that does not block (every call but get, wait and
  // multi_get) goes to the base; `op` names it ("set", "num_keys"). May throw
  // to refuse the call. Does nothing unless overridden.
  virtual void before_call(const char* op) { (void)op; }

  // A blocking call (get, wait, multi_get) that may wait up to `timeout`:
  // `call(t)` makes it on the base with the timeout t. Calls call(timeout)
  // once unless overridden (to wait in slices, say).
  using BlockingCall = std::function<void(Duration)>;
  virtual void run_blocking(const char* op, Duration timeout, const BlockingCall& call) {
    (void)op;
    call(timeout);
  }

 private:
  std::vector<std::string> base_keys(const std::vector<std::string>& keys) const;

  std::shared_ptr<Store> base_;
};

}  // namespace ddp
