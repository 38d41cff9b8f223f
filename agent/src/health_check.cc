#include "health_check.h"

#include <csignal>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

namespace ddp::agent {
namespace {

void set_var(std::vector<std::string>& env, const std::string& name, const std::string& value) {
  const std::string key = name + "=";
  std::erase_if(env, [&key](const std::string& var) { return var.starts_with(key); });
  env.push_back(key + value);
}

std::string optional_text(const std::optional<int>& value) {
  return value ? std::to_string(*value) : std::string();
}

std::string one_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = '|';
  }
  return text;
}

}  // namespace

std::vector<std::string> health_check_env(const std::vector<std::string>& base,
                                          const HealthCheckFacts& facts) {
  std::vector<std::string> env = base;
  set_var(env, "DDP_HEALTH_CHECK_NODE_RANK", optional_text(facts.node_rank));
  set_var(env, "DDP_HEALTH_CHECK_ATTEMPT", std::to_string(facts.attempt));
  set_var(env, "DDP_HEALTH_CHECK_LAST_ROUND", optional_text(facts.last_round));
  set_var(env, "LOCAL_WORLD_SIZE", std::to_string(facts.local_world_size));
  set_var(env, "TORCHELASTIC_RUN_ID", facts.run_id);
  return env;
}

std::string describe_failure(const std::string& command, const HealthCheckResult& result,
                             std::chrono::milliseconds timeout) {
  std::string how;
  if (result.kind == HealthCheckResult::Kind::kTimedOut) {
    how = fmt::format("timed out after {} ms (its process group was killed)", timeout.count());
  } else if (result.status < 0) {
    how = fmt::format("was killed by signal {}", -result.status);
  } else {
    how = fmt::format("exited with status {}", result.status);
  }
  const std::string output = one_line(result.output);
  return fmt::format("health check `{}` {}; its output: {}", command, how,
                     output.empty() ? "(none)" : output);
}

std::string read_tail(const std::string& path, std::size_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const auto size = static_cast<std::size_t>(in.tellg());
  const std::size_t start = size > max_bytes ? size - max_bytes : 0;
  in.seekg(static_cast<std::streamoff>(start));
  std::string text(size - start, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  return text;
}

HealthCheckBackoff::HealthCheckBackoff(std::chrono::milliseconds initial,
                                       std::chrono::milliseconds max)
    : next_(initial), max_(max) {}

std::chrono::milliseconds HealthCheckBackoff::next() {
  const auto delay = std::min(next_, max_);
  next_ = std::min(next_ * 2, max_);
  return delay;
}

HealthGate::HealthGate(const HealthCheckOptions& options, WorkerEventLoop& loop,
                       const Runtime& runtime, AgentEvents& events,
                       std::function<void(const LoopEvent&)> other_exit)
    : options_(options), loop_(loop), runtime_(runtime), events_(events),
      other_exit_(std::move(other_exit)) {}

std::optional<int> HealthGate::pass(const std::vector<std::string>& base_env,
                                    HealthCheckFacts facts,
                                    std::chrono::milliseconds give_up_after) {
  const Clock::time_point first_try = runtime_.now();
  HealthCheckBackoff backoff(options_.backoff_initial, options_.backoff_max);
  for (facts.attempt = 1;; ++facts.attempt) {
    const HealthCheckResult result = run_once(health_check_env(base_env, facts));
    if (result.kind == HealthCheckResult::Kind::kPassed) {
      events_.health_check("");
      if (facts.attempt > 1) {
        events_.notice(fmt::format("the health check passed on try {}; joining", facts.attempt));
      }
      return std::nullopt;
    }
    if (result.kind == HealthCheckResult::Kind::kInterrupted) return 128 + result.signo;
    const std::string why = describe_failure(options_.command, result, options_.timeout);
    events_.health_check(why);
    const auto delay = backoff.next();
    if (runtime_.now() + delay - first_try > give_up_after) {
      events_.notice(fmt::format(
          "error: the health check failed {} times; the next try would come after the "
          "rendezvous' join timeout ({} ms since the first try): not joining, giving up. Last: {}",
          facts.attempt, give_up_after.count(), why));
      return 1;
    }
    events_.notice(fmt::format("try {}: {}; not joining; trying again in {} ms", facts.attempt, why,
                               delay.count()));
    if (auto signo = wait_until(runtime_.now() + delay)) return 128 + *signo;
  }
}

HealthCheckResult HealthGate::run_once(const std::vector<std::string>& env) {
  ProcessSpec spec;
  // stderr joins stdout, so that the output file holds both in order.
  spec.argv = {"/bin/sh", "-c", "exec 2>&1\n" + options_.command};
  spec.env = env;
  spec.prefix = "[health_check]:";
  spec.out.file = options_.output_file;
  spec.out.console = false;
  spec.err.console = false;
  if (!options_.output_file.empty()) {
    std::error_code ignored;  // launch() says what is wrong with the folder
    std::filesystem::create_directories(std::filesystem::path(options_.output_file).parent_path(),
                                        ignored);
  }
  const int pid = loop_.launch(spec);
  const Clock::time_point deadline = runtime_.now() + options_.timeout;
  HealthCheckResult result;
  for (;;) {
    const LoopEvent event = loop_.next_event(deadline);
    if (event.kind == LoopEvent::Kind::kExited && event.pid == pid) {
      result.status = event.status;
      result.kind =
          event.status == 0 ? HealthCheckResult::Kind::kPassed : HealthCheckResult::Kind::kFailed;
      break;
    }
    if (event.kind == LoopEvent::Kind::kExited) {
      if (other_exit_) other_exit_(event);
    } else if (event.kind == LoopEvent::Kind::kSignal) {
      kill_and_reap(pid);
      result.kind = HealthCheckResult::Kind::kInterrupted;
      result.signo = event.signo;
      return result;
    } else if (event.kind == LoopEvent::Kind::kTimeout && runtime_.now() >= deadline) {
      kill_and_reap(pid);
      result.kind = HealthCheckResult::Kind::kTimedOut;
      break;
    }
  }
  if (!options_.output_file.empty()) {
    result.output = read_tail(options_.output_file, HealthCheckResult::kOutputTail);
  }
  return result;
}

std::optional<int> HealthGate::wait_until(Clock::time_point deadline) {
  for (;;) {
    const LoopEvent event = loop_.next_event(deadline);
    if (event.kind == LoopEvent::Kind::kSignal) return event.signo;
    if (event.kind == LoopEvent::Kind::kExited && other_exit_) other_exit_(event);
    if (event.kind == LoopEvent::Kind::kTimeout && runtime_.now() >= deadline) return std::nullopt;
  }
}

void HealthGate::kill_and_reap(int pid) {
  loop_.signal_group(pid, SIGKILL);
  for (;;) {
    const LoopEvent event = loop_.next_event(Clock::time_point::max());
    if (event.kind == LoopEvent::Kind::kExited && event.pid == pid) return;
    if (event.kind == LoopEvent::Kind::kExited && other_exit_) other_exit_(event);
  }
}

}  // namespace ddp::agent
