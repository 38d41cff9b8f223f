// The daemon's live view (--status-port): /metrics (Prometheus text), /livez
// and /readyz (etcd's convention), /status (JSON) and / (the page), answered
// from StoreServer::stats(), which the store's serving thread fills.
//
// Ownership: borrows the server, which must outlive every call. Blocking: at
// most kStatsWait per request (the serving thread answers the figures).
// Thread-safety: any thread. Errors: none thrown; a serving thread that does
// not answer makes /livez and /readyz 503 and /metrics and /status 503.
#pragma once

#include <chrono>
#include <string>

#include "ddp/status_http/server.h"
#include "ddp/store_server/store_server.h"

namespace ddp::daemon {

inline constexpr std::chrono::milliseconds kStatsWait{1000};

struct DaemonFacts {
  std::string address;  // "host:port" of the store
  bool auth = false;
  std::chrono::steady_clock::time_point started{};
};

status_http::Response answer(const status_http::Request& request, const StoreServer& server,
                             const DaemonFacts& facts);

}  // namespace ddp::daemon
