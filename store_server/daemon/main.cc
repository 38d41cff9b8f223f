// ddp-rendezvous: serves the rendezvous store (StoreServer) until SIGTERM/SIGINT.
//
// The first line on stdout is the port it listens on (useful with --port 0);
// logs go to stderr. With --status-port it also serves its live view over
// HTTP (status_routes.h) and logs where; beyond loopback only with a token, or
// with --status-allow-no-token (and a warning). Exit codes: 0 after a signal,
// 1 when it cannot serve (the port is taken), 2 for bad flags (a live view
// beyond loopback without a token among them) or an unusable token file.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
// clang-format off
#include <utility>
#include <boost/asio.hpp>
// clang-format on

#include "ddp/common/error.h"
#include "ddp/common/logging.h"
#include "ddp/status_http/server.h"
#include "ddp/store_server/store_server.h"
#include "status_routes.h"

namespace {

constexpr const char* kName = "ddp-rendezvous";

// The token file's content without trailing line breaks. Throws InvalidArgument
// naming the file when it cannot be read or holds no token.
std::string read_token(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ddp::InvalidArgument("",
                               "cannot read token file '" + path + "': " + std::strerror(errno));
  }
  std::ostringstream content;
  content << in.rdbuf();
  if (in.bad()) throw ddp::InvalidArgument("", "cannot read token file '" + path + "'");
  std::string token = content.str();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.empty()) throw ddp::InvalidArgument("", "token file '" + path + "' is empty");
  return token;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ddp-rendezvous: the ddprun rendezvous store as a standalone server.\n"
      "Prints the port it listens on as the first line on stdout, then serves until\n"
      "SIGTERM or SIGINT (pending waits then fail with a shutdown error; exit code 0).",
      kName};
  ddp::StoreServerOptions options;
  options.host = "0.0.0.0";  // a daemon serves the other nodes of the job
  options.port = 29400;
  std::string token_file;
  double idle_timeout_s = 1800;
  std::uint64_t max_store_mib = options.max_store_bytes >> 20;
  int status_port = -1;
  std::string status_host = "127.0.0.1";
  bool status_allow_no_token = false;
  app.add_option("--host", options.host,
                 "Address to listen on (0.0.0.0: every IPv4 interface, :: for IPv6, "
                 "127.0.0.1: this machine only)")
      ->capture_default_str();
  app.add_option("--port", options.port, "TCP port; 0 picks a free one (printed first on stdout)")
      ->capture_default_str();
  app.add_option("--token-file", token_file,
                 "File holding the shared secret clients must prove (HMAC-SHA256 challenge); "
                 "trailing newlines are ignored. Without it, no authentication");
  app.add_option("--max-clients", options.max_clients,
                 "Connections beyond this many get an error reply and are closed")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-store-mib", max_store_mib,
                 "MiB of keys and values (plus 64 bytes per key) the store may hold; writes past "
                 "it get a 'store full' error")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  app.add_option("--idle-timeout", idle_timeout_s,
                 "Seconds a connection may stay silent (a client blocked in get/wait is not "
                 "idle); 0 disables")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e9));
  app.add_option("--status-port", status_port,
                 "Serve the live view over HTTP on this port: /metrics (Prometheus), /livez, "
                 "/readyz, /status (JSON) and / (a page); 0 picks a free port (logged). "
                 "Default: off")
      ->check(CLI::Range(0, 65535));
  app.add_option("--status-host", status_host,
                 "Address the live view listens on; beyond loopback, requests must carry the "
                 "token of --token-file (Authorization: Bearer), and without --token-file an "
                 "address beyond loopback is refused unless --status-allow-no-token is given")
      ->capture_default_str();
  app.add_flag("--status-allow-no-token", status_allow_no_token,
               "Serve the live view beyond loopback (--status-host) without a token: anyone who "
               "can reach the port reads the store's address and figures (logged as a warning)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << kName << ": " << e.what() << " (see --help)\n";
    return 2;
  }

  if (status_port >= 0 && token_file.empty() && !status_allow_no_token &&
      !ddp::status_http::is_loopback(status_host)) {
    std::cerr << kName << ": --status-host " << status_host
              << ": the live view would be served beyond loopback without a token; give "
                 "--token-file (clients must then carry the token), listen on 127.0.0.1, or "
                 "pass --status-allow-no-token to serve it to anyone who can reach the port\n";
    return 2;
  }
  try {
    if (!token_file.empty()) options.token = read_token(token_file);
    options.idle_timeout =
        std::chrono::milliseconds(static_cast<std::int64_t>(idle_timeout_s * 1000));
    options.max_store_bytes = max_store_mib << 20;
  } catch (const ddp::Error& e) {
    std::cerr << kName << ": " << e.what() << "\n";
    return 2;
  }

  try {
    auto logger = ddp::log::init("store", spdlog::level::info);
    // Signals are caught by their own io_context on this thread; the server runs
    // on its own thread and is stopped from here.
    boost::asio::io_context signals_io;
    boost::asio::signal_set signals(signals_io, SIGTERM, SIGINT);
    ddp::StoreServer server(options);
    std::cout << server.port() << std::endl;  // first line, flushed
    server.start();
    logger->info("{} listening on {}:{} (auth {}, max {} clients, max {} MiB stored)", kName,
                 options.host, server.port(), options.token.empty() ? "off" : "on",
                 server.options().max_clients, max_store_mib);
    std::unique_ptr<ddp::status_http::Server> status;
    if (status_port >= 0) {
      ddp::daemon::DaemonFacts facts{options.host + ":" + std::to_string(server.port()),
                                     !options.token.empty(), std::chrono::steady_clock::now()};
      ddp::status_http::ServerOptions http;
      http.host = status_host;
      http.port = static_cast<std::uint16_t>(status_port);
      http.token = options.token;
      http.name = "ddp-rendezvous status";
      status = std::make_unique<ddp::status_http::Server>(
          http, [&server, facts](const ddp::status_http::Request& request) {
            return ddp::daemon::answer(request, server, facts);
          });
      status->start();
      if (!status->token_required() && !ddp::status_http::is_loopback(status_host)) {
        logger->warn(
            "{}: the live view listens on {} beyond loopback without a token "
            "(--status-allow-no-token): anyone who can reach its port reads it; give "
            "--token-file to require one",
            kName, status_host);
      }
      const bool v6 = status_host.find(':') != std::string::npos;
      logger->info("{}: live view at http://{}:{}/ (/metrics, /status, /livez, /readyz){}", kName,
                   v6 ? "[" + status_host + "]" : status_host, status->port(),
                   status->token_required() ? "; clients must carry the token" : "");
    }
    int received = 0;
    signals.async_wait([&](const boost::system::error_code& ec, int signal) {
      if (!ec) received = signal;
    });
    signals_io.run();
    logger->info("{}: signal {} received; shutting down ({} clients connected)", kName, received,
                 server.num_clients());
    if (status) status->stop();
    server.stop();
    return 0;
  } catch (const ddp::Error& e) {
    std::cerr << kName << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << kName << ": " << e.what() << "\n";
    return 1;
  }
}
