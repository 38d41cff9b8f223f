// libFuzzer target: what a stranger can send a live view (status_http).
//
// The first byte picks what the rest feeds:
//   0..191   a real Server on loopback (started once), over a new connection:
//            the bytes are sent in pieces cut where the input says, the write
//            side is closed, and whatever comes back is read until the server
//            closes; every 64th input then checks that a plain GET is still
//            answered 200 (the server neither crashed nor stopped serving).
//            The server requires a token (it is bound to 0.0.0.0), so the
//            token check sees every request.
//   192..223 the token check alone: bearer_credentials, query_parameter and
//            TokenCheck::accepts on the input split in two.
//   224..255 MetricsText: the input as a help text and label values (names
//            are the caller's, values and help are escaped, never trusted).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "ddp/common/error.h"
#include "ddp/status_http/metrics_text.h"
#include "ddp/status_http/server.h"
#include "token_check.h"

namespace {

using ddp::status_http::Request;
using ddp::status_http::Response;

constexpr const char* kToken = "fuzz-token";

ddp::status_http::Server& server() {
  static std::unique_ptr<ddp::status_http::Server> s = [] {
    ddp::status_http::ServerOptions options;
    options.host = "0.0.0.0";
    options.token = kToken;
    options.idle_timeout = std::chrono::milliseconds(500);
    auto made = std::make_unique<ddp::status_http::Server>(options, [](const Request& request) {
      Response r;
      r.body = request.path == "/" ? std::string("ok\n") : std::string(request.target);
      if (request.path == "/404") r.status = 404;
      return r;
    });
    made->start();
    return made;
  }();
  return *s;
}

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "http_request_fuzz: %s\n", why.c_str());
  std::abort();
}

int connect_to(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) std::abort();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc;
  do {
    rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) fail(std::string("cannot connect to the server: ") + std::strerror(errno));
  return fd;
}

// Reads until the server closes; false when it stays open past `ms`.
// libFuzzer's SIGALRM (its -timeout watchdog) interrupts the waits: EINTR is
// retried with the time left.
bool drain(int fd, int ms, std::string* out = nullptr) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  char buffer[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;
    if (out) out->append(buffer, static_cast<std::size_t>(n));
  }
}

void send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the server closed first (an error reply): fine
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

void over_a_connection(std::string_view input) {
  static int count = 0;
  const int fd = connect_to(server().port());
  // Byte 0 of the rest: how many pieces (1..8) the input is sent in.
  const std::size_t pieces = input.empty() ? 1 : 1 + static_cast<unsigned char>(input[0]) % 8;
  if (!input.empty()) input.remove_prefix(1);
  const std::size_t step = input.size() / pieces + 1;
  while (!input.empty()) {
    send_all(fd, input.substr(0, step));
    input.remove_prefix(std::min(step, input.size()));
  }
  ::shutdown(fd, SHUT_WR);
  // The server answers what came whole and closes at the end of the input
  // (or after its idle timeout, 0.5 s): never later.
  if (!drain(fd, 5000)) {
    const auto c = server().counters();
    fail("the server kept a connection open 5 s after its input ended (open " +
         std::to_string(server().connections()) + ", requests " + std::to_string(c.requests) +
         ", timed out " + std::to_string(c.timed_out) + ", bad " +
         std::to_string(c.rejected_bad_request) + ", 401 " +
         std::to_string(c.rejected_unauthorized) + ")");
  }
  ::close(fd);
  if (++count % 64 != 0) return;
  const int probe = connect_to(server().port());
  send_all(probe, "GET /?token=fuzz-token HTTP/1.1\r\nHost: f\r\nConnection: close\r\n\r\n");
  std::string reply;
  if (!drain(probe, 5000, &reply) || reply.rfind("HTTP/1.1 200", 0) != 0) {
    fail("a plain GET was not answered 200: '" + reply.substr(0, 200) + "'");
  }
  ::close(probe);
}

void token_check(std::string_view input) {
  const std::size_t cut = input.empty() ? 0 : static_cast<unsigned char>(input[0]) % input.size();
  const std::string_view authorization = input.substr(0, cut);
  const std::string_view query = input.substr(cut);
  ddp::status_http::bearer_credentials(authorization);
  ddp::status_http::query_parameter(query, "token");
  static const ddp::status_http::TokenCheck check(kToken);
  const bool accepted = check.accepts(authorization, query);
  // Accepted only when one of the two carries the token.
  const auto bearer = ddp::status_http::bearer_credentials(authorization);
  const auto param = ddp::status_http::query_parameter(query, "token");
  const bool carries = (bearer && *bearer == kToken) || (param && *param == kToken);
  if (accepted != carries) std::abort();
}

void metrics_text(std::string_view input) {
  ddp::status_http::MetricsText text;
  const std::string value(input);
  try {
    text.family("fuzz_total", "counter", value.empty() ? "help" : value);
  } catch (const ddp::Error&) {
    return;  // an empty help is refused
  }
  text.sample("fuzz_total", {{"a", value}, {"b", value + "\n\"\\"}}, 1);
  // One sample line: escaping left no raw newline inside the labels.
  const std::string& out = text.text();
  const auto sample = out.find("\nfuzz_total{");
  if (sample == std::string::npos) std::abort();
  if (out.find('\n', sample + 1) != out.size() - 1) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const unsigned char mode = data[0];
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (mode < 192) {
    over_a_connection(input);
  } else if (mode < 224) {
    token_check(input);
  } else {
    metrics_text(input);
  }
  return 0;
}
