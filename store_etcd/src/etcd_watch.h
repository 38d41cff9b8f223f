// Watches on etcd's /v3/watch stream, each on a connection of its own: the
// one-key wait under EtcdStore's blocking get/wait/multi_get, and the
// prefix watch behind StoreWatches::watch_prefix.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ddp/common/time.h"
#include "ddp/store/store_capabilities.h"
#include "etcd_http.h"

namespace ddp::etcd {

enum class WaitResult {
  kPut,      // the key was put at `from_revision` or later
  kTimeout,  // the deadline passed first
  kRecheck,  // the watch broke or was cancelled: read again and wait again
};

// Waits for a PUT of `key` (a full etcd key) at revision `from_revision` or
// later. A stream that breaks, sends what is not etcd's, or whose member stops
// answering (checked every watch_check_interval of silence) is kRecheck, its
// endpoint marked failed. Throws NetworkError when no endpoint can be reached
// within the transport's request_timeout, ProtocolError when every endpoint
// sent what is not etcd's (counted in `failures`, which the caller keeps
// across its waits).
WaitResult wait_for_put(Transport& transport, const std::string& origin, const std::string& key,
                        std::int64_t from_revision, const Deadline& deadline,
                        Transport::Failures& failures);

// Starts a watch of every key in [key, range_end) (full etcd keys) from
// `from_revision` (0: now); events carry their key without its first
// `strip` bytes (the store's prefix). See StoreWatches::watch_prefix.
std::unique_ptr<StoreWatch> start_watch(std::shared_ptr<Transport> transport, std::string key,
                                        std::string range_end, std::size_t strip,
                                        std::int64_t from_revision,
                                        std::function<void(const StoreEvent&)> on_event,
                                        std::function<void(const std::string&)> on_error);

}  // namespace ddp::etcd
