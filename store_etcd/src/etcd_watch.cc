#include "etcd_watch.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>
#include <vector>

namespace ddp::etcd {

namespace {

constexpr const char* kWatchOrigin = "EtcdStore::watch_prefix";
// Pause after a broken wait stream before the caller reads again.
constexpr Duration kRecheckPause = std::chrono::milliseconds(20);
constexpr const char* kSilentMember = "stopped answering while a watch waited on it";

const Json& result_of(const Json& message) {
  auto it = message.find("result");
  return it != message.end() && it->is_object() ? *it : message;
}

// The events of a watch message's result, each with an object "kv"; throws
// BadReply naming `where` for events that are not etcd's.
std::vector<const Json*> events_of(const Json& result, const std::string& where) {
  std::vector<const Json*> events;
  auto it = result.find("events");
  if (it == result.end() || it->is_null()) return events;
  if (!it->is_array()) throw BadReply(where, "sent watch events that are not a list");
  for (const auto& event : *it) {
    auto kv = event.find("kv");
    if (!event.is_object() || kv == event.end() || !kv->is_object()) {
      throw BadReply(where, "sent a watch event without its key");
    }
    events.push_back(&event);
  }
  return events;
}

bool is_delete(const Json& event) { return json_string(event, "type", "PUT") == "DELETE"; }

}  // namespace

WaitResult wait_for_put(Transport& transport, const std::string& origin, const std::string& key,
                        std::int64_t from_revision, const Deadline& deadline,
                        Transport::Failures& failures) {
  Json create = {{"key", base64_encode(key)}, {"start_revision", std::to_string(from_revision)}};
  std::optional<Clock::time_point> failing_since;
  auto connection = transport.open_stream(origin, "/v3/watch", {{"create_request", create}},
                                          deadline, failing_since, nullptr, &failures);
  if (!connection) return WaitResult::kTimeout;
  const Duration check_every = transport.options().watch_check_interval;
  std::unique_ptr<Connection> check;  // asks the stream's member whether it still answers
  auto recheck = [&](const std::string& reason) {
    transport.endpoint_failed(connection->endpoint(), reason);
    std::this_thread::sleep_for(std::min(kRecheckPause, deadline.remaining()));
    return WaitResult::kRecheck;
  };
  // In a catch block for a BadReply: counted, and ProtocolError once every
  // endpoint sent one.
  auto bad_stream = [&] {
    transport.after_failed_attempt(origin, connection->endpoint(), failures, nullptr);
    std::this_thread::sleep_for(std::min(kRecheckPause, deadline.remaining()));
    return WaitResult::kRecheck;
  };
  for (;;) {
    std::optional<std::string> line;
    try {
      line = connection->next_line(Deadline(std::min(deadline.remaining(), check_every)));
    } catch (const ConnectionFailed& e) {
      return recheck(e.reason());
    } catch (const BadReply&) {
      return bad_stream();
    }
    if (!line) {
      if (deadline.expired()) return WaitResult::kTimeout;
      // Silent: a quiet key, or a member that froze or lost the cluster with
      // the connection still open. Only a check tells them apart.
      if (deadline.remaining() < check_every ||
          transport.member_answers(connection->endpoint(), check, Deadline(check_every), nullptr)) {
        continue;
      }
      return recheck(kSilentMember);
    }
    Json message;
    std::vector<const Json*> events;
    try {
      message = decode_stream_message(connection->where(), *line);
      if (message.contains("error")) {
        transport.stream_error(origin, connection->where(), message);
        return WaitResult::kRecheck;
      }
      events = events_of(result_of(message), connection->where());
    } catch (const BadReply&) {
      return bad_stream();
    }
    const Json& result = result_of(message);
    if (!transport.from_this_cluster(result)) {
      transport.endpoint_failed(connection->endpoint(), "it belongs to another etcd cluster");
      return WaitResult::kRecheck;
    }
    if (json_flag(result, "canceled")) {
      std::this_thread::sleep_for(std::min(kRecheckPause, deadline.remaining()));
      return WaitResult::kRecheck;
    }
    for (const Json* event : events) {
      if (!is_delete(*event)) return WaitResult::kPut;
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
      : transport_(std::move(transport)), key_(std::move(key)), range_end_(std::move(range_end)),
        strip_(strip), next_(from_revision), on_event_(std::move(on_event)),
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
    std::unique_ptr<Connection> check;  // asks a silent stream's member whether it still answers
    while (!interrupt_.stopped()) {
      Json create = {{"key", base64_encode(key_)}, {"range_end", base64_encode(range_end_)}};
      if (next_ > 0) create["start_revision"] = std::to_string(next_);
      auto connection =
          transport_->open_stream(kWatchOrigin, "/v3/watch", {{"create_request", create}},
                                  Deadline::never(), failing_since, &interrupt_);
      if (!connection) return;  // stopped
      bool reopen = false;
      try {
        reopen = read(*connection, check, failing_since);
      } catch (...) {
        interrupt_.detach();  // before the connection goes
        throw;
      }
      interrupt_.detach();
      if (!reopen) return;
    }
  }

  // Reads messages until the stream breaks or its member stops answering
  // (true: open it again, on the next endpoint, from next_) or the watch
  // ends (false).
  bool read(Connection& connection, std::unique_ptr<Connection>& check,
            std::optional<Clock::time_point>& failing_since) {
    const Duration check_every = transport_->options().watch_check_interval;
    auto reopen = [&](const std::string& reason) {
      transport_->endpoint_failed(connection.endpoint(), reason);
      if (!failing_since) failing_since = Clock::now();
      return true;
    };
    for (;;) {
      std::optional<std::string> line;
      try {
        line = connection.next_line(Deadline(check_every));
      } catch (const ConnectionFailed& e) {
        if (interrupt_.stopped()) return false;
        return reopen(e.reason());
      } catch (const BadReply& e) {
        if (interrupt_.stopped()) return false;
        return reopen(e.reason());
      }
      if (interrupt_.stopped()) return false;
      if (!line) {
        const bool answers = transport_->member_answers(connection.endpoint(), check,
                                                        Deadline(check_every), &interrupt_);
        interrupt_.attach(&connection);  // stop() must reach the stream again
        if (interrupt_.stopped()) return false;
        if (answers) continue;
        return reopen(kSilentMember);
      }
      Json message;
      std::vector<const Json*> events;
      try {
        message = decode_stream_message(connection.where(), *line);
        if (message.contains("error")) {
          transport_->stream_error(kWatchOrigin, connection.where(), message);
          if (!failing_since) failing_since = Clock::now();
          return true;
        }
        events = events_of(result_of(message), connection.where());
      } catch (const BadReply& e) {
        return reopen(e.reason());
      }
      if (!transport_->from_this_cluster(result_of(message))) {
        return reopen("it belongs to another etcd cluster");
      }
      if (!handle(result_of(message), events, failing_since)) return false;
    }
  }

  // One message; false when the watch ends.
  bool handle(const Json& result, const std::vector<const Json*>& events,
              std::optional<Clock::time_point>& failing_since) {
    if (json_flag(result, "created")) {
      failing_since.reset();
      auto header = result.find("header");
      if (next_ <= 0 && header != result.end()) next_ = json_int(*header, "revision") + 1;
    }
    if (json_flag(result, "canceled")) {
      std::int64_t compacted = json_int(result, "compact_revision");
      fail(compacted > 0
               ? fmt::format("the revisions from {} on were compacted (etcd keeps them from {} on)",
                             next_, compacted)
               : "etcd cancelled the watch: " +
                     json_string(result, "cancel_reason", "no reason given"));
      return false;
    }
    const std::int64_t first = next_;
    std::int64_t last = 0;
    for (const Json* item : events) {
      const Json& kv = item->at("kv");
      StoreEvent event;
      event.kind = is_delete(*item) ? StoreEvent::Kind::kDelete : StoreEvent::Kind::kPut;
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
                                     strip, from_revision, std::move(on_event),
                                     std::move(on_error));
}

}  // namespace ddp::etcd
