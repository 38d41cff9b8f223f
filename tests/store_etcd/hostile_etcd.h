// HostileEtcd: a test server in front of one real etcd member that answers
// the way a broken, overloaded or malicious server would, switchable at any
// time. Header-only; plain HTTP/1.1 with Beast's synchronous API, a thread per
// accepted connection.
//
//   ddp::test::EtcdCluster cluster;
//   ddp::test::HostileEtcd proxy(cluster.client_endpoints()[0]);
//   options.endpoints = {proxy.endpoint()};        // "127.0.0.1:<port>"
//   ... EtcdStore store(options); store.set("k", "v");
//   proxy.set_mode(HostileEtcd::Mode::kEndlessBody);
//   ... store.get("k") ...;  EXPECT_GT(proxy.hits(HostileEtcd::Mode::kEndlessBody), 0u);
//
// Modes (what a request gets; "kv paths" are /v3/kv/...):
//   kPass               the real member's answer: a unary request is forwarded
//                       (on a kept-alive connection of its own) and the reply
//                       relayed; a /v3/watch request is forwarded and then the
//                       connection relayed byte for byte both ways until either
//                       side closes. Every path not named below passes too.
//   kUnpaddedBase64     kv/range and kv/txn: etcd's reply (with the real
//                       cluster id) whose values are "aGVsbG8", "hello" in
//                       base64 without its padding (etcd always pads).
//   kHugeContentLength  kv paths: a 200 header with Content-Length 2^62, a few
//                       bytes, then nothing more on a connection kept open.
//   kEndlessBody        kv paths: a chunked 200 reply that starts like a
//                       kv/range reply and then sends base64 'A's forever.
//   kOtherCluster       kv paths and /v3/maintenance/status: a valid reply
//                       whose header names another cluster (and no keys: a
//                       write is never applied to the real member).
//   kStall              a SIGSTOPped member: connections are accepted but no
//                       request is answered, and relayed watch streams stop
//                       relaying (the connection stays open). Switching back
//                       lets the held requests and bytes go on, like SIGCONT.
//   kEndlessWatchLine   /v3/watch: a chunked 200 reply with a "created"
//                       message and then 'x's forever, never a newline.
// An endless reply is cut (its connection closed) after kEndlessCap bytes, so
// that a client with no limit fails the test rather than exhausting the
// machine's memory (and other tests' with it).
//
// hits(mode) counts the requests answered in each mode (kStall: the requests
// held), so a test can check that the hostile path was taken; requests() lists
// every request received (path, Authorization header, body). The destructor
// (or shutdown()) closes the listener and every connection and joins every
// thread, within milliseconds. set_mode() and the accessors are thread-safe;
// shutdown() is for the thread that owns the server.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "ddp/store_etcd/etcd_store.h"

namespace ddp::test {

class HostileEtcd {
 public:
  enum class Mode {
    kPass,
    kUnpaddedBase64,
    kHugeContentLength,
    kEndlessBody,
    kOtherCluster,
    kStall,
    kEndlessWatchLine,
  };
  static constexpr std::size_t kModeCount = 7;
  // Bytes after which an endless reply is cut (see the header comment): 16
  // times the client's default limit on a reply (64 MiB).
  static constexpr std::uint64_t kEndlessCap = std::uint64_t{1} << 30;
  static constexpr const char* kHugeLength = "4611686018427387904";  // 2^62

  // Listens on a free loopback port. Learns the real member's header (cluster
  // id, member id, revision) from its /v3/maintenance/status reply; throws
  // std::runtime_error when the member does not give one within 10 s.
  explicit HostileEtcd(EtcdEndpoint upstream) : upstream_(std::move(upstream)) {
    learn_status();
    tcp::endpoint local(boost::asio::ip::make_address("127.0.0.1"), 0);
    acceptor_.open(local.protocol());
    acceptor_.set_option(boost::asio::socket_base::reuse_address(true));
    acceptor_.bind(local);
    acceptor_.listen(64);
    port_ = acceptor_.local_endpoint().port();
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  ~HostileEtcd() { shutdown(); }
  HostileEtcd(const HostileEtcd&) = delete;
  HostileEtcd& operator=(const HostileEtcd&) = delete;

  EtcdEndpoint endpoint() const { return {"127.0.0.1", port_}; }
  std::uint16_t port() const { return port_; }
  // "127.0.0.1:<port>", as the client names endpoints in its errors.
  std::string where() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::string& cluster_id() const { return cluster_id_; }
  const std::string& other_cluster_id() const { return other_cluster_id_; }

  void set_mode(Mode mode) {
    {
      std::lock_guard lock(mutex_);
      mode_ = mode;
    }
    changed_.notify_all();
  }
  Mode mode() const {
    std::lock_guard lock(mutex_);
    return mode_;
  }
  // Requests answered in `mode` (kPass: forwarded, watches relayed; kStall: held).
  std::uint64_t hits(Mode mode) const { return hits_[static_cast<std::size_t>(mode)].load(); }

  // Every request received, in order (what a client disclosed to this server).
  struct Seen {
    std::string path;
    std::string authorization;  // the Authorization header ("" when none)
    std::string body;
  };
  std::vector<Seen> requests() const {
    std::lock_guard lock(log_mutex_);
    return log_;
  }
  // Watch streams being relayed right now (kPass), for tests that must know a
  // watch reached the real member before they act.
  int relayed_watches() const { return relayed_watches_.load(); }

  // Closes the listener and every connection, wakes every held request and
  // joins every thread. Idempotent; later connections are refused.
  void shutdown() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
    }
    changed_.notify_all();
    // Wakes the blocked accept() (Linux answers it with EINVAL).
    ::shutdown(acceptor_.native_handle(), SHUT_RDWR);
    if (accept_thread_.joinable()) accept_thread_.join();
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mutex_);
      threads.swap(threads_);
    }
    for (auto& thread : threads) thread.join();
    error_code ec;
    acceptor_.close(ec);
  }

 private:
  using Json = nlohmann::json;
  using error_code = boost::system::error_code;
  using tcp = boost::asio::ip::tcp;
  static constexpr std::size_t kChunk = std::size_t{1} << 20;

  // A socket's descriptor registered for shutdown(): unregistered before the
  // socket closes (declare it after the socket), so that shutdown() never
  // touches a descriptor number that was reused meanwhile.
  class Tracked {
   public:
    Tracked(HostileEtcd& server, int fd) : server_(server), fd_(fd) { server_.track(fd_); }
    ~Tracked() { server_.untrack(fd_); }
    Tracked(const Tracked&) = delete;
    Tracked& operator=(const Tracked&) = delete;

   private:
    HostileEtcd& server_;
    int fd_;
  };

  void track(int fd) {
    std::lock_guard lock(mutex_);
    open_fds_.insert(fd);
    if (stopping_) ::shutdown(fd, SHUT_RDWR);  // shut down already: no more traffic
  }
  void untrack(int fd) {
    std::lock_guard lock(mutex_);
    open_fds_.erase(fd);
  }
  bool stopping() const {
    std::lock_guard lock(mutex_);
    return stopping_;
  }
  void count(Mode mode) { ++hits_[static_cast<std::size_t>(mode)]; }

  template <typename Request>
  void log_request(const Request& request) {
    std::lock_guard lock(log_mutex_);
    log_.push_back({std::string(request.target()),
                    std::string(request[boost::beast::http::field::authorization]),
                    request.body()});
  }

  // Blocks while the mode is kStall (counting a held request when `request`);
  // returns the mode then, or std::nullopt when the server is shutting down.
  std::optional<Mode> wait_unless_stalled(bool request) {
    std::unique_lock lock(mutex_);
    if (mode_ == Mode::kStall && !stopping_ && request) count(Mode::kStall);
    changed_.wait(lock, [&] { return mode_ != Mode::kStall || stopping_; });
    if (stopping_) return std::nullopt;
    return mode_;
  }

  // ---------------------------------------------------------------------------
  // Start-up

  // A plain POST to the real member; throws on any failure.
  std::string post_upstream(const std::string& target, const std::string& body) {
    tcp::socket socket(ioc_);
    socket.connect(tcp::endpoint(boost::asio::ip::make_address(upstream_.host), upstream_.port));
    namespace http = boost::beast::http;
    http::request<http::string_body> request{http::verb::post, target, 11};
    request.set(http::field::host, upstream_.host);
    request.set(http::field::content_type, "application/json");
    request.body() = body;
    request.prepare_payload();
    http::write(socket, request);
    boost::beast::flat_buffer buffer;
    http::response<http::string_body> response;
    http::read(socket, buffer, response);
    if (response.result_int() != 200) {
      throw std::runtime_error("HTTP " + std::to_string(response.result_int()) + ": " +
                               response.body());
    }
    return response.body();
  }

  void learn_status() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    std::string last_error;
    for (;;) {
      try {
        status_ = Json::parse(post_upstream("/v3/maintenance/status", "{}"));
        header_ = status_.at("header");
        cluster_id_ = header_.at("cluster_id").get<std::string>();
        break;
      } catch (const std::exception& e) {
        last_error = e.what();
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        throw std::runtime_error("HostileEtcd: no /v3/maintenance/status reply from " +
                                 upstream_.host + ":" + std::to_string(upstream_.port) + ": " +
                                 last_error);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // Any other 64-bit id: flipping bits keeps it a valid, different one.
    other_cluster_id_ = std::to_string(std::stoull(cluster_id_) ^ 0x5a5a5a5a5a5a5a5aULL);
    other_header_ = header_;
    other_header_["cluster_id"] = other_cluster_id_;
  }

  // ---------------------------------------------------------------------------
  // Connections

  void accept_loop() {
    for (;;) {
      tcp::socket socket(ioc_);
      error_code ec;
      acceptor_.accept(socket, ec);
      if (ec) {
        if (stopping()) return;
        // A transient failure (out of descriptors, an aborted handshake):
        // keep listening, a moment later.
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      threads_.emplace_back([this, s = std::move(socket)]() mutable { serve(std::move(s)); });
    }
  }

  void serve(tcp::socket client) {
    namespace http = boost::beast::http;
    Tracked tracked(*this, client.native_handle());
    boost::beast::flat_buffer buffer;
    // The kept-alive connection to the real member for this client's unary requests.
    std::optional<tcp::socket> upstream;
    std::optional<Tracked> upstream_tracked;
    boost::beast::flat_buffer upstream_buffer;
    auto drop_upstream = [&] {
      upstream_tracked.reset();
      upstream.reset();
      upstream_buffer.clear();
    };
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(std::numeric_limits<std::uint64_t>::max());
      error_code ec;
      http::read(client, buffer, parser, ec);
      if (ec) return;
      http::request<http::string_body> request = parser.release();
      const std::string path(request.target());
      log_request(request);
      std::optional<Mode> mode = wait_unless_stalled(true);
      if (!mode) return;
      const bool kv = path.rfind("/v3/kv/", 0) == 0;

      if (path == "/v3/watch") {
        if (*mode == Mode::kEndlessWatchLine) {
          count(Mode::kEndlessWatchLine);
          endless_watch_line(client);
        } else {
          count(Mode::kPass);
          relay_watch(client, buffer, request);
        }
        return;
      }
      if (*mode == Mode::kUnpaddedBase64 && (path == "/v3/kv/range" || path == "/v3/kv/txn")) {
        count(Mode::kUnpaddedBase64);
        if (!write_json(client, request, unpadded_reply(path, request.body()))) return;
        continue;
      }
      if (*mode == Mode::kHugeContentLength && kv) {
        count(Mode::kHugeContentLength);
        huge_content_length(client);
        return;
      }
      if (*mode == Mode::kEndlessBody && kv) {
        count(Mode::kEndlessBody);
        endless_body(client, request.body());
        return;
      }
      if (*mode == Mode::kOtherCluster && (kv || path == "/v3/maintenance/status")) {
        count(Mode::kOtherCluster);
        if (!write_json(client, request, other_cluster_reply(path, request.body()))) return;
        continue;
      }

      // Pass: forward on the kept-alive upstream connection; once more on a
      // new one when a reused connection had been closed before it answered.
      std::optional<http::response<http::string_body>> response;
      for (int tries = 0; tries < 2 && !response; ++tries) {
        const bool reused = upstream.has_value();
        if (!upstream) {
          upstream.emplace(ioc_);
          upstream->connect(
              tcp::endpoint(boost::asio::ip::make_address(upstream_.host), upstream_.port), ec);
          if (ec) return;
          upstream_tracked.emplace(*this, upstream->native_handle());
        }
        http::write(*upstream, request, ec);
        http::response_parser<http::string_body> reply;
        reply.body_limit(std::numeric_limits<std::uint64_t>::max());
        if (!ec) http::read(*upstream, upstream_buffer, reply, ec);
        if (!ec) {
          if (!reply.keep_alive()) drop_upstream();
          response = reply.release();
          break;
        }
        const bool got_some = reply.got_some();
        drop_upstream();
        if (!reused || got_some || stopping()) return;
      }
      if (!response) return;
      count(Mode::kPass);
      http::write(client, *response, ec);
      if (ec || !request.keep_alive()) return;
    }
  }

  // Writes a 200 JSON reply; false when the connection broke.
  bool write_json(tcp::socket& client,
                  const boost::beast::http::request<boost::beast::http::string_body>& request,
                  const Json& body) {
    namespace http = boost::beast::http;
    http::response<http::string_body> response{http::status::ok, 11};
    response.set(http::field::content_type, "application/json");
    response.keep_alive(request.keep_alive());
    response.body() = body.dump();
    response.prepare_payload();
    error_code ec;
    http::write(client, response, ec);
    return !ec && request.keep_alive();
  }

  // send() of all of `data`; false when the connection broke.
  static bool send_all(int fd, const char* data, std::size_t size) {
    while (size > 0) {
      ssize_t sent = ::send(fd, data, size, MSG_NOSIGNAL);
      if (sent < 0 && errno == EINTR) continue;
      if (sent <= 0) return false;
      data += sent;
      size -= static_cast<std::size_t>(sent);
    }
    return true;
  }
  static bool send_all(int fd, const std::string& data) {
    return send_all(fd, data.data(), data.size());
  }

  static std::string chunk(const std::string& data) {
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
    return size + data + "\r\n";
  }

  // Reads and drops whatever the client sends until it closes (or the server
  // shuts the connection down): a connection held open without an answer.
  static void hold(int fd) {
    char scratch[4096];
    for (;;) {
      ssize_t got = ::recv(fd, scratch, sizeof(scratch), 0);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return;
    }
  }

  void huge_content_length(tcp::socket& client) {
    const int fd = client.native_handle();
    const std::string head =
        std::string("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ") +
        kHugeLength + "\r\n\r\n{\"header\":{";
    if (send_all(fd, head)) hold(fd);
  }

  // Sends `first` as a chunk and then chunks of `filler` until the client
  // stops taking them, the cap, or shutdown.
  void endless_chunks(tcp::socket& client, const std::string& first, char filler) {
    const int fd = client.native_handle();
    std::string data =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
        chunk(first);
    if (!send_all(fd, data)) return;
    const std::string more = chunk(std::string(kChunk, filler));
    for (std::uint64_t sent = first.size(); sent < kEndlessCap; sent += kChunk) {
      if (stopping() || !send_all(fd, more)) return;
    }
  }

  void endless_body(tcp::socket& client, const std::string& request_body) {
    Json request = Json::parse(request_body, nullptr, false);
    std::string key = "AA==";
    if (request.is_object() && request.contains("key") && request["key"].is_string()) {
      key = request["key"].get<std::string>();
    }
    endless_chunks(
        client, R"({"header":)" + header_.dump() + R"(,"kvs":[{"key":")" + key + R"(","value":")",
        'A');
  }

  void endless_watch_line(tcp::socket& client) {
    Json created = {{"result", {{"header", header_}, {"created", true}}}};
    endless_chunks(client, created.dump() + "\n", 'x');
  }

  // ---------------------------------------------------------------------------
  // Replies made up here

  Json kv_of(const std::string& key, bool keys_only) const {
    const std::string revision = header_.value("revision", std::string("1"));
    Json kv = {
        {"key", key}, {"create_revision", revision}, {"mod_revision", revision}, {"version", "1"}};
    if (!keys_only) kv["value"] = "aGVsbG8";  // "hello" without its '='
    return kv;
  }

  // A range response (the reply of kv/range or a txn's response_range) with
  // one key, of the real cluster.
  Json unpadded_range(const Json& range, Json header) const {
    Json reply = {{"header", std::move(header)}, {"count", "1"}};
    if (!range.value("count_only", false)) {
      const std::string key = range.contains("key") && range["key"].is_string()
                                  ? range["key"].get<std::string>()
                                  : "AA==";
      reply["kvs"] = Json::array({kv_of(key, range.value("keys_only", false))});
    }
    return reply;
  }

  // The header a txn's inner responses carry (the revision only).
  Json inner_header() const { return {{"revision", header_.value("revision", std::string("1"))}}; }

  Json unpadded_reply(const std::string& path, const std::string& body) const {
    Json request = Json::parse(body, nullptr, false);
    if (!request.is_object()) request = Json::object();
    if (path == "/v3/kv/range") return unpadded_range(request, header_);
    // A txn: its success branch "taken", a response per operation.
    Json responses = Json::array();
    for (const auto& op : request.value("success", Json::array())) {
      if (op.contains("request_range")) {
        responses.push_back(
            {{"response_range", unpadded_range(op["request_range"], inner_header())}});
      } else if (op.contains("request_put")) {
        responses.push_back({{"response_put", {{"header", inner_header()}}}});
      } else if (op.contains("request_delete_range")) {
        responses.push_back(
            {{"response_delete_range", {{"header", inner_header()}, {"deleted", "1"}}}});
      }
    }
    return {{"header", header_}, {"succeeded", true}, {"responses", responses}};
  }

  // What a member of another (empty) cluster answers: nothing found, nothing
  // deleted, writes acknowledged (and never applied to the real member).
  Json other_cluster_reply(const std::string& path, const std::string& body) const {
    if (path == "/v3/maintenance/status") {
      Json status = status_;
      status["header"] = other_header_;
      status["leader"] = other_header_.value("member_id", std::string("1"));
      return status;
    }
    if (path == "/v3/kv/deleterange") return {{"header", other_header_}, {"deleted", "0"}};
    if (path != "/v3/kv/txn") return {{"header", other_header_}};
    Json request = Json::parse(body, nullptr, false);
    if (!request.is_object()) request = Json::object();
    Json responses = Json::array();
    for (const auto& op : request.value("success", Json::array())) {
      if (op.contains("request_range")) {
        responses.push_back({{"response_range", {{"header", inner_header()}}}});
      } else if (op.contains("request_put")) {
        responses.push_back({{"response_put", {{"header", inner_header()}}}});
      } else if (op.contains("request_delete_range")) {
        responses.push_back(
            {{"response_delete_range", {{"header", inner_header()}, {"deleted", "0"}}}});
      }
    }
    return {{"header", other_header_}, {"succeeded", true}, {"responses", responses}};
  }

  // ---------------------------------------------------------------------------
  // Watch relay

  void relay_watch(tcp::socket& client, boost::beast::flat_buffer& buffer,
                   const boost::beast::http::request<boost::beast::http::string_body>& request) {
    tcp::socket upstream(ioc_);
    error_code ec;
    upstream.connect(tcp::endpoint(boost::asio::ip::make_address(upstream_.host), upstream_.port),
                     ec);
    if (ec) return;
    Tracked tracked(*this, upstream.native_handle());
    boost::beast::http::write(upstream, request, ec);
    // Bytes the client sent after its request (the parser read them already).
    if (!ec && buffer.size() > 0) boost::asio::write(upstream, buffer.data(), ec);
    if (ec) return;
    buffer.consume(buffer.size());
    ++relayed_watches_;
    relay(client.native_handle(), upstream.native_handle());
    --relayed_watches_;
  }

  // Copies bytes both ways until either side closes; while the mode is kStall,
  // bytes read are held (not forwarded) until it changes.
  void relay(int client, int upstream) {
    std::vector<char> data(64 * 1024);
    for (;;) {
      pollfd fds[2] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}};
      // A timeout, so that a stall or a shutdown is noticed without traffic.
      int ready = ::poll(fds, 2, 100);
      if (ready < 0 && errno != EINTR) return;
      if (stopping()) return;
      if (ready <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (fds[i].revents == 0) continue;
        ssize_t got = ::recv(fds[i].fd, data.data(), data.size(), 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return;
        if (!wait_unless_stalled(false)) return;
        if (!send_all(fds[1 - i].fd, data.data(), static_cast<std::size_t>(got))) return;
      }
    }
  }

  const EtcdEndpoint upstream_;
  boost::asio::io_context ioc_;  // the sockets' (every operation here is synchronous)
  tcp::acceptor acceptor_{ioc_};
  std::uint16_t port_ = 0;
  Json status_;        // the real member's /v3/maintenance/status reply
  Json header_;        // its header (the real cluster id)
  Json other_header_;  // the same with another cluster id
  std::string cluster_id_;
  std::string other_cluster_id_;

  mutable std::mutex mutex_;  // guards the four below
  Mode mode_ = Mode::kPass;
  bool stopping_ = false;
  std::set<int> open_fds_;
  std::vector<std::thread> threads_;  // one per accepted connection
  std::condition_variable changed_;   // the mode changed, or stopping_
  std::thread accept_thread_;

  std::array<std::atomic<std::uint64_t>, kModeCount> hits_{};
  std::atomic<int> relayed_watches_{0};
  mutable std::mutex log_mutex_;
  std::vector<Seen> log_;  // guarded by log_mutex_
};

}  // namespace ddp::test
