// torch's c10d::Store (the store torch.distributed hands a backend: a
// PrefixStore per group over the job's TCPStore) presented as a ddp::Store, so
// that ddp::make_gloo_process_group meets its peers through it.
//
// Thread-safe as the wrapped store is (torch's TCPStore and PrefixStore are).
// Errors: a blocking call whose wait ran out throws TimeoutError naming the
// keys; any other failure of the torch store throws NetworkError with torch's
// message. compare_set, multi_get, multi_set and append are built from torch's
// calls (torch 1.13's Store has no multi-key calls and no append). A wait
// polls torch's check() instead of calling its wait(): after a TCPStore wait
// that timed out, torch 1.13's next call on the same connection fails
// ("Socket Timeout", seen with a get of a key that was set meanwhile), and the
// worker library's in-place recovery waits in short slices (an AbortableStore)
// to notice the round's end.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "ddp/store/store.h"

namespace ddp::torch_backend {

class TorchStore final : public ddp::Store {
 public:
  // `timeout`: the default of blocking calls (the group's timeout).
  TorchStore(c10::intrusive_ptr<c10d::Store> store, Duration timeout);

  void set(const std::string& key, const std::string& value) override;
  using ddp::Store::get;
  std::string get(const std::string& key, Duration timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  using ddp::Store::wait;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  std::int64_t num_keys() override;
  using ddp::Store::multi_get;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     Duration timeout) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;
  void append(const std::string& key, const std::string& value) override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// The name of the torch group whose store this is: torch gives every group a
// PrefixStore named after the group ("0" for the default group, then "1",
// "2"... in new_group order); "" when `store` is not a PrefixStore.
std::string torch_group_name(const c10::intrusive_ptr<c10d::Store>& store);

}  // namespace ddp::torch_backend
