// What a Server's connections share: the options, the handler, the token
// check, the registry of open connections, the counters and the logging.
//
// Ownership: owned by the Server, outlives every connection (a connection
// holds a reference). Blocking: none. Thread-safety: the server's thread only,
// but the counters and registry.size(), which any thread may read. Errors:
// answer() throws nothing; the log functions throw nothing.
#pragma once

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "connection_registry.h"
#include "ddp/status_http/server.h"
#include "log_budget.h"
#include "token_check.h"

namespace ddp::status_http {

struct AtomicCounters {
  std::atomic<std::uint64_t> requests{0};
  std::atomic<std::uint64_t> rejected_unauthorized{0};
  std::atomic<std::uint64_t> rejected_bad_request{0};
  std::atomic<std::uint64_t> evicted_idle{0};
  std::atomic<std::uint64_t> evicted_busy{0};
  std::atomic<std::uint64_t> timed_out{0};
  std::atomic<std::uint64_t> stalled{0};

  Server::Counters load() const;
};

// Adds one to a counter (relaxed: the counters order nothing).
inline void count(std::atomic<std::uint64_t>& counter) {
  counter.fetch_add(1, std::memory_order_relaxed);
}

class ServerState {
 public:
  ServerState(ServerOptions options, Handler handler);

  const ServerOptions& options() const { return options_; }
  // Set iff a token is required (server.h's rule).
  const std::optional<TokenCheck>& token_check() const { return token_check_; }
  ConnectionRegistry& registry() { return registry_; }
  const ConnectionRegistry& registry() const { return registry_; }
  AtomicCounters& counters() { return counters_; }
  const AtomicCounters& counters() const { return counters_; }

  // The handler's response to `request`; a 500 when the handler throws or
  // returns a response that cannot be sent (logged, within the budget).
  Response answer(const Request& request);

  // A line about something a client caused, at `level`, within the budget.
  void log_client_event(spdlog::level::level_enum level, std::string_view message);
  // A line about the server itself (accept failures and the like).
  void log_server_event(spdlog::level::level_enum level, std::string_view message);

 private:
  ServerOptions options_;
  Handler handler_;
  std::optional<TokenCheck> token_check_;
  ConnectionRegistry registry_;
  AtomicCounters counters_;
  std::shared_ptr<spdlog::logger> logger_;
  LogBudget client_log_budget_;
};

}  // namespace ddp::status_http
