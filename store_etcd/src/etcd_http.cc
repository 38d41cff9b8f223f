#include "etcd_http.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include <boost/asio/ssl.hpp>

#include "ddp/common/logging.h"
#include "ddp/common/text.h"

namespace ddp::etcd {

namespace ssl = boost::asio::ssl;

namespace {

// One attempt of a unary call (connect, authenticate, request, reply) takes at
// most this long; a dead or partitioned member is left after it.
constexpr Duration kMaxAttempt = std::chrono::seconds(15);
constexpr Duration kMinAttempt = std::chrono::seconds(1);
// etcd answers a request once it is applied, within milliseconds when the
// cluster is healthy. A member without a leader holds a request for its own
// timeout (7 s at the default election timeout): a reply that has not started
// after this long (plus a second per MiB sent) is given up on and the
// request is sent to the next endpoint.
constexpr Duration kReplyStart = std::chrono::seconds(3);

Deadline first_byte_deadline(const Deadline& attempt, std::size_t request_bytes) {
  Duration wait = kReplyStart + Duration(1000 * static_cast<std::int64_t>(request_bytes >> 20));
  return Deadline(std::min(wait, attempt.remaining()));
}
// The token expired more often than this within one call: give up.
constexpr int kMaxReauth = 3;
// The constructor's check that the endpoint serves the KV API (and that the
// credentials work): a count of the single key "\0" (base64 "AA==").
constexpr const char* kProbePath = "/v3/kv/range";
const std::string kProbeBody = R"({"count_only":true,"key":"AA=="})";
// A fresh connection's first request: the member's status, which etcd answers
// without a token and whose header names the cluster, so that no credential
// is sent to a member of another cluster. It also says whether the member
// knows a leader.
constexpr const char* kStatusPath = "/v3/maintenance/status";
const std::string kStatusBody = "{}";

}  // namespace

// ---------------------------------------------------------------------------
// Transport

namespace {

std::unique_ptr<ssl::context> make_tls_context(const EtcdStoreOptions& options) {
  auto context = std::make_unique<ssl::context>(ssl::context::tls_client);
  context->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3);
  auto load = [](const char* what, const std::string& file, auto&& fn) {
    try {
      fn();
    } catch (const boost::system::system_error& e) {
      throw InvalidArgument("EtcdStore",
                            fmt::format("cannot load the TLS {} {}: {}", what, file, e.what()));
    }
  };
  if (options.ca_file.empty()) {
    load("default CA paths", "", [&] { context->set_default_verify_paths(); });
  } else {
    load("CA file", options.ca_file, [&] { context->load_verify_file(options.ca_file); });
  }
  if (!options.cert_file.empty()) {
    load("certificate", options.cert_file,
         [&] { context->use_certificate_chain_file(options.cert_file); });
    const std::string& key = options.key_file.empty() ? options.cert_file : options.key_file;
    load("key", key, [&] { context->use_private_key_file(key, ssl::context::pem); });
  }
  context->set_verify_mode(ssl::verify_peer);
  return context;
}

Duration attempt_limit(Duration retry_limit,
                       const std::optional<Clock::time_point>& failing_since) {
  Duration limit = std::clamp(retry_limit, kMinAttempt, kMaxAttempt);
  if (!failing_since) return limit;
  auto spent = std::chrono::duration_cast<Duration>(Clock::now() - *failing_since);
  return std::clamp(retry_limit - spent, Duration(200), limit);
}

}  // namespace

Transport::Transport(EtcdStoreOptions options) : options_(std::move(options)) {
  if (options_.endpoints.empty()) throw InvalidArgument("EtcdStore", "no etcd endpoints given");
  for (const auto& endpoint : options_.endpoints) {
    if (endpoint.host.empty() || endpoint.port == 0) {
      throw InvalidArgument("EtcdStore",
                            fmt::format("bad etcd endpoint '{}'", endpoint_text(endpoint)));
    }
  }
  if (options_.max_reply_bytes < 4096) {
    throw InvalidArgument("EtcdStore", "max_reply_bytes must be at least 4096");
  }
  if (options_.watch_check_interval <= Duration(0)) {
    throw InvalidArgument("EtcdStore", "watch_check_interval must be positive");
  }
  last_reasons_.resize(options_.endpoints.size());
  if (options_.tls) tls_ = make_tls_context(options_);
  if (!options_.tls && !options_.username.empty()) {
    log::get("etcd")->warn(
        "etcd user '{}' authenticates over plain http: its password crosses the "
        "network to {} in clear text (use --rdzv_conf protocol=https)",
        options_.username, endpoints_text());
  }
}

Transport::~Transport() = default;

std::string Transport::endpoints_text() const {
  std::string text;
  for (const auto& endpoint : options_.endpoints) {
    if (!text.empty()) text += ',';
    text += endpoint_text(endpoint);
  }
  return text;
}

EtcdEndpoint Transport::current_endpoint() {
  std::lock_guard lock(state_mutex_);
  return options_.endpoints[current_];
}

std::string Transport::token() {
  std::lock_guard lock(state_mutex_);
  return token_;
}

std::size_t Transport::index_of(const EtcdEndpoint& endpoint) const {
  for (std::size_t i = 0; i < options_.endpoints.size(); ++i) {
    const auto& e = options_.endpoints[i];
    if (e.host == endpoint.host && e.port == endpoint.port) return i;
  }
  return options_.endpoints.size();
}

void Transport::endpoint_failed(const EtcdEndpoint& endpoint, const std::string& reason) {
  const std::size_t i = index_of(endpoint);
  if (i == options_.endpoints.size()) return;
  std::lock_guard lock(state_mutex_);
  last_reasons_[i] = reason;
  if (current_ == i) current_ = (i + 1) % options_.endpoints.size();
}

void Transport::give_up(const std::string& origin, Duration limit) {
  std::string reasons;
  {
    std::lock_guard lock(state_mutex_);
    for (std::size_t i = 0; i < options_.endpoints.size(); ++i) {
      if (!reasons.empty()) reasons += "; ";
      reasons += endpoint_text(options_.endpoints[i]) + ": " +
                 (last_reasons_[i].empty() ? std::string("not tried") : last_reasons_[i]);
    }
  }
  throw NetworkError(origin, fmt::format("no etcd endpoint answered within {} s ({})",
                                         seconds_text(limit), reasons));
}

void Transport::authenticate(Connection& connection, const std::string& origin,
                             const Deadline& deadline) {
  Json body = {{"name", options_.username}, {"password", options_.password}};
  HttpReply reply = connection.post("/v3/auth/authenticate", body.dump(), "",
                                    first_byte_deadline(deadline, 0), deadline);
  Json result;
  try {
    result = decode_reply(origin, connection.where(), "/v3/auth/authenticate", reply);
  } catch (const InvalidArgument& e) {
    const ReplyInfo* info = reply_info(e);
    if (!info || info->etcd_message().find("authentication is not enabled") == std::string::npos)
      throw;
    return;  // the cluster has no authentication: go on without a token
  }
  auto token = result.find("token");
  std::lock_guard lock(state_mutex_);
  token_ = token != result.end() && token->is_string() ? token->get<std::string>() : std::string();
}

Json Transport::check_member(Connection& connection, const std::string& origin,
                             const Deadline& deadline) {
  HttpReply reply =
      connection.post(kStatusPath, kStatusBody, "", first_byte_deadline(deadline, 0), deadline);
  Json status = decode_reply(origin, connection.where(), kStatusPath, reply);
  check_cluster(status, connection.where());
  return status;
}

void Transport::prepare(Connection& connection, const std::string& origin,
                        const Deadline& deadline) {
  connection.open(deadline);
  // The cluster first: no password goes to a member of another cluster.
  check_member(connection, origin, deadline);
  if (!options_.username.empty() && token().empty()) authenticate(connection, origin, deadline);
}

bool Transport::from_this_cluster(const Json& reply) {
  auto header = reply.find("header");
  if (header == reply.end() || !header->is_object()) return true;
  auto field = header->find("cluster_id");
  if (field == header->end() || !field->is_string()) return true;
  const std::string& id = field->get_ref<const std::string&>();
  if (id.empty()) return true;
  std::lock_guard lock(state_mutex_);
  if (cluster_id_.empty()) cluster_id_ = id;
  return id == cluster_id_;
}

void Transport::check_cluster(const Json& reply, const std::string& where) {
  // Not a member of the cluster this client talks to (a misconfigured list,
  // or a port another etcd took over): never mix two clusters' keys.
  if (!from_this_cluster(reply)) throw BadReply(where, "belongs to another etcd cluster");
}

Json Transport::attempt(const std::string& origin, const std::string& path, const std::string& body,
                        const Deadline& deadline) {
  const EtcdEndpoint endpoint = current_endpoint();
  const bool same = unary_ && unary_->endpoint().host == endpoint.host &&
                    unary_->endpoint().port == endpoint.port;
  for (int tries = 0;; ++tries) {
    if (!same || !unary_->is_open() || tries > 0) {
      unary_ = std::make_unique<Connection>(endpoint, tls_.get(), options_.max_reply_bytes);
      prepare(*unary_, origin, deadline);
    } else if (!options_.username.empty() && token().empty()) {
      authenticate(*unary_, origin, deadline);  // its cluster was proven when it opened
    }
    try {
      HttpReply reply =
          unary_->post(path, body, token(), first_byte_deadline(deadline, body.size()), deadline);
      Json result = decode_reply(origin, unary_->where(), path, reply);
      check_cluster(result, unary_->where());
      return result;
    } catch (const ConnectionFailed& e) {
      // A kept-alive connection the server had closed: once more on a new one.
      if (!e.stale() || tries > 0) throw;
    }
  }
}

bool Transport::after_failed_attempt(const std::string& origin, const EtcdEndpoint& endpoint,
                                     Failures& failures, std::unique_ptr<Connection>* used) {
  auto drop = [used] {
    if (used) used->reset();
  };
  try {
    throw;
  } catch (const ConnectionFailed& e) {
    drop();
    endpoint_failed(endpoint, e.reason());
    return false;
  } catch (const BadReply& e) {
    drop();
    endpoint_failed(endpoint, e.reason());
    const std::size_t i = index_of(endpoint);
    if (failures.bad.empty()) failures.bad.resize(options_.endpoints.size(), false);
    if (i < failures.bad.size() && !failures.bad[i]) {
      failures.bad[i] = true;
      ++failures.bad_count;
    }
    if (failures.bad_count < options_.endpoints.size()) return false;
    // Every endpoint answered with something that is not etcd's: waiting
    // will not make them etcd.
    std::string reasons;
    {
      std::lock_guard lock(state_mutex_);
      for (std::size_t j = 0; j < options_.endpoints.size(); ++j) {
        reasons += (j ? "; " : "") + endpoint_text(options_.endpoints[j]) + " " + last_reasons_[j];
      }
    }
    throw ProtocolError(origin, reasons);
  } catch (const TokenExpired&) {
    std::lock_guard state(state_mutex_);
    token_.clear();
    if (++failures.reauths <= kMaxReauth) return true;
    throw AuthError(origin, fmt::format("etcd at {} keeps refusing fresh auth tokens",
                                        endpoint_text(endpoint)));
  } catch (const CertificateError& e) {
    drop();
    throw AuthError(origin, e.what());
  } catch (...) {
    drop();
    throw;
  }
}

Json Transport::call(const std::string& origin, const std::string& path, const Json& body,
                     std::optional<Duration> retry_limit) {
  std::lock_guard lock(unary_mutex_);
  const std::string text = body.dump();
  const Duration limit = retry_limit.value_or(options_.request_timeout);
  std::optional<Clock::time_point> failing_since;
  Backoff backoff(Duration(20), Duration(500));
  Failures failures;
  for (;;) {
    const EtcdEndpoint endpoint = current_endpoint();
    try {
      return attempt(origin, path, text, Deadline(attempt_limit(limit, failing_since)));
    } catch (...) {
      if (after_failed_attempt(origin, endpoint, failures, &unary_)) continue;
    }
    auto now = Clock::now();
    if (!failing_since) failing_since = now;
    auto spent = std::chrono::duration_cast<Duration>(now - *failing_since);
    if (spent >= limit) give_up(origin, limit);
    std::this_thread::sleep_for(std::min(backoff.next(), limit - spent));
  }
}

void Transport::probe() {
  std::lock_guard lock(unary_mutex_);
  const Duration limit = options_.connect_timeout;
  Deadline deadline(limit);
  Backoff backoff(Duration(20), Duration(500));
  Failures failures;
  for (bool first = true;; first = false) {
    const EtcdEndpoint endpoint = current_endpoint();
    // A last attempt cut to a few milliseconds would only replace the reason
    // of the previous failure with a timeout.
    if (!first && deadline.remaining() < Duration(100)) give_up("EtcdStore", limit);
    try {
      attempt("EtcdStore", kProbePath, kProbeBody,
              Deadline(std::min(deadline.remaining(), kMaxAttempt)));
      return;
    } catch (...) {
      if (after_failed_attempt("EtcdStore", endpoint, failures, &unary_)) continue;
    }
    if (deadline.expired()) give_up("EtcdStore", limit);
    std::this_thread::sleep_for(std::min(backoff.next(), deadline.remaining()));
  }
}

std::unique_ptr<Connection> Transport::open_stream(const std::string& origin,
                                                   const std::string& path, const Json& body,
                                                   const Deadline& deadline,
                                                   std::optional<Clock::time_point>& failing_since,
                                                   Interrupt* interrupt, Failures* shared) {
  const std::string text = body.dump();
  const Duration limit = options_.request_timeout;
  Backoff backoff(Duration(20), Duration(500));
  Failures own;
  Failures& failures = shared ? *shared : own;
  for (;;) {
    if (interrupt && interrupt->stopped()) return nullptr;
    const EtcdEndpoint endpoint = current_endpoint();
    auto connection = std::make_unique<Connection>(endpoint, tls_.get(), options_.max_reply_bytes);
    if (interrupt) interrupt->attach(connection.get());
    try {
      Deadline attempt(std::min(deadline.remaining(), attempt_limit(limit, failing_since)));
      prepare(*connection, origin, attempt);
      // etcd answers a watch at once (its "created" message): a member that
      // does not is left like a unary call's.
      const Deadline first_byte = first_byte_deadline(attempt, text.size());
      int status =
          connection->post_stream(path, text, token(), attempt, &first_byte, /*endless=*/true);
      if (status == 200) return connection;
      HttpReply reply{status, connection->stream_rest(attempt)};
      decode_reply(origin, connection->where(), path, reply);
      throw BadReply(connection->where(),
                     fmt::format("answered POST {} with HTTP {}", path, status));
    } catch (...) {
      if (interrupt) interrupt->detach();
      // Stopped meanwhile: the failure is ours (the connection was cancelled),
      // not the endpoint's.
      if (interrupt && interrupt->stopped()) return nullptr;
      if (after_failed_attempt(origin, endpoint, failures, nullptr)) continue;
    }
    auto now = Clock::now();
    if (!failing_since) failing_since = now;
    auto spent = std::chrono::duration_cast<Duration>(now - *failing_since);
    if (spent >= limit) give_up(origin, limit);
    if (deadline.expired()) return nullptr;
    Duration pause = std::min({backoff.next(), limit - spent, deadline.remaining()});
    if (interrupt) {
      if (!interrupt->sleep_for(pause)) return nullptr;
    } else {
      std::this_thread::sleep_for(pause);
    }
  }
}

bool Transport::member_answers(const EtcdEndpoint& endpoint,
                               std::unique_ptr<Connection>& connection, const Deadline& deadline,
                               Interrupt* interrupt) {
  try {
    if (!connection || !connection->is_open()) {
      connection = std::make_unique<Connection>(endpoint, tls_.get(), options_.max_reply_bytes);
      if (interrupt) interrupt->attach(connection.get());
      connection->open(deadline);
    } else if (interrupt) {
      interrupt->attach(connection.get());
    }
    HttpReply reply = connection->post(kStatusPath, kStatusBody, "", deadline, deadline);
    if (interrupt) interrupt->detach();
    Json status = decode_reply("EtcdStore", connection->where(), kStatusPath, reply);
    if (!from_this_cluster(status)) return false;
    // A member cut off from the others has no leader: it will see no new write.
    auto leader = status.find("leader");
    return leader != status.end() && leader->is_string() && *leader != "0";
  } catch (const std::exception&) {
    if (interrupt) interrupt->detach();
    connection.reset();
    return false;
  }
}

void Transport::stream_error(const std::string& origin, const std::string& where,
                             const Json& message) {
  auto [code, text] = error_fields(message);
  ErrorClass cls = classify(code, text);
  if (cls.reauth) {
    std::lock_guard lock(state_mutex_);
    token_.clear();
    return;
  }
  if (cls.retry) return;
  throw_reply_error(origin, where, code, text);
}

}  // namespace ddp::etcd
