#include "server_state.h"

#include <fmt/format.h>

#include <exception>

#include "response_text.h"

namespace ddp::status_http {

namespace {

// Client-caused log lines: at most this many per window.
constexpr int kClientLogBurst = 20;
constexpr auto kClientLogWindow = std::chrono::seconds(10);

std::optional<TokenCheck> token_check_for(const ServerOptions& options) {
  if (options.token.empty() || is_loopback(options.host)) return std::nullopt;
  return TokenCheck(options.token);
}

}  // namespace

Server::Counters AtomicCounters::load() const {
  Server::Counters out;
  out.requests = requests.load(std::memory_order_relaxed);
  out.rejected_unauthorized = rejected_unauthorized.load(std::memory_order_relaxed);
  out.rejected_bad_request = rejected_bad_request.load(std::memory_order_relaxed);
  out.evicted_idle = evicted_idle.load(std::memory_order_relaxed);
  out.evicted_busy = evicted_busy.load(std::memory_order_relaxed);
  out.timed_out = timed_out.load(std::memory_order_relaxed);
  out.stalled = stalled.load(std::memory_order_relaxed);
  return out;
}

ServerState::ServerState(ServerOptions options, Handler handler)
    : options_(std::move(options)), handler_(std::move(handler)),
      token_check_(token_check_for(options_)), logger_(spdlog::default_logger()),
      client_log_budget_(kClientLogBurst, kClientLogWindow) {}

Response ServerState::answer(const Request& request) {
  std::string failure;
  try {
    Response response = handler_(request);
    failure = problem_with(response);
    if (failure.empty()) return response;
    failure = "the handler's response to " + request.method + " " + request.path +
              " cannot be sent: " + failure;
  } catch (const std::exception& e) {
    failure = "the handler failed on " + request.method + " " + request.path + ": " + e.what();
  } catch (...) {
    failure = "the handler failed on " + request.method + " " + request.path +
              " with an exception that is not a std::exception";
  }
  log_client_event(spdlog::level::warn, failure);
  return error_response(500, "internal error");
}

void ServerState::log_client_event(spdlog::level::level_enum level, std::string_view message) {
  if (!logger_ || !logger_->should_log(level)) return;
  try {
    if (!client_log_budget_.take(LogBudget::Clock::now())) return;
    const std::uint64_t left_out = client_log_budget_.take_left_out();
    if (left_out == 0) {
      logger_->log(level, "{} server: {}", options_.name, message);
    } else {
      logger_->log(level, "{} server: {} ({} similar line(s) left out before this one)",
                   options_.name, message, left_out);
    }
  } catch (...) {
    // Logging must not take the server down (a full disk, a broken sink).
  }
}

void ServerState::log_server_event(spdlog::level::level_enum level, std::string_view message) {
  if (!logger_) return;
  try {
    logger_->log(level, "{} server: {}", options_.name, message);
  } catch (...) {
    // As above.
  }
}

}  // namespace ddp::status_http
