#include "status_routes.h"

#include <ctime>
#include <nlohmann/json.hpp>

#include "ddp/common/error.h"
#include "ddp/status_http/metrics_text.h"
#include "ddp/status_http/page.h"
#include "ddp/status_http/process_metrics.h"

namespace ddp::daemon {

namespace {

using status_http::Request;
using status_http::Response;

Response json_response(int status, const nlohmann::json& doc) {
  Response r;
  r.status = status;
  r.content_type = "application/json";
  r.body = doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  return r;
}

Response health(bool ok, const std::string& reason) {
  return json_response(ok ? 200 : 503,
                       nlohmann::json{{"health", ok ? "true" : "false"}, {"reason", reason}});
}

std::string iso_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

double uptime_s(const DaemonFacts& facts) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - facts.started).count();
}

void write_metrics(const StoreServerStats& s, const StoreServer& server,
                   status_http::MetricsText& out) {
  const auto& o = server.options();
  out.family("ddprun_store_clients", "gauge", "Open client connections");
  out.sample("ddprun_store_clients", static_cast<double>(s.clients));
  out.family("ddprun_store_max_clients", "gauge", "Connections beyond this many are refused");
  out.sample("ddprun_store_max_clients", static_cast<double>(o.max_clients));
  out.family("ddprun_store_connections_total", "counter", "Connections accepted");
  out.sample("ddprun_store_connections_total", static_cast<double>(s.connections_total));
  out.family("ddprun_store_refused_connections_total", "counter",
             "Connections closed at once because max_clients were open");
  out.sample("ddprun_store_refused_connections_total", static_cast<double>(s.refused_total));
  out.family("ddprun_store_failed_handshakes_total", "counter",
             "Connections closed before their hello and authentication completed");
  out.sample("ddprun_store_failed_handshakes_total", static_cast<double>(s.failed_handshakes));
  out.family("ddprun_store_accept_failures_total", "counter",
             "Attempts to accept a connection that failed (out of file descriptors and the like)");
  out.sample("ddprun_store_accept_failures_total", static_cast<double>(s.accept_failures));
  out.family("ddprun_store_keys", "gauge", "Keys the store holds");
  out.sample("ddprun_store_keys", static_cast<double>(s.keys));
  out.family("ddprun_store_stored_bytes", "gauge",
             "Bytes of keys and values held (plus 64 per key), counted against the limit");
  out.sample("ddprun_store_stored_bytes", static_cast<double>(s.stored_bytes));
  out.family("ddprun_store_max_stored_bytes", "gauge", "The limit on stored bytes");
  out.sample("ddprun_store_max_stored_bytes", static_cast<double>(o.max_store_bytes));
  out.family("ddprun_store_parked_requests", "gauge",
             "get and wait requests blocked on a missing key");
  out.sample("ddprun_store_parked_requests", static_cast<double>(s.parked_requests));
  out.family("ddprun_store_operations_total", "counter", "Requests served, by operation");
  for (const auto& [op, count] : s.operations) {
    out.sample("ddprun_store_operations_total", {{"op", op}}, static_cast<double>(count));
  }
}

}  // namespace

Response answer(const Request& request, const StoreServer& server, const DaemonFacts& facts) {
  if (request.path == "/") return status_http::status_page_response();
  const bool known = request.path == "/metrics" || request.path == "/status" ||
                     request.path == "/livez" || request.path == "/readyz";
  if (!known) {
    return json_response(404,
                         {{"error", "not found: try /, /status, /metrics, /livez or /readyz"}});
  }
  StoreServerStats stats;
  try {
    stats = server.stats(kStatsWait);
  } catch (const std::exception& e) {
    if (request.path == "/livez" || request.path == "/readyz") return health(false, e.what());
    return json_response(503, {{"error", e.what()}});
  }
  if (request.path == "/livez") return health(true, "");
  if (request.path == "/readyz") {
    if (stats.clients >= server.options().max_clients) {
      return health(false, "the store has its maximum of " +
                               std::to_string(server.options().max_clients) + " clients");
    }
    return health(true, "");
  }
  if (request.path == "/metrics") {
    status_http::MetricsText text;
    write_metrics(stats, server, text);
    status_http::write_process_metrics(text);
    return status_http::metrics_response(text);
  }
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [op, count] : stats.operations) ops[op] = count;
  return json_response(200, {{"kind", "daemon"},
                             {"time", iso_now()},
                             {"uptime_s", uptime_s(facts)},
                             {"address", facts.address},
                             {"state", "serving"},
                             {"ready", stats.clients < server.options().max_clients},
                             {"auth", facts.auth},
                             {"clients", stats.clients},
                             {"max_clients", server.options().max_clients},
                             {"connections_total", stats.connections_total},
                             {"keys", stats.keys},
                             {"stored_bytes", stats.stored_bytes},
                             {"max_store_bytes", server.options().max_store_bytes},
                             {"parked_requests", stats.parked_requests},
                             {"operations", ops}});
}

}  // namespace ddp::daemon
