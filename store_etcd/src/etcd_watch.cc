#include "etcd_watch.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

namespace ddp::etcd {

namespace {

constexpr const char* kWatchOrigin = "EtcdStore::watch_prefix";
// A prefix watch that hears nothing for this long re-opens its stream (from
// where it was), so that a connection that died silently is not kept forever.
constexpr Duration kIdleReopen = std::chrono::seconds(60);
// Pause after a broken wait stream before the caller reads again.
constexpr Duration kRecheckPause = std::chrono::milliseconds(20);

Json parse_message(const std::string& origin, const std::string& where, const std::string& line) {
  Json message = Json::parse(line, nullptr, false);
  if (message.is_discarded() || !message.is_object()) {
    throw ProtocolError(origin, fmt::format("{} sent a watch message that is not JSON", where));
  }
  return message;
}

const Json& result_of(const Json& message) {
  auto it = message.find("result");
  return it != message.end() ? *it : message;
}

}  // namespace

WaitResult wait_for_put(Transport& transport, const std::string& origin, const std::string& key,
                        std::int64_t from_revision, const Deadline& deadline) {
  Json create = {{"key", base64_encode(key)}, {"start_revision", std::to_string(from_revision)}};
  std::optional<Clock::time_point> failing_since;
  auto connection = transport.open_stream(origin, "/v3/watch", {{"create_request", create}},
                                          deadline, failing_since, nullptr);
  if (!connection) return WaitResult::kTimeout;
  for (;;) {
    std::optional<std::string> line;
    try {
      line = connection->next_line(deadline);
    } catch (const ConnectionFailed& e) {
      transport.endpoint_failed(connection->endpoint(), e.reason());
      std::this_thread::sleep_for(std::min(kRecheckPause, deadline.remaining()));
      return WaitResult::kRecheck;
    }
    if (!line) return WaitResult::kTimeout;
    Json message = parse_message(origin, connection->where(), *line);
    if (message.contains("error")) {
      transport.stream_error(origin, connection->where(), message);
      return WaitResult::kRecheck;
    }
    const Json& result = result_of(message);
    if (!transport.from_this_cluster(result)) {
      transport.endpoint_failed(connection->endpoint(), "it belongs to another etcd cluster");
      return WaitResult::kRecheck;
    }
    if (result.value("canceled", false)) {
      std::this_thread::sleep_for(std::min(kRecheckPause, deadline.remaining()));
      return WaitResult::kRecheck;
    }
    auto events = result.find("events");
    if (events == result.end() || !events->is_array()) continue;
    for (const auto& event : *events) {
      if (event.value("type", std::string("PUT")) != "DELETE") return WaitResult::kPut;
    }
  }
}

namespace {

// The thread of one prefix watch. Delivers whole watch messages, so the
// events of one revision (a txn) are never split across a reconnection.
class EtcdWatch final : public StoreWatch {
 public:
  EtcdWatch(std::shared_ptr<Transport> transport, std::string key, std::string range_end,
            std::size_t strip, std::int64_t from_revision,
            std::function<void(const StoreEvent&)> on_event,
            std::function<void(const std::string&)> on_error)
      : transport_(std::move(transport)),
        key_(std::move(key)),
        range_end_(std::move(range_end)),
        strip_(strip),
        next_(from_revision),
        on_event_(std::move(on_event)),
        on_error_(std::move(on_error)) {
    thread_ = std::thread([this] { run(); });
  }

  ~EtcdWatch() override {
    interrupt_.stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    try {
      loop();
    } catch (const std::exception& e) {
      fail(e.what());
    }
  }

  void fail(const std::string& reason) {
    if (!interrupt_.stopped() && on_error_) on_error_(reason);
  }

  void loop() {
    std::optional<Clock::time_point> failing_since;
    while (!interrupt_.stopped()) {
      Json create = {{"key", base64_encode(key_)}, {"range_end", base64_encode(range_end_)}};
      if (next_ > 0) create["start_revision"] = std::to_string(next_);
      auto connection = transport_->open_stream(kWatchOrigin, "/v3/watch", {{"create_request", create}},
                                                Deadline::never(), failing_since, &interrupt_);
      if (!connection) return;  // stopped
      bool reopen = false;
      try {
        reopen = read(*connection, failing_since);
      } catch (...) {
        interrupt_.detach();  // before the connection goes
        throw;
      }
      interrupt_.detach();
      if (!reopen) return;
    }
  }

  // Reads messages until the stream breaks (true: open it again) or the
  // watch ends (false).
  bool read(Connection& connection, std::optional<Clock::time_point>& failing_since) {
    for (;;) {
      std::optional<std::string> line;
      try {
        line = connection.next_line(Deadline(kIdleReopen));
      } catch (const ConnectionFailed& e) {
        if (interrupt_.stopped()) return false;
        transport_->endpoint_failed(connection.endpoint(), e.reason());
        if (!failing_since) failing_since = Clock::now();
        return true;
      }
      if (interrupt_.stopped()) return false;
      if (!line) return true;
      Json message = parse_message(kWatchOrigin, connection.where(), *line);
      if (message.contains("error")) {
        transport_->stream_error(kWatchOrigin, connection.where(), message);
        if (!failing_since) failing_since = Clock::now();
        return true;
      }
      if (!transport_->from_this_cluster(result_of(message))) {
        transport_->endpoint_failed(connection.endpoint(), "it belongs to another etcd cluster");
        if (!failing_since) failing_since = Clock::now();
        return true;
      }
      if (!handle(result_of(message), failing_since)) return false;
    }
  }

  // One message; false when the watch ends.
  bool handle(const Json& result, std::optional<Clock::time_point>& failing_since) {
    if (result.value("created", false)) {
      failing_since.reset();
      if (next_ <= 0 && result.contains("header")) next_ = json_int(result["header"], "revision") + 1;
    }
    if (result.value("canceled", false)) {
      std::int64_t compacted = json_int(result, "compact_revision");
      fail(compacted > 0
               ? fmt::format("the revisions from {} on were compacted (etcd keeps them from {} on)",
                             next_, compacted)
               : "etcd cancelled the watch: " +
                     result.value("cancel_reason", std::string("no reason given")));
      return false;
    }
    auto events = result.find("events");
    if (events == result.end() || !events->is_array()) return true;
    const std::int64_t first = next_;
    std::int64_t last = 0;
    for (const auto& item : *events) {
      const Json& kv = item.at("kv");
      StoreEvent event;
      event.kind = item.value("type", std::string("PUT")) == "DELETE" ? StoreEvent::Kind::kDelete
                                                                     : StoreEvent::Kind::kPut;
      event.revision = json_int(kv, "mod_revision");
      if (event.revision < first) continue;  // delivered before a reconnection
      std::string key = json_bytes(kv, "key");
      event.key = key.size() >= strip_ ? key.substr(strip_) : key;
      if (event.kind == StoreEvent::Kind::kPut) event.value = json_bytes(kv, "value");
      if (interrupt_.stopped()) return false;
      on_event_(event);
      last = std::max(last, event.revision);
    }
    if (last > 0) next_ = last + 1;
    return true;
  }

  std::shared_ptr<Transport> transport_;
  const std::string key_;
  const std::string range_end_;
  const std::size_t strip_;
  std::int64_t next_;  // the first revision not delivered yet (0: from now)
  std::function<void(const StoreEvent&)> on_event_;
  std::function<void(const std::string&)> on_error_;
  Interrupt interrupt_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<StoreWatch> start_watch(std::shared_ptr<Transport> transport, std::string key,
                                        std::string range_end, std::size_t strip,
                                        std::int64_t from_revision,
                                        std::function<void(const StoreEvent&)> on_event,
                                        std::function<void(const std::string&)> on_error) {
  return std::make_unique<EtcdWatch>(std::move(transport), std::move(key), std::move(range_end),
                                     strip, from_revision, std::move(on_event), std::move(on_error));
}

}  // namespace ddp::etcd
