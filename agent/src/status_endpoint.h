// The agent's live view (--status_port): /metrics (Prometheus text), /livez
// and /readyz (etcd's convention), /status (JSON) and / (the page), served
// from a JobBoard by a status_http::Server on a thread of its own.
//
// Ownership: borrows the board, which must outlive the endpoint. Blocking:
// the constructor binds (never waits for a client); the destructor stops the
// server and joins its thread. Thread-safety: answer() may run on any thread;
// the board is read under its lock. Errors: the constructor throws
// NetworkError naming the address when it cannot listen.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ddp/agent/worker_spec.h"
#include "ddp/status_http/server.h"
#include "job_status.h"

namespace ddp::agent {

// How long the agent's thread may leave the board unwritten, outside the
// rendezvous, before /livez says it is stuck. Stopping workers takes up to
// the stop grace, so it is added.
Millis stuck_after(const AgentOptions& options);

// One request, answered from the board (no socket: tested alone).
status_http::Response answer(const status_http::Request& request, const JobBoard& board,
                             Millis stuck_after);

class StatusEndpoint {
 public:
  // Listens on options.host:options.port (0 picks a port); `token` is asked
  // of clients when the host is not loopback (status_http::Server's rule).
  StatusEndpoint(const StatusOptions& options, std::string token, const JobBoard& board,
                 Millis stuck_after);
  ~StatusEndpoint();
  StatusEndpoint(const StatusEndpoint&) = delete;
  StatusEndpoint& operator=(const StatusEndpoint&) = delete;

  std::uint16_t port() const { return server_->port(); }
  bool token_required() const { return server_->token_required(); }
  // "http://<host>:<port>/", with brackets around an IPv6 address.
  std::string url() const;

 private:
  std::string host_;
  std::unique_ptr<status_http::Server> server_;
};

}  // namespace ddp::agent
