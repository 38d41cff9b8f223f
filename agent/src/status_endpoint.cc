#include "status_endpoint.h"

#include <chrono>
#include <string_view>

#include "ddp/status_http/metrics_text.h"
#include "ddp/status_http/page.h"
#include "ddp/status_http/process_metrics.h"

namespace ddp::agent {

namespace {

using status_http::Request;
using status_http::Response;

Response health_response(const Health& health) {
  Response r;
  r.status = health.ok ? 200 : 503;
  r.content_type = "application/json";
  r.body = health.json() + "\n";
  return r;
}

}  // namespace

Millis stuck_after(const AgentOptions& options) {
  return std::chrono::seconds(60) + options.stop_grace;
}

Response answer(const Request& request, const JobBoard& board, Millis stuck_after) {
  const Runtime& runtime = board.runtime();
  if (request.path == "/metrics") {
    status_http::MetricsText text;
    write_job_metrics(board.snapshot(), text);
    status_http::write_process_metrics(text);
    return status_http::metrics_response(text);
  }
  if (request.path == "/livez") {
    return health_response(liveness(board.snapshot(), runtime.now(), stuck_after));
  }
  if (request.path == "/readyz") return health_response(readiness(board.snapshot()));
  if (request.path == "/status") {
    Response r;
    r.content_type = "application/json";
    r.body = status_json(board.snapshot(), runtime.now(),
                         std::chrono::system_clock::to_time_t(runtime.wall_now())) +
             "\n";
    return r;
  }
  if (request.path == "/") return status_http::status_page_response();
  Response r;
  r.status = 404;
  r.content_type = "application/json";
  r.body = R"({"error":"not found: try /, /status, /metrics, /livez or /readyz"})"
           "\n";
  return r;
}

StatusEndpoint::StatusEndpoint(const StatusOptions& options, std::string token,
                               const JobBoard& board, Millis stuck)
    : host_(options.host) {
  status_http::ServerOptions server;
  server.host = options.host;
  server.port = options.port.value_or(0);
  server.token = std::move(token);
  server.name = "ddprun status";
  const JobBoard* b = &board;
  server_ = std::make_unique<status_http::Server>(
      server, [b, stuck](const Request& request) { return answer(request, *b, stuck); });
  server_->start();
}

StatusEndpoint::~StatusEndpoint() { server_->stop(); }

std::string StatusEndpoint::url() const {
  const bool v6 = host_.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(port()) + "/";
}

}  // namespace ddp::agent
